"""Experiments through a real gateway process: arms assigned by key, marked in the response, the decision
record, ``/v1/route`` and ``/metrics``; shadow arms that decide without serving (and call a backend
only when configured to, within their budget); paused and not-yet-started experiments; adaptive
allocation's sticky, stored assignments with their propensities."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from policies.experiments.assign import ArmTable, assignment_key
from tests.experiments.conftest import (
    CHEAP_CALL,
    MESSAGES,
    backend,
    key,
    metric,
    rows,
    shadow_script,
    start,
    upstream_calls,
)
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

MODELS = {
    "ctl": "ok",
    "alt": "say:alt answer",
    "shadowed": shadow_script("peek"),
    "payee": shadow_script("payee"),
    "unpaid": shadow_script("unpaid"),
}


def config(upstream: FakeUpstream) -> dict[str, Any]:
    arms = [{"name": "control", "control": True}, {"name": "alt", "model": "alt"}]
    return {
        "backends": [backend(upstream, MODELS)],
        "retry": {"attempts": 1},
        "breaker": {"failure_threshold": 1000, "min_requests": 1000},
        "routes": [
            {"name": "split", "model": "ctl"},
            {"name": "variant", "policy": "rules", "model": "ctl"},
            {"name": "spend", "model": "ctl"},
            {"name": "paused", "model": "ctl"},
            {"name": "later", "model": "ctl"},
            {"name": "adaptive", "model": "ctl"},
            {"name": "learning", "model": "ctl"},
        ],
        "experiments": [
            {"name": "ab", "route": "split", "key": "user",
             "arms": [*arms, {"name": "peek", "shadow": True, "model": "shadowed"}]},
            {"name": "var", "route": "variant", "key": "session", "missing_key": "exclude",
             "arms": [{"name": "control", "control": True, "weight": 1},
                      {"name": "v", "weight": 3, "policy": {"model": "alt"}}]},
            {"name": "spend", "route": "spend",
             "arms": [{"name": "control", "control": True},
                      {"name": "payer", "shadow": True, "model": "payee", "call_backend": True,
                       "budget_usd_per_hour": 1.0},
                      {"name": "broke", "shadow": True, "model": "unpaid", "call_backend": True,
                       "budget_usd_per_hour": 0.0}]},
            {"name": "off", "route": "paused", "paused": True, "arms": arms},
            {"name": "future", "route": "later", "start": "2999-01-01T00:00:00Z", "arms": arms},
            {"name": "ts", "route": "adaptive", "allocation": {"kind": "thompson", "update_interval": 3600},
             "arms": arms},
            {"name": "learn", "route": "learning", "allocation": {"kind": "thompson", "update_interval": 0.3},
             "arms": arms},
        ],
    }


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = start(config(upstream), tmp_path_factory.mktemp("experiments"))
    yield proc
    proc.terminate()


@pytest.fixture
def sdk(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)


def expected_arm(user: str) -> str:
    """The arm the documented hash gives ``user`` in experiment ``ab`` (equal weights)."""
    point = assignment_key("ab", "user", "conversation", {"user": user}, {}, "unused")
    assert point is not None
    return ArmTable({"control": 0.5, "alt": 0.5}).pick(point.fraction)


def unit_of(user: str) -> str:
    """The randomisation unit recorded for ``user``: 64 bits of its key's hash (never the key)."""
    key = assignment_key("ab", "user", "conversation", {"user": user}, {}, "unused")
    assert key is not None
    return key.hash[:16]


def test_an_arm_is_assigned_by_key_and_marked_everywhere(sdk: OpenAI, gateway: GatewayProcess) -> None:
    seen: dict[str, set[str]] = {}
    ids: dict[str, str] = {}
    users = [key() for _ in range(24)]
    for user in users:
        for stream in (False, True, False):
            raw = sdk.chat.completions.with_raw_response.create(
                model="split", messages=MESSAGES, user=user, stream=stream
            )
            if stream:
                list(raw.parse())  # consume the stream: its record is written at its last byte
            seen.setdefault(user, set()).add(raw.headers["x-pointsman-arm"])
            arm = raw.headers["x-pointsman-arm"].split("/", 1)[1]
            assert raw.headers["x-pointsman-model"] == ("alt" if arm == "alt" else "ctl")
            ids[raw.headers["x-pointsman-request-id"]] = user
    # Every request of a user got the same arm, and it is the one the documented hash gives.
    assert all(len(arms) == 1 for arms in seen.values())
    assert {user: arms.pop() for user, arms in seen.items()} == {u: f"ab/{expected_arm(u)}" for u in users}
    assert {expected_arm(u) for u in users} == {"control", "alt"}  # 24 users: both arms (p ~ 1e-7 otherwise)

    for request_id, user in list(ids.items())[:6]:
        record = gateway.decision(request_id)
        assert (record["experiment"], record["experiment_arm"]) == ("ab", expected_arm(user))
        assert record["arm_propensity"] == pytest.approx(0.5) and record["shadow_of"] is None
        assert rows(gateway, "SELECT decision FROM decisions WHERE request_id = ?", (request_id,))[0][
            "decision"]["experiment"] == {"name": "ab", "arm": expected_arm(user), "propensity": 0.5,
                                          "key": "user", "how": "hash", "unit": unit_of(user)}
    counted = metric(gateway.url, "pointsman_experiment_requests", experiment="ab")
    assert counted >= 72
    assert metric(gateway.url, "pointsman_experiment_requests", experiment="ab", arm="alt") > 0


