"""Cache-aware replica routing end to end: the real gateway (a subprocess) in front of two fake engine
replicas whose time to first token depends on whether they have seen the conversation's prefix
(``tests/fakes/engine.py``), driven by the official ``openai`` SDK as an agent would drive it.

A multi-turn agent session stays on one replica (every later turn finds its prefix cached there), and
moves when that replica is overloaded (the gateway's own requests in flight, or the engine's reported
queue) or unhealthy; a replica that went down does not pull its old sessions back when it returns.
Two gateways sharing hints through Redis put one session's alternating turns on the same replica.
"""

from __future__ import annotations

import itertools
import json
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.engine import FakeEngine
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually
from tests.redisproc import PrivateRedis

SYSTEM = "You are a coding agent. Tools: read_file, run_tests, edit. " + "Rules and tool schemas. " * 150


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + "     ") for _ in range(n))


class AgentSession:
    """A tool-calling agent's conversation: each turn re-sends everything so far plus a tool result."""

    def __init__(self, seed: int, system: str = SYSTEM) -> None:
        self.rng = random.Random(seed)
        self.name = uuid.uuid4().hex[:12]
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"session={self.name} fix the failing test " + _text(self.rng, 400)},
        ]

    def turn(self, client: openai.OpenAI, model: str = "agent", extra: str = "") -> tuple[str, float]:
        """Send the conversation (streamed); returns (request id, client time to first token)."""
        messages = self.messages if not extra else [*self.messages, {"role": "user", "content": extra}]
        started = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, stream=True,  # type: ignore[arg-type]
        )
        request_id = raw.headers["x-pointsman-request-id"]
        ttft = None
        answer = ""
        for chunk in raw.parse():
            if ttft is None:
                ttft = time.perf_counter() - started
            if chunk.choices and chunk.choices[0].delta.content:
                answer += chunk.choices[0].delta.content
        if not extra:
            self.messages.append({"role": "assistant", "content": answer})
            self.messages.append({"role": "user", "content": "tool result: " + _text(self.rng, 3000)})
        assert ttft is not None
        return request_id, ttft


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[FakeEngine, FakeEngine]]:
    first, second = FakeEngine().start(), FakeEngine().start()
    yield first, second
    first.stop()
    second.stop()


def _config(engines: tuple[FakeEngine, FakeEngine], **balancing: Any) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "pool",
            "replicas": [e.base_url for e in engines],
            "health": {"enabled": True, "interval": 0.1, "timeout": 0.5, "unhealthy_after": 1, "healthy_after": 1},
            "balancing": {"policy": "cache_aware", "balance_abs": 2, "balance_rel": 1.5,
                          "engine_metrics": {"kind": "vllm"}, **balancing},
            "models": [{"name": "agent", "upstream_name": "m"}],
        }],
    }


