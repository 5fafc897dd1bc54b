"""Implicit feedback through the real gateway: re-asks, regenerations, cut answers, upstream errors.

Rows are read from the gateway's SQLite store (``source = 'implicit'``). A negative ("no row") is
checked after a later row of the same gateway has landed: feedback is written in order, so what
was not there by then was never recorded.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.implicit import ImplicitSignals, fingerprint
from store import DecisionRecorder, NullDecisionStore
from store.records import DecisionRecord
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually
from tests.store_rows import feedback_rows

MODELS = [("m-ok", "ok"), ("m-len", "length"), ("m-500", "always-500"), ("m-reset", "reset-midstream")]


@pytest.fixture(scope="module")
def gw(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [{
            "name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
            "timeouts": {"connect": 1, "first_byte": 5, "total": 10, "idle": 2},
            "models": [{"name": name, "upstream_name": wire} for name, wire in MODELS],
        }],
        "retry": {"attempts": 2, "backoff_base": 0.01, "backoff_max": 0.02},
        "routes": [
            {"name": "auto", "model": "m-ok"},
            {"name": "short", "model": "m-ok", "implicit": {"window": 0.5}},
            {"name": "quiet", "model": "m-ok", "implicit": {"enabled": False}},
        ],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("implicit")).start(timeout=60)
    yield proc
    proc.terminate()


@pytest.fixture
def sdk(gw: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def chat(sdk: OpenAI, messages: list[dict[str, Any]], *, model: str = "auto", session: str | None = None,
         **kwargs: Any) -> str:
    """Send a chat request (consuming a stream if asked); the request id."""
    headers = {"x-pointsman-session-id": session} if session else {}
    sent: Any = messages
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=sent, extra_headers=headers, **kwargs)
    parsed = raw.parse()
    if kwargs.get("stream"):
        try:
            for _ in parsed:
                pass
        except openai.APIError:
            pass  # a stream that fails midway still has its request id
    return str(raw.headers["x-pointsman-request-id"])


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def implicit(gw: GatewayProcess, request_id: str) -> dict[str, dict[str, Any]]:
    """The request's implicit feedback rows, by metric."""
    return {row["metric"]: row for row in feedback_rows(gw.db_path, request_id, "implicit")}


def _has(gw: GatewayProcess, request_id: str, metric: str) -> bool:
    return metric in implicit(gw, request_id)


def barrier(sdk: OpenAI, gw: GatewayProcess) -> None:
    """Record a row now and wait for it: every row recorded before it has landed too."""
    rid = chat(sdk, user("cut short"), model="m-len")
    eventually(lambda: "finish_length" in implicit(gw, rid), "barrier row", timeout=10)


def test_a_similar_question_in_the_same_session_is_a_reask(sdk: OpenAI, gw: GatewayProcess) -> None:
    session = uuid.uuid4().hex
    first = chat(sdk, user("How do I sort a list of tuples in Python by the second item?"), session=session)
    again = chat(sdk, user("how do i sort a list of tuples in python by the second item??"), session=session)
    eventually(lambda: "reask" in implicit(gw, first), "reask row", timeout=10)
    row = implicit(gw, first)["reask"]
    assert row["score"] == 0.0 and row["model"] == ""
    assert row["metadata"]["by"] == again and row["metadata"]["similarity"] >= 0.8
    # Not re-asks of `again`: another question in the same session; the same question in another session.
    chat(sdk, user("What is the boiling point of water at altitude?"), session=session)
    chat(sdk, user("How do I sort a list of tuples in Python by the second item?"), session=uuid.uuid4().hex)
    barrier(sdk, gw)
    assert implicit(gw, again) == {}
    assert set(implicit(gw, first)) == {"reask"}


def test_the_same_conversation_sent_again_is_a_regeneration(sdk: OpenAI, gw: GatewayProcess) -> None:
    topic = uuid.uuid4().hex
    conversation = [
        {"role": "system", "content": f"You are terse. {topic}"},
        {"role": "user", "content": "Name three rivers."},
        {"role": "assistant", "content": "Nile, Amazon, Danube."},
        {"role": "user", "content": "Which is longest?"},
    ]
    first = chat(sdk, conversation)  # no session header: the conversation's prefix is its session
    second = chat(sdk, conversation)
    eventually(lambda: "regenerate" in implicit(gw, first), "regenerate row", timeout=10)
    assert implicit(gw, first)["regenerate"]["metadata"]["by"] == second
    assert "reask" not in implicit(gw, first)
    third = chat(sdk, conversation)
    eventually(lambda: "regenerate" in implicit(gw, second), "second regeneration", timeout=10)
    assert implicit(gw, second)["regenerate"]["metadata"]["by"] == third


