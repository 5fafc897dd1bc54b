"""Replica balancing, active health checks and circuit breakers, black-box through a gateway
subprocess against fake upstreams on loopback (and ports where nothing listens)."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.fakes.upstream import FAILS, FakeUpstream, free_port
from tests.gatewayproc import GatewayProcess

MESSAGES = [{"role": "user", "content": "hello"}]


def _key() -> str:
    return uuid.uuid4().hex


def _metric(gateway: GatewayProcess, name: str, backend: str, replica: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    pattern = rf'^{name}\{{backend="{re.escape(backend)}",replica="{re.escape(replica)}"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"{name} for {backend} {replica} not in /metrics"
    return float(match.group(1))


def _eventually(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {what}")
        time.sleep(0.05)


def _records(gateway: GatewayProcess, responses: list[httpx.Response]) -> list[dict[str, object]]:
    """Decision records of ``responses`` (one wait for the batch writer, then one query)."""
    ids = [r.headers["x-pointsman-request-id"] for r in responses]
    gateway.decision(ids[-1])
    _eventually(lambda: {r["request_id"] for r in gateway.decisions()} >= set(ids), "all records written")
    by_id = {r["request_id"]: r for r in gateway.decisions()}
    return [by_id[i] for i in ids]


def _chat(gateway: GatewayProcess, model: str, user: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=15,
                      json={"model": model, "messages": MESSAGES, "user": user})


# --- balancing and health checks -------------------------------------------------------------


@pytest.fixture(scope="module")
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # nothing listens here


@pytest.fixture(scope="module")
def pool_gateway(
    upstream: FakeUpstream, backup_upstream: FakeUpstream, dead_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    fast = {"connect": 1.0, "first_byte": 2.0, "total": 10.0, "idle": 2.0}
    health = {"enabled": True, "interval": 0.2, "timeout": 0.5, "unhealthy_after": 1}
    config = {
        "backends": [
            {   # two healthy replicas
                "name": "pair",
                "replicas": [upstream.base_url, backup_upstream.base_url],
                "health": {"enabled": False},
                "timeouts": fast,
                "models": [{"name": "pair-ok", "upstream_name": "ok"},
                           {"name": "pair-drip", "upstream_name": "slow-drip"}],
            },
            {   # one healthy replica, one dead one
                "name": "halfdead",
                "replicas": [dead_url, upstream.base_url],
                "health": health,
                "timeouts": fast,
                "models": [{"name": "halfdead-ok", "upstream_name": "ok"}],
            },
            {   # nothing alive at all
                "name": "alldead",
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "health": health,
                "timeouts": fast,
                "models": [{"name": "alldead-ok", "upstream_name": "ok"}],
            },
        ],
        "retry": {"attempts": 3, "backoff_base": 0.01, "backoff_max": 0.05},
        "breaker": {"failure_threshold": 1000, "cooldown": 1},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-pool")).start()
    yield proc
    proc.terminate()


def test_two_healthy_replicas_both_get_traffic(
    pool_gateway: GatewayProcess, upstream: FakeUpstream, backup_upstream: FakeUpstream
) -> None:
    user = _key()
    responses = [_chat(pool_gateway, "pair-ok", user) for _ in range(20)]
    assert all(r.status_code == 200 for r in responses)
    replicas = {record["replica"] for record in _records(pool_gateway, responses)}
    first, second = upstream.state.requests[("ok", user)], backup_upstream.state.requests[("ok", user)]
    assert first + second == 20
    assert first >= 5 and second >= 5, f"load not spread: {first} vs {second}"
    assert replicas == {upstream.base_url, backup_upstream.base_url}


def test_busy_replica_is_avoided(
    pool_gateway: GatewayProcess, upstream: FakeUpstream, backup_upstream: FakeUpstream
) -> None:
    """While one replica serves a long stream, new requests go to the one with nothing outstanding."""
    drip_user, user = _key(), _key()
    first_chunk = threading.Event()
    done = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream("POST", f"{pool_gateway.base_url}/chat/completions", timeout=15,
                              json={"model": "pair-drip", "messages": MESSAGES, "stream": True,
                                    "user": drip_user}) as response:
                for _ in response.iter_raw():
                    first_chunk.set()
        finally:
            first_chunk.set()
            done.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert first_chunk.wait(10)
    fakes = (upstream, backup_upstream)
    busy = next(f for f in fakes if f.state.requests[("slow-drip", drip_user)])
    idle = next(f for f in fakes if f is not busy)
    for _ in range(6):
        assert _chat(pool_gateway, "pair-ok", user).status_code == 200
    still_streaming = not done.is_set()
    thread.join(15)
    assert still_streaming, "the stream finished before the check; it must span the quick requests"
    assert idle.state.requests[("ok", user)] == 6, "requests went to the replica busy with a stream"
    assert busy.state.requests[("ok", user)] == 0


def test_dead_replica_is_marked_down_and_skipped(
    pool_gateway: GatewayProcess, upstream: FakeUpstream, dead_url: str
) -> None:
    _eventually(lambda: _metric(pool_gateway, "pointsman_replica_healthy", "halfdead", dead_url) == 0.0,
                "the dead replica is marked unhealthy")
    assert _metric(pool_gateway, "pointsman_replica_healthy", "halfdead", upstream.base_url) == 1.0
    user = _key()
    responses = [_chat(pool_gateway, "halfdead-ok", user) for _ in range(10)]
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    for record in _records(pool_gateway, responses):
        assert record["attempts"] == 1, "a request was sent to the replica marked down"
        assert record["replica"] == upstream.base_url
    assert upstream.state.requests[("ok", user)] == 10


def test_backend_with_no_healthy_replica_fails_fast_with_503(pool_gateway: GatewayProcess) -> None:
    def marked_down() -> bool:
        text = httpx.get(f"{pool_gateway.url}/metrics", timeout=5).text
        return bool(re.search(r'^pointsman_replica_healthy\{backend="alldead",[^}]*\} 0\.0$', text, re.MULTILINE))

    _eventually(marked_down, "the only replica of 'alldead' is marked unhealthy")
    response = _chat(pool_gateway, "alldead-ok", _key())
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    record = pool_gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["attempts"] == 0 and record["status"] == 503
    ready = httpx.get(f"{pool_gateway.url}/ready", timeout=5)
    assert ready.status_code == 200, "other backends are healthy: the gateway is still ready"


# --- circuit breaker ---------------------------------------------------------------------------

COOLDOWN = 1.5  # long enough for the "open" checks below to run well inside it


@pytest.fixture(scope="module")
def breaker_gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [
            {"name": "broken", "base_url": upstream.base_url, "health": {"enabled": False},
             "models": [{"name": "broken-500", "upstream_name": "always-500"}]},
            {"name": "flaky", "base_url": upstream.base_url, "health": {"enabled": False},
             "models": [{"name": "flaky-500", "upstream_name": "flaky-500"}]},
        ],
        "retry": {"attempts": 3, "backoff_base": 0.01, "backoff_max": 0.02},
        "breaker": {"failure_threshold": 2, "cooldown": COOLDOWN},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-breaker")).start()
    yield proc
    proc.terminate()


def _breaker(gateway: GatewayProcess, backend: str, upstream: FakeUpstream) -> float:
    return _metric(gateway, "pointsman_breaker_state", backend, upstream.base_url)


def test_breaker_opens_fails_fast_and_reopens_after_a_failed_probe(
    breaker_gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    user = _key()
    seen = lambda: upstream.state.requests[("always-500", user)]  # noqa: E731

    assert _breaker(breaker_gateway, "broken", upstream) == 0.0
    first = _chat(breaker_gateway, "broken-500", user)
    assert first.status_code == 502, first.text
    assert seen() == 2, "the breaker opens after failure_threshold (2) consecutive failures"
    assert _breaker(breaker_gateway, "broken", upstream) == 2.0

    for _ in range(3):  # open: refused at once, nothing reaches the upstream
        response = _chat(breaker_gateway, "broken-500", user)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "service_unavailable"
        assert breaker_gateway.decision(response.headers["x-pointsman-request-id"])["attempts"] == 0
    assert seen() == 2, "requests reached the upstream while the breaker was open"

    _eventually(lambda: _breaker(breaker_gateway, "broken", upstream) == 1.0, "half-open after the cooldown",
                timeout=COOLDOWN + 5)
    probe = _chat(breaker_gateway, "broken-500", user)
    assert probe.status_code == 502
    assert seen() == 3, "exactly one probe goes through when half-open"
    assert breaker_gateway.decision(probe.headers["x-pointsman-request-id"])["attempts"] == 1
    assert _breaker(breaker_gateway, "broken", upstream) == 2.0, "a failed probe re-opens the breaker"
    assert _chat(breaker_gateway, "broken-500", user).status_code == 503
    assert seen() == 3


def test_breaker_closes_after_a_successful_probe(breaker_gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    user = _key()
    seen = lambda: upstream.state.requests[("flaky-500", user)]  # noqa: E731

    assert _chat(breaker_gateway, "flaky-500", user).status_code == 502  # FAILS (2) failures: open
    assert seen() == FAILS
    assert _breaker(breaker_gateway, "flaky", upstream) == 2.0
    assert _chat(breaker_gateway, "flaky-500", user).status_code == 503
    assert seen() == FAILS

    _eventually(lambda: _breaker(breaker_gateway, "flaky", upstream) == 1.0, "half-open after the cooldown",
                timeout=COOLDOWN + 5)
    probe = _chat(breaker_gateway, "flaky-500", user)  # the upstream has recovered
    assert probe.status_code == 200, probe.text
    assert _breaker(breaker_gateway, "flaky", upstream) == 0.0, "a successful probe closes the breaker"
    for _ in range(3):
        assert _chat(breaker_gateway, "flaky-500", user).status_code == 200
    assert seen() == FAILS + 4