@pytest.fixture(scope="module")
def gateway(
    engines: tuple[FakeEngine, FakeEngine], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = _config(engines)
    # A routed, sticky route over two models of the same replicas: the brain keeps a session on its
    # model, the backend keeps it on its replica.
    config["backends"][0]["models"] += [{"name": "small", "upstream_name": "m"}, {"name": "big", "upstream_name": "m"}]
    config["classifiers"] = {"encoder": "static"}
    config["routes"] = [{
        "name": "smart", "policy": "rules",
        "cost_quality": {"signal": "difficulty", "strong": "big", "weak": "small", "target_strong_share": 0.5,
                         "min_samples": 1},
        "sticky": {"enabled": True, "ttl": 600},
    }]
    proc = GatewayProcess(config, tmp_path_factory.mktemp("replicas")).start()
    yield proc
    proc.terminate()


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(autouse=True)
def engines_reset(engines: tuple[FakeEngine, FakeEngine], gateway: GatewayProcess) -> Iterator[None]:
    yield
    for engine in engines:
        httpx.post(engine.origin + "/control", json={"healthy": True, "waiting": 0, "release": True, "metrics": None})
    eventually(lambda: all(_metric(gateway, "pointsman_replica_healthy", e) == 1 for e in engines), "replicas healthy")


def _metric(gateway: GatewayProcess, name: str, engine: FakeEngine) -> float:
    for line in httpx.get(f"{gateway.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") and f'replica="{engine.base_url}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {engine.base_url} not in /metrics")


def _home(engines: tuple[FakeEngine, FakeEngine], session: AgentSession) -> int:
    """The index of the engine that served the session's latest turn."""
    latest = [max((r["at"] for r in e.served(session.name)), default=-1.0) for e in engines]
    assert max(latest) >= 0, "the session was never served"
    return latest.index(max(latest))


def _settled_session(
    client: openai.OpenAI, engines: tuple[FakeEngine, FakeEngine], seed: int, turns: int
) -> tuple[AgentSession, int]:
    """A session that has had ``turns`` turns, and the index of the engine holding it."""
    session = AgentSession(seed)
    for _ in range(turns):
        session.turn(client)
    return session, _home(engines, session)


def _replica_reason(gateway: GatewayProcess, request_id: str) -> tuple[str, str]:
    """(replica URL, the balancing policy's reason) from the request's decision record."""
    record = gateway.decision(request_id)
    return record["replica"], json.loads(record["decision"])["replica"]["reason"]


def test_a_session_stays_on_the_replica_that_holds_its_prefix(
    gateway: GatewayProcess, engines: tuple[FakeEngine, FakeEngine], client: openai.OpenAI
) -> None:
    session = AgentSession(1)
    ids = [session.turn(client)[0] for _ in range(5)]
    served = [len(e.served(session.name)) for e in engines]
    assert sorted(served) == [0, 5], f"one replica should serve every turn, got {served}"
    home = engines[served.index(5)]
    log = home.served(session.name)
    # Every later turn found the previous turn (prompt and answer) cached: only the new tool result
    # and the last user message were prefilled.
    for previous, turn in itertools.pairwise(log):
        assert turn["cached_chars"] >= previous["cached_chars"] + previous["uncached_chars"]
        assert turn["uncached_chars"] < 4000
    reasons = [_replica_reason(gateway, i) for i in ids]
    assert {replica for replica, _ in reasons} == {home.base_url}
    assert [reason for _, reason in reasons[1:]] == ["prefix"] * 4


def test_model_stickiness_and_replica_affinity_work_together(
    gateway: GatewayProcess, engines: tuple[FakeEngine, FakeEngine], client: openai.OpenAI
) -> None:
    session = AgentSession(6)
    ids = [session.turn(client, model="smart")[0] for _ in range(4)]
    records = [gateway.decision(i) for i in ids]
    decisions = [json.loads(r["decision"]) for r in records]
    assert len({r["model"] for r in records}) == 1  # the route kept the session on its model
    assert [d["details"]["sticky"] for d in decisions[1:]] == ["kept"] * 3
    assert len({r["replica"] for r in records}) == 1  # and the backend kept it on its replica
    assert [d["replica"]["reason"] for d in decisions[1:]] == ["prefix"] * 3


def test_least_outstanding_scatters_the_same_session(
    engines: tuple[FakeEngine, FakeEngine], tmp_path: Path
) -> None:
    """The baseline the policy exists to beat: by load alone, turns alternate and lose their prefix."""
    proc = GatewayProcess(_config(engines, policy="least_outstanding"), tmp_path).start()
    try:
        client = openai.OpenAI(base_url=proc.base_url, api_key="unused", max_retries=0)
        session = AgentSession(2)
        for _ in range(4):
            session.turn(client)
    finally:
        proc.terminate()
    served = [len(e.served(session.name)) for e in engines]
    assert served == [2, 2]
    # From the third turn on, each landed where the previous turn was not cached: it prefilled two
    # turns' worth of new text (more than the < 4,000 characters a turn costs when it stays, as above).
    later = sorted((r for e in engines for r in e.served(session.name)), key=lambda r: r["at"])[2:]
    assert all(r["uncached_chars"] > 5000 for r in later), [r["uncached_chars"] for r in later]


def test_an_overloaded_replica_spills_the_session_by_load(
    gateway: GatewayProcess, engines: tuple[FakeEngine, FakeEngine], client: openai.OpenAI
) -> None:
    session, home = _settled_session(client, engines, 3, turns=2)
    # The agent fans out: six parallel branches of the same conversation, held by the engine until
    # released, so the gateway sees them in flight.
    results: list[str] = []
    threads = [threading.Thread(target=lambda k=k: results.append(session.turn(client, extra=f"[hold] branch {k}")[0]))
               for k in range(6)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # one at a time, so each choice sees the ones before it in flight
    eventually(lambda: sum(_metric(gateway, "pointsman_replica_outstanding", e) for e in engines) == 6, "6 in flight")
    on_home = _metric(gateway, "pointsman_replica_outstanding", engines[home])
    on_other = _metric(gateway, "pointsman_replica_outstanding", engines[1 - home])
    # Tokens in flight: the branches' uncached prompt (the replica that holds the prefix owes little of
    # it) plus their expected output (256 each, no max_tokens given).
    tokens_home = _metric(gateway, "pointsman_replica_tokens_in_flight", engines[home])
    tokens_other = _metric(gateway, "pointsman_replica_tokens_in_flight", engines[1 - home])
    for engine in engines:
        httpx.post(engine.origin + "/control", json={"release": True})
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 6
    eventually(lambda: all(_metric(gateway, "pointsman_replica_tokens_in_flight", e) == 0 for e in engines),
               "tokens in flight back to 0")
    # The prefix holder took branches until its load passed the least-loaded one's by more than
    # balance_abs (2) and balance_rel (1.5x); the rest went by load.
    assert on_home >= 3 and on_other >= 1, (on_home, on_other)
    assert on_home - on_other <= 2 + 1
    per_home, per_other = tokens_home / on_home, tokens_other / on_other
    assert 256 < per_home < per_other, (per_home, per_other)
    reasons = [_replica_reason(gateway, i)[1] for i in results]
    assert "imbalance" in reasons and "prefix" in reasons


def test_a_queue_the_engine_reports_moves_the_session(
    gateway: GatewayProcess, engines: tuple[FakeEngine, FakeEngine], client: openai.OpenAI
) -> None:
    """Another gateway's traffic, seen only in the engine's own /metrics, counts as load."""
    session, home = _settled_session(client, engines, 4, turns=2)
    httpx.post(engines[home].origin + "/control", json={"waiting": 10})
    eventually(lambda: _metric(gateway, "pointsman_replica_engine_external_load", engines[home]) == 10,
               "the engine's queue read by the gateway")
    request_id, _ = session.turn(client)
    replica, reason = _replica_reason(gateway, request_id)
    assert (replica, reason) == (engines[1 - home].base_url, "imbalance")
    httpx.post(engines[home].origin + "/control", json={"waiting": 0})
    eventually(lambda: _metric(gateway, "pointsman_replica_engine_external_load", engines[home]) == 0, "queue gone")


def test_an_engine_reporting_garbage_load_is_balanced_as_if_it_reported_none(
    gateway: GatewayProcess, engines: tuple[FakeEngine, FakeEngine], client: openai.OpenAI
) -> None:
    """Numbers an engine's /metrics may hold (+Inf running beside -Inf waiting made the load NaN) are not
    load: requests are still served by both replicas, never answered with a 500."""
    garbage = (
        'vllm:num_requests_running{model_name="m"} +Inf\n'
        'vllm:num_requests_waiting{model_name="m"} -Inf\n'
        'vllm:kv_cache_usage_perc{model_name="m"} NaN\n'
    )
    reads = engines[0].state.metrics_reads
    httpx.post(engines[0].origin + "/control", json={"metrics": garbage})
    eventually(lambda: engines[0].state.metrics_reads >= reads + 2, "the garbage read by the gateway")
    ids = [AgentSession(30 + k).turn(client)[0] for k in range(4)]  # first turns: placed by load
    assert {_replica_reason(gateway, i)[0] for i in ids} == {e.base_url for e in engines}
    assert _metric(gateway, "pointsman_replica_engine_external_load", engines[0]) == 0


def test_an_unhealthy_replica_loses_its_sessions_at_once(
    gateway: GatewayProcess, engines: tuple[FakeEngine, FakeEngine], client: openai.OpenAI
) -> None:
    session, home = _settled_session(client, engines, 5, turns=3)
    other = engines[1 - home]
    httpx.post(engines[home].origin + "/control", json={"healthy": False})
    eventually(lambda: _metric(gateway, "pointsman_replica_healthy", engines[home]) == 0, "replica marked down")
    moved, _ = session.turn(client)
    assert _replica_reason(gateway, moved)[0] == other.base_url
    assert other.served(session.name)[-1]["cached_chars"] < len(SYSTEM) + 2000  # a cold start there
    # Back up (with its old cache): the session stays where it moved, now warm there.
    httpx.post(engines[home].origin + "/control", json={"healthy": True})
    eventually(lambda: _metric(gateway, "pointsman_replica_healthy", engines[home]) == 1, "replica back")
    for _ in range(2):
        request_id, _ = session.turn(client)
        assert _replica_reason(gateway, request_id) == (other.base_url, "prefix")
    assert other.served(session.name)[-1]["uncached_chars"] < 4000


def test_two_gateways_sharing_hints_keep_a_session_on_one_replica(
    engines: tuple[FakeEngine, FakeEngine], tmp_path: Path
) -> None:
    """Turns alternate between two gateways; hints through Redis keep them on one replica."""
    redis_server = PrivateRedis(tmp_path).start()
    gateways: list[GatewayProcess] = []
    try:
        for k in range(2):
            config = _config(engines, hint_interval=0.05)
            config["shared_state"] = {"kind": "redis", "url": redis_server.url}
            workdir = tmp_path / f"gw{k}"
            workdir.mkdir()
            gateways.append(GatewayProcess(config, workdir).start())
        clients = [openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0) for g in gateways]
        # Different agents (no shared system prompt), so each gateway on its own would place each
        # session's turns by load alone, in turn; one extra request puts the second gateway's turn
        # order out of step with the first's, as it would be in production.
        sessions = [AgentSession(10 + k, system=f"agent {k}: " + SYSTEM) for k in range(4)]
        AgentSession(20, system="warm-up").turn(clients[1])
        for turn in range(4):
            for session in sessions:
                session.turn(clients[turn % 2])
                time.sleep(0.2)  # > hint_interval: the peer has heard where the turn went
    finally:
        for proc in gateways:
            proc.terminate()
        redis_server.stop()
    for session in sessions:
        served = sorted(len(e.served(session.name)) for e in engines)
        assert served == [0, 4], f"session {session.name} split across replicas: {served}"