def test_a_first_turn_regenerates_only_for_the_same_end_user(sdk: OpenAI, gw: GatewayProcess) -> None:
    # One API key, many end users: the same opening question from two of them (or an eval run twice)
    # is no regeneration; OpenAI's `user` field, or a session id, says when it is the same person.
    messages = user(f"What is the capital of Australia? {uuid.uuid4().hex}")
    anonymous = [chat(sdk, messages) for _ in range(3)]
    strangers = [chat(sdk, messages, user=f"end-user-{i}") for i in range(2)]
    same = [chat(sdk, messages, user="end-user-9") for _ in range(2)]
    eventually(lambda: "regenerate" in implicit(gw, same[0]), "the same end user's regeneration", timeout=10)
    assert implicit(gw, same[0])["regenerate"]["metadata"]["by"] == same[1]
    # The anonymous first answer is still remembered: a re-ask in the next turn judges it.
    question = f"How do I reverse a linked list in place {uuid.uuid4().hex}?"
    opened = chat(sdk, user(question))
    follow = chat(sdk, [*user(question), {"role": "assistant", "content": "Use recursion."},
                        *user(question.lower() + " iteratively")])
    eventually(lambda: "reask" in implicit(gw, opened), "re-ask of an anonymous first turn", timeout=10)
    assert implicit(gw, opened)["reask"]["metadata"]["by"] == follow
    barrier(sdk, gw)
    assert all(implicit(gw, rid) == {} for rid in [*anonymous, *strangers, same[1]])


def test_outside_the_window_or_on_a_quiet_route_nothing_is_recorded(sdk: OpenAI, gw: GatewayProcess) -> None:
    messages = user(f"Summarise this ticket {uuid.uuid4().hex}")
    old = chat(sdk, messages, model="short", user="u1")
    time.sleep(0.8)  # past the route's 0.5 s window
    late = chat(sdk, messages, model="short", user="u1")
    soon = chat(sdk, messages, model="short", user="u1")
    eventually(lambda: "regenerate" in implicit(gw, late), "regeneration within the window", timeout=10)
    assert implicit(gw, late)["regenerate"]["metadata"]["by"] == soon
    repeat = user(f"Same words again {uuid.uuid4().hex}")
    quiet = [chat(sdk, repeat, model="quiet", user="u2") for _ in range(2)]  # implicit: {enabled: false}
    barrier(sdk, gw)
    assert implicit(gw, old) == {}
    assert all(implicit(gw, rid) == {} for rid in quiet)


def test_answers_cut_at_the_token_limit_are_recorded(sdk: OpenAI, gw: GatewayProcess) -> None:
    plain = chat(sdk, user("Write a long essay."), model="m-len")
    streamed = chat(sdk, user("Write a long essay, streamed."), model="m-len", stream=True)
    complete = chat(sdk, user("Write a short line."), model="m-ok", stream=True)
    legacy = httpx.post(f"{gw.base_url}/completions", json={"model": "m-ok", "prompt": "Once upon"})
    assert legacy.status_code == 200 and legacy.json()["choices"][0]["finish_reason"] == "length"
    legacy_id = legacy.headers["x-pointsman-request-id"]
    for rid in (plain, streamed, legacy_id):
        eventually(functools.partial(_has, gw, rid, "finish_length"), f"finish_length row for {rid}", timeout=10)
        assert implicit(gw, rid)["finish_length"]["score"] == 0.0
    assert implicit(gw, complete) == {}
    metrics = httpx.get(f"{gw.url}/metrics").text
    name = "pointsman_implicit_feedback_finish_length_total "
    counted = [line for line in metrics.splitlines() if line.startswith(name)]
    assert counted and float(counted[0].split()[1]) >= 3


def test_upstream_errors_are_recorded_but_refusals_are_not(sdk: OpenAI, gw: GatewayProcess) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        chat(sdk, user("Anything"), model="m-500")
    failed = info.value.response.headers["x-pointsman-request-id"]
    broken = chat(sdk, user("Stream something"), model="m-reset", stream=True)
    with pytest.raises(openai.NotFoundError) as refused:
        chat(sdk, user("Anything"), model="no-such-model")
    unknown = refused.value.response.headers["x-pointsman-request-id"]
    for rid in (failed, broken):
        eventually(functools.partial(_has, gw, rid, "upstream_error"), f"upstream_error row for {rid}", timeout=10)
    assert implicit(gw, failed)["upstream_error"]["metadata"]["status"] == 502
    barrier(sdk, gw)
    assert implicit(gw, unknown) == {}


def test_prompt_text_never_reaches_the_log(gw: GatewayProcess) -> None:
    assert "sort a list of tuples" not in gw.log() and "Name three rivers" not in gw.log()


def _record(request_id: str, created_at: float) -> DecisionRecord:
    return DecisionRecord(request_id=request_id, created_at=created_at, endpoint="chat.completions", route=None,
                          requested_model="m", status=200)


def test_memory_is_bounded_by_sessions_and_time_and_holds_no_text() -> None:
    now = [1000.0]
    recorder = DecisionRecorder(NullDecisionStore())
    signals = ImplicitSignals(recorder, max_sessions=3, per_session=2, clock=lambda: now[0])
    secret = "my secret question about the quarterly numbers"
    for i in range(10):
        body = {"messages": [{"role": "user", "content": f"{secret} {i}"}]}
        signals.finished(_record(f"r{i}", now[0]), fingerprint(body, None, f"s{i}"))
    assert len(signals) == 3  # least recently used sessions evicted
    print_ = fingerprint({"messages": [{"role": "user", "content": secret}]}, None, "s9")
    assert print_ is not None
    assert secret not in repr(print_) and secret not in repr(signals._sessions)  # digests only
    now[0] += 301.0  # past the longest window (the default 300 s)
    signals.finished(_record("late", now[0]), fingerprint({"messages": [{"role": "user", "content": "x y z"}]},
                                                         None, "fresh"))
    assert len(signals) == 1  # the expired sessions went with the next answer
