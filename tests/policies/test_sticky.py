"""Session stickiness: conversations stay on their model unless the policy escalates."""

from __future__ import annotations

import tracemalloc

import pytest

from policies import RequestContext, StickySessions
from policies.sticky import SessionStoreUnavailable, session_key
from tests.policies.helpers import build
from tests.policies.signals import request

STICKY = """
name: auto
policy: rules
rules:
  - {name: code, when: {signal: domain, op: eq, value: code}, action: {route: coder}}
cost_quality: {strong: big, weak: small, threshold: 0.5}
sticky: {ttl: 600, escalate: %s}
"""


class Clock:
    """A controllable time source for TTL tests."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_conversation_stays_on_its_model() -> None:
    policy, _ = build(STICKY % "true")
    first = await policy.decide(request("Plan my trip [d=0.8]", system="You are helpful."))
    assert first.candidates == ("big",) and first.details["sticky"] == "pinned"
    # Later turns repeat the prefix (system prompt + first user message): same session.
    follow = await policy.decide(
        request("Plan my trip [d=0.8]", "Sure ...", "thanks, now shorter [d=0.1]", system="You are helpful.")
    )
    assert follow.candidates == ("big",) and follow.details["sticky"] == "kept"
    assert "session stays on big" in follow.reason
    # Another conversation decides on its own.
    other = await policy.decide(request("What's 2+2?", system="You are helpful."))
    assert other.candidates == ("small",)


async def test_escalation_moves_a_session_to_a_stronger_model() -> None:
    policy, _ = build(STICKY % "true")
    sid = "s-1"
    assert (await policy.decide(request("hi [d=0.1]", session_id=sid))).candidates == ("small",)
    escalated = await policy.decide(request("now a hard proof [d=0.9]", session_id=sid))
    assert escalated.candidates == ("big",) and escalated.details["sticky"] == "escalated"
    # Once escalated the session stays strong even for easy turns.
    easy = await policy.decide(request("ok thanks [d=0.1]", session_id=sid))
    assert easy.candidates == ("big",) and easy.details["sticky"] == "kept"


async def test_without_escalation_the_session_never_moves() -> None:
    policy, _ = build(STICKY % "false")
    sid = "s-2"
    assert (await policy.decide(request("hi [d=0.1]", session_id=sid))).candidates == ("small",)
    plan = await policy.decide(request("hard [d=0.9]", session_id=sid))
    assert plan.candidates == ("small",) and plan.details["sticky"] == "kept"


async def test_session_header_is_read_from_headers_too() -> None:
    policy, _ = build(STICKY % "false")
    headers = {"X-Pointsman-Session-Id": "abc"}
    await policy.decide(request("first [d=0.9]", headers=headers))
    plan = await policy.decide(request("completely different [d=0.1]", headers=headers))
    assert plan.candidates == ("big",)


async def test_rule_routes_are_not_overridden_by_stickiness() -> None:
    policy, _ = build(STICKY % "false")
    sid = "s-3"
    await policy.decide(request("hi [d=0.1]", session_id=sid))
    assert (await policy.decide(request("write python", session_id=sid))).candidates == ("coder",)
    assert (await policy.decide(request("and now? [d=0.9]", session_id=sid))).candidates == ("small",)


async def test_sessions_expire_after_ttl() -> None:
    clock = Clock()
    policy, _ = build(STICKY % "false", clock=clock)
    sid = "s-4"
    await policy.decide(request("hard [d=0.9]", session_id=sid))
    clock.now += 599
    assert (await policy.decide(request("easy [d=0.1]", session_id=sid))).candidates == ("big",)  # renews the TTL
    clock.now += 599
    assert (await policy.decide(request("easy [d=0.1]", session_id=sid))).candidates == ("big",)
    clock.now += 601
    plan = await policy.decide(request("easy [d=0.1]", session_id=sid))
    assert plan.candidates == ("small",) and plan.details["sticky"] == "pinned"


def test_least_recently_used_session_is_evicted() -> None:
    clock = Clock()
    sessions = StickySessions(ttl=60, max_sessions=2, clock=clock)
    sessions.put("a", "m1")
    sessions.put("b", "m2")
    assert sessions.get("a") == "m1"  # a is now the most recently used
    sessions.put("c", "m3")
    assert sessions.get("b") is None and sessions.get("a") == "m1" and sessions.get("c") == "m3"
    assert len(sessions) == 2


def test_session_keys_are_scoped_by_route_and_tenant() -> None:
    base = request("hello", system="sys")
    key, source = session_key(base)
    assert source == "prefix"
    other_tenant = RequestContext(request_id="r", endpoint=base.endpoint, route="auto", body=base.body, tenant="t2")
    other_route = RequestContext(request_id="r", endpoint=base.endpoint, route="auto2", body=base.body)
    assert session_key(other_tenant)[0] != key and session_key(other_route)[0] != key
    assert session_key(request("hello", system="another"))[0] != key
    assert session_key(request("hello", "reply", "more", system="sys"))[0] == key
    assert session_key(request("x", session_id="s"))[1] == "header"


async def test_multi_model_session_moves_when_its_model_becomes_ineligible() -> None:
    policy, _ = build("""
name: auto
policy: rules
multi_model: {lambda: 100, candidates: [tiny, small], quality_signal: quality}
sticky: {escalate: false}
""")
    sid = "s-5"
    assert (await policy.decide(request("hi [q tiny=0.5 small=0.6]", session_id=sid))).candidates == ("tiny",)
    plan = await policy.decide(request("hi [q tiny=0.5 small=0.6]", tools=True, session_id=sid))
    assert plan.candidates == ("small",) and plan.details["sticky"] == "repinned"


class _MovesFail(StickySessions):
    """A session store that pins new sessions but cannot move one (the write after a decision fails)."""

    async def pin(self, key: str, model: str) -> None:
        raise SessionStoreUnavailable("write refused")


async def test_an_escalation_the_store_cannot_keep_is_decided_and_recorded_as_not_kept() -> None:
    policy, _ = build(STICKY % "true")
    policy.use_session_store(_MovesFail(ttl=60, max_sessions=10))
    assert (await policy.decide(request("hi [d=0.1]", session_id="s-6"))).candidates == ("small",)
    plan = await policy.decide(request("hard proof [d=0.9]", session_id="s-6"))
    assert plan.candidates == ("big",) and plan.details["sticky"] == "escalated"
    assert "pin not kept" in plan.reason
    # The move was not stored: the next easy turn finds the session still on its first model.
    easy = await policy.decide(request("ok [d=0.1]", session_id="s-6"))
    assert easy.candidates == ("small",) and easy.details["sticky"] == "kept"


def test_only_sticky_routes_take_a_session_store() -> None:
    policy, _ = build(STICKY.replace("sticky: {ttl: 600, escalate: %s}", "sticky: {enabled: false}"))
    with pytest.raises(ValueError, match="no session stickiness"):
        policy.use_session_store(StickySessions(ttl=60, max_sessions=10))


async def test_huge_session_ids_are_not_kept_whole() -> None:
    """A session id is whatever a client sends: 100 kB ids must not be held for max_sessions sessions."""
    sessions = StickySessions(ttl=60, max_sessions=100_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            await sessions.claim(f"auto\x00tenant\x00id\x00{i}-" + "x" * 100_000, "small")  # 20 MB of ids
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(sessions) == 200
    assert kept < 1_000_000
    assert await sessions.lookup("auto\x00tenant\x00id\x007-" + "x" * 100_000) == "small"
    assert await sessions.lookup("auto\x00tenant\x00id\x007-" + "x" * 99_999) is None