def test_route_explains_with_the_keys_arm_and_calls_nothing(
    gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    user = key()
    before = sum(upstream.state.requests.values())
    reply = httpx.post(f"{gateway.base_url}/route", json={"model": "split", "messages": MESSAGES, "user": user})
    assert reply.status_code == 200
    arm = expected_arm(user)
    assert reply.headers["x-pointsman-arm"] == f"ab/{arm}"
    explained = reply.json()
    assert explained["experiment"]["arm"] == arm and explained["experiment"]["propensity"] == 0.5
    assert explained["model"] == ("alt" if arm == "alt" else "ctl")
    assert sum(upstream.state.requests.values()) == before


def test_a_shadow_arm_decides_and_is_logged_but_never_calls_a_backend(
    sdk: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    served = []
    for stream in (False, True):
        raw = sdk.chat.completions.with_raw_response.create(model="split", messages=MESSAGES, user=key(), stream=stream)
        if stream:
            list(raw.parse())
        served.append(raw.headers["x-pointsman-request-id"])
    for request_id in served:
        shadow = gateway.decision(f"{request_id}:shadow:peek")
        assert shadow["shadow_of"] == request_id and shadow["outcome"] == "shadow"
        assert (shadow["experiment"], shadow["experiment_arm"], shadow["model"]) == ("ab", "peek", "shadowed")
        assert shadow["status"] == 0 and shadow["cost_usd"] is None
        # No call and no client: no attempts, no replica, no gateway overhead to report.
        assert (shadow["attempts"], shadow["replica"], shadow["overhead_ms"]) == (0, None, None)
    assert upstream_calls(upstream, MODELS["shadowed"]) == 0
    assert metric(gateway.url, "pointsman_experiment_shadow", experiment="ab", arm="peek", outcome="decided") >= 2
    assert metric(gateway.url, "pointsman_experiment_shadow", experiment="ab", arm="peek", outcome="called") == 0


def test_a_shadow_calls_its_backend_only_when_configured_and_within_budget(
    sdk: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    raw = sdk.chat.completions.with_raw_response.create(model="spend", messages=MESSAGES, user=key())
    request_id = raw.headers["x-pointsman-request-id"]
    assert raw.headers["x-pointsman-arm"] == "spend/control"
    paid = gateway.decision(f"{request_id}:shadow:payer")
    assert (paid["status"], paid["model"], paid["outcome"]) == (200, "payee", "shadow")
    assert paid["cost_usd"] == pytest.approx(CHEAP_CALL) and paid["shadow_of"] == request_id
    # The call's own running state lands in the shadow's row: one attempt, at the upstream it reached.
    assert (paid["attempts"], paid["backend"], paid["overhead_ms"]) == (1, "fake", None)
    assert paid["replica"] == upstream.base_url and paid["latency_ms"] > 0
    assert upstream_calls(upstream, MODELS["payee"]) >= 1
    broke = gateway.decision(f"{request_id}:shadow:broke")
    assert (broke["error_type"], broke["model"], broke["cost_usd"]) == ("skipped_budget", "unpaid", None)
    assert upstream_calls(upstream, MODELS["unpaid"]) == 0
    # The served request is one row of its own; its shadows do not count as served requests.
    assert rows(gateway, "SELECT count(*) AS n FROM decisions WHERE shadow_of = ?", (request_id,))[0]["n"] == 2


def test_a_policy_variant_arm_and_a_missing_key_left_out(sdk: OpenAI, gateway: GatewayProcess) -> None:
    answered = set()
    for i in range(12):
        raw = sdk.chat.completions.with_raw_response.create(
            model="variant", messages=MESSAGES, extra_headers={"x-pointsman-session-id": f"s-{key()}-{i}"}
        )
        arm = raw.headers["x-pointsman-arm"]
        answered.add((arm, raw.headers["x-pointsman-model"]))
    assert answered <= {("var/control", "ctl"), ("var/v", "alt")} and ("var/v", "alt") in answered
    # No session id and missing_key: exclude -> routed as usual, outside the experiment.
    raw = sdk.chat.completions.with_raw_response.create(model="variant", messages=MESSAGES, user=key())
    assert "x-pointsman-arm" not in raw.headers and raw.headers["x-pointsman-model"] == "ctl"
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert (record["experiment"], record["experiment_arm"], record["arm_propensity"]) == (None, None, None)


def test_paused_or_not_started_experiments_route_as_usual(sdk: OpenAI, gateway: GatewayProcess) -> None:
    for route in ("paused", "later"):
        raw = sdk.chat.completions.with_raw_response.create(model=route, messages=MESSAGES, user=key())
        assert "x-pointsman-arm" not in raw.headers and raw.headers["x-pointsman-model"] == "ctl"
        assert gateway.decision(raw.headers["x-pointsman-request-id"])["experiment"] is None


def test_every_experiment_is_registered_with_its_normalised_spec(gateway: GatewayProcess) -> None:
    registered = {row["name"]: row for row in rows(gateway, "SELECT * FROM experiments")}
    assert set(registered) == {"ab", "var", "spend", "off", "future", "ts", "learn"}
    spec = registered["var"]["spec"]
    assert (spec["route"], spec["control"], spec["key"], spec["missing_key"]) == ("variant", "control", "session",
                                                                                  "exclude")
    assert {a["name"]: a["weight"] for a in spec["arms"]} == {"control": 0.25, "v": 0.75}
    assert [a["name"] for a in registered["ab"]["spec"]["arms"] if a["shadow"]] == ["peek"]
    assert registered["off"]["spec"]["paused"] is True


def test_adaptive_assignments_are_stored_sticky_and_carry_their_propensity(
    sdk: OpenAI, gateway: GatewayProcess
) -> None:
    users = [key() for _ in range(8)]
    arms: dict[str, set[str]] = {}
    for _ in range(3):
        for user in users:
            raw = sdk.chat.completions.with_raw_response.create(model="adaptive", messages=MESSAGES, user=user)
            arms.setdefault(user, set()).add(raw.headers["x-pointsman-arm"])
            record = gateway.decision(raw.headers["x-pointsman-request-id"])
            # No evidence yet: both arms are equally likely, and that is what is logged.
            assert record["arm_propensity"] == pytest.approx(0.5)
    assert all(len(seen) == 1 for seen in arms.values())
    stored = rows(gateway, "SELECT * FROM experiment_assignments WHERE experiment = 'ts'")
    assert len(stored) == len(users)
    assert {f"ts/{row['arm']}" for row in stored} == {next(iter(s)) for s in arms.values()}


def test_adaptive_allocation_moves_new_keys_to_the_arm_with_better_feedback(
    sdk: OpenAI, gateway: GatewayProcess
) -> None:
    for _ in range(16):
        raw = sdk.chat.completions.with_raw_response.create(model="learning", messages=MESSAGES, user=key())
        arm = raw.headers["x-pointsman-arm"]
        reply = httpx.post(f"{gateway.base_url}/feedback", json={
            "request_id": raw.headers["x-pointsman-request-id"], "score": 1.0 if arm == "learn/alt" else 0.0})
        assert reply.status_code == 200

    def alt_share() -> float:
        explained = httpx.post(f"{gateway.base_url}/route", json={"model": "learning", "messages": MESSAGES,
                                                                   "user": key()}).json()["experiment"]
        assert explained["how"] == "would"  # a new key: nothing stored by a dry run
        p = explained["propensity"]
        return float(p if explained["arm"] == "alt" else 1.0 - p)

    eventually(lambda: alt_share() > 0.9, "new keys mostly go to the arm with the better feedback", timeout=15)
    fresh = [sdk.chat.completions.with_raw_response.create(model="learning", messages=MESSAGES, user=key())
             for _ in range(12)]
    records = [gateway.decision(r.headers["x-pointsman-request-id"]) for r in fresh]
    # Each logged propensity is the probability its arm had when the key was assigned.
    assert all((r["arm_propensity"] > 0.9) == (r["experiment_arm"] == "alt") for r in records)
    assert sum(r["experiment_arm"] == "alt" for r in records) >= 8
