"""End to end: two gateway replicas sharing one PostgreSQL store, fake upstreams on loopback, the openai
SDK as the client.

1. A key gets the same arm on every request, on either replica (and the arm is the one the documented
   hash gives it).
2. A shadow arm decides for every served request (its rows are in the store, linked to the served
   request) and never calls a backend, since it is not configured to.
3. When the treatment arm's upstream starts failing, a guardrail stops the arm — one stop, stored once,
   counted once across the replicas — and from then on both replicas serve the arm's keys with the
   control, marked as such.
4. ``pointsman ab report`` reads the experiment from the store: every served request of both replicas,
   the shadow rows and the stop.

PostgreSQL is required (``tests/store/conftest.py``): a server that cannot be reached fails the test.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest
from openai import OpenAI

from gateway.cli import main as pointsman
from policies.experiments.assign import ArmTable, assignment_key
from tests.experiments.conftest import MESSAGES, backend, metric, shadow_script, upstream_calls
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess
from tests.polling import eventually
from tests.store.conftest import sync_pg_schema

pytestmark = pytest.mark.postgres

EXPERIMENT = "e2e"


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN on a fresh, empty schema (dropped afterwards), for this synchronous test."""
    with sync_pg_schema() as dsn:
        yield dsn


def query(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(dsn)
        try:
            return [dict(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(run())


def arm_of(user: str) -> str:
    point = assignment_key(EXPERIMENT, "user", "conversation", {"user": user}, {}, "unused")
    assert point is not None
    return ArmTable({"control": 0.5, "treat": 0.5}).pick(point.fraction)


def users_of(arm: str, n: int) -> list[str]:
    """``n`` fresh users the hash puts in ``arm``."""
    found: list[str] = []
    while len(found) < n:
        user = f"u-{uuid.uuid4().hex}"
        if arm_of(user) == arm:
            found.append(user)
    return found


def ask(client: OpenAI, user: str) -> tuple[int, dict[str, str]]:
    """(status, headers) of one chat request; an error answer is an answer too."""
    try:
        raw = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES, user=user)
    except openai.APIStatusError as error:
        return error.status_code, dict(error.response.headers)
    return raw.status_code, dict(raw.headers)


def test_two_replicas_share_assignments_shadows_and_guardrail_stops(
    pg_dsn: str, upstream: FakeUpstream, tmp_path: Path
) -> None:
    tag = f"treat-{uuid.uuid4().hex[:8]}"
    shadowed = shadow_script(f"e2e-{tag}")
    config = {
        "backends": [backend(upstream, {"ctl": "ok", "treat-model": f"switch:{tag}", "shadowed": shadowed})],
        "retry": {"attempts": 1},
        "breaker": {"failure_threshold": 1000, "min_requests": 1000},
        "store": {"kind": "postgres", "dsn": pg_dsn, "flush_interval": 0.05},
        "routes": [{"name": "auto", "model": "ctl"}],
        "experiments": [{
            "name": EXPERIMENT, "route": "auto", "key": "user",
            "arms": [{"name": "control", "control": True}, {"name": "treat", "model": "treat-model"},
                     {"name": "peek", "shadow": True, "model": "shadowed"}],
            "guardrails": {"interval": 0.5, "poll_interval": 0.5, "min_requests": 20,
                           "max_error_rate_increase": 0.1, "max_cost_ratio": None, "max_p95_ratio": None},
        }],
    }
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    replicas = [GatewayProcess(config, tmp_path / name) for name in ("a", "b")]
    for replica in replicas:
        replica.start(timeout=60)  # one after the other: the first one migrates the fresh schema
    try:
        clients = [OpenAI(base_url=r.base_url, api_key="unused", max_retries=0, timeout=30) for r in replicas]
        served: list[str] = []

        # 1. Every user keeps its arm, whichever replica answers.
        users = users_of("control", 15) + users_of("treat", 15)
        for user in users:
            for client in (clients[0], clients[1], clients[0]):
                status, headers = ask(client, user)
                assert status == 200
                assert headers["x-pointsman-arm"] == f"{EXPERIMENT}/{arm_of(user)}"
                assert headers["x-pointsman-model"] == ("treat-model" if arm_of(user) == "treat" else "ctl")
                served.append(headers["x-pointsman-request-id"])
        first = served[0]
        eventually(lambda: query(pg_dsn, "SELECT 1 FROM decisions WHERE request_id = $1", first),
                   "the first record flushed to PostgreSQL")
        row = query(pg_dsn, "SELECT * FROM decisions WHERE request_id = $1", first)[0]
        assert (row["experiment"], row["experiment_arm"], row["arm_propensity"]) == (EXPERIMENT, "control", 0.5)

        # 2. The shadow arm decided for served requests of both replicas and never called its model.
        eventually(lambda: len(query(pg_dsn, "SELECT 1 FROM decisions WHERE shadow_of IS NOT NULL")) == len(served),
                   "a shadow row for every served request", timeout=15)
        shadows = query(pg_dsn, "SELECT * FROM decisions WHERE shadow_of = $1", first)
        assert [(s["request_id"], s["experiment_arm"], s["outcome"], s["model"]) for s in shadows] == [
            (f"{first}:shadow:peek", "peek", "shadow", "shadowed")]
        assert upstream_calls(upstream, shadowed) == 0

        # 3. The treatment's upstream starts failing; keep sending (both replicas) until both serve its keys
        # with the control.
        upstream.state.failing.add(tag)
        treated = users_of("treat", 4)

        def both_moved() -> bool:
            for i, user in enumerate(users_of("treat", 2) + users_of("control", 1)):
                _, headers = ask(clients[i % 2], user)
                served.append(headers["x-pointsman-request-id"])
            answers = [ask(client, user) for user in treated for client in clients]
            served.extend(headers["x-pointsman-request-id"] for _, headers in answers)
            return all(status == 200 and headers["x-pointsman-arm"] == f"{EXPERIMENT}/control"
                       for status, headers in answers)

        eventually(both_moved, "both replicas serve the stopped arm's keys with the control", timeout=60)
        stops = query(pg_dsn, "SELECT * FROM experiment_stops")
        assert [(s["experiment"], s["arm"], s["reason"]) for s in stops] == [(EXPERIMENT, "treat", "error_rate")]
        detail = json.loads(stops[0]["detail"]) if isinstance(stops[0]["detail"], str) else stops[0]["detail"]
        assert detail["lower"] > 0.1 and detail["control"] == "control"
        counted = [metric(r.url, "pointsman_experiment_arm_stops", experiment=EXPERIMENT, arm="treat",
                          guardrail="error_rate") for r in replicas]
        assert sum(counted) == 1  # one stop, counted by the replica that stored it
        assert all(metric(r.url, "pointsman_experiment_arm_stopped", experiment=EXPERIMENT, arm="treat") == 1
                   for r in replicas)
        moved = served[-1]
        eventually(lambda: query(pg_dsn, "SELECT 1 FROM decisions WHERE request_id = $1", moved), "flushed")
        record = query(pg_dsn, "SELECT * FROM decisions WHERE request_id = $1", moved)[0]
        decision = json.loads(record["decision"]) if isinstance(record["decision"], str) else record["decision"]
        assert (record["experiment_arm"], record["arm_propensity"], record["model"]) == ("control", 1.0, "ctl")
        assert decision["experiment"]["assigned"] == "treat" and decision["experiment"]["stopped"] is True
        assert upstream_calls(upstream, shadowed) == 0
    finally:
        for replica in replicas:
            replica.terminate()  # flushes every record before exiting

    # 4. The report reads what both replicas wrote.
    if not (REPO / "evals" / "ab" / "cli.py").exists():
        pytest.fail("evals/ab/cli.py (pointsman ab report) is missing")
    out = tmp_path / "report"
    assert pointsman(["ab", "report", EXPERIMENT, "--store", pg_dsn, "--out", str(out), "--format", "json",
                      "--no-progress"]) == 0
    report = json.loads((out / "ab-report.json").read_text())
    stored = query(pg_dsn, "SELECT request_id FROM decisions WHERE experiment = $1 AND shadow_of IS NULL "
                           "AND outcome <> 'client_disconnected'", EXPERIMENT)
    assert set(served) <= {row["request_id"] for row in stored}  # every answer of both replicas is a row
    assert report["rows"]["served"] == len(stored)
    assert report["rows"]["shadow"] == len(query(pg_dsn, "SELECT 1 FROM decisions WHERE shadow_of IS NOT NULL"))
    assert [(s["arm"], s["reason"]) for s in report["stops"]] == [("treat", "error_rate")]
    assert sum(report["arms"][arm]["requests"] for arm in ("control", "treat")) == len(stored)
