"""Replica balancing, active health checks and circuit breakers, black-box through a gateway
subprocess against fake upstreams on loopback (and ports where nothing listens)."""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.config import BackendConfig, BreakerConfig
from gateway.health import HealthChecker
from gateway.pool import BackendPool
from gateway.upstream import UpstreamClient
from tests.fakes.upstream import BrokenUpstream, FakeUpstream, LoopbackServer, free_port
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

MESSAGES = [{"role": "user", "content": "hello"}]


def _key() -> str:
    return uuid.uuid4().hex


def _metric(gateway: GatewayProcess, name: str, backend: str, replica: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    pattern = rf'^{name}\{{backend="{re.escape(backend)}",replica="{re.escape(replica)}"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"{name} for {backend} {replica} not in /metrics"
    return float(match.group(1))


def _records(gateway: GatewayProcess, responses: list[httpx.Response]) -> list[dict[str, object]]:
    """Decision records of ``responses`` (one wait for the batch writer, then one query)."""
    ids = [r.headers["x-pointsman-request-id"] for r in responses]
    gateway.decision(ids[-1])
    eventually(lambda: {r["request_id"] for r in gateway.decisions()} >= set(ids), "all records written")
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
    eventually(lambda: _metric(pool_gateway, "pointsman_replica_healthy", "halfdead", dead_url) == 0.0,
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

    eventually(marked_down, "the only replica of 'alldead' is marked unhealthy")
    response = _chat(pool_gateway, "alldead-ok", _key())
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    record = pool_gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["attempts"] == 0 and record["status"] == 503
    ready = httpx.get(f"{pool_gateway.url}/ready", timeout=5)
    assert ready.status_code == 200, "other backends are healthy: the gateway is still ready"


# --- circuit breaker: outlier detection -------------------------------------------------------
# HTTP 5xx answers are judged by failure rate over a window with a minimum volume, and never eject
# a backend's last serving replica; transport failures (an outage) eject after a consecutive count;
# a passing health check returns an ejected replica at once. The gateways below keep the documented
# window defaults (window 30 s, min_requests 20, failure_rate 0.9) and set a long cooldown so that
# any recovery seen within a test came from a health check or a probe, not from the cooldown alone.

LONG_COOLDOWN = 60.0
MIN_REQUESTS = 20  # BreakerConfig's documented default


@pytest.fixture(scope="module")
def broken_upstream() -> Iterator[BrokenUpstream]:
    fake = BrokenUpstream().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def client_fault_gateway(
    upstream: FakeUpstream, backup_upstream: FakeUpstream, broken_upstream: BrokenUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    config = {
        "backends": [
            {   # one replica: requests whose content the upstream fails, and valid ones, on the same replica
                "name": "solo", "base_url": upstream.base_url, "health": {"enabled": False},
                "models": [{"name": "solo-bad", "upstream_name": "always-500"},
                           {"name": "solo-ok", "upstream_name": "ok"}],
            },
            {   # the same on two replicas
                "name": "duo", "replicas": [upstream.base_url, backup_upstream.base_url],
                "health": {"enabled": False},
                "models": [{"name": "duo-bad", "upstream_name": "always-500"},
                           {"name": "duo-ok", "upstream_name": "ok"}],
            },
            {   # a good replica and one that answers 500 to everything
                "name": "mixed", "replicas": [upstream.base_url, broken_upstream.base_url],
                "health": {"enabled": False},
                "models": [{"name": "mixed-ok", "upstream_name": "ok"}],
            },
        ],
        "retry": {"attempts": 3, "backoff_base": 0.001, "backoff_max": 0.005},
        "breaker": {"failure_threshold": 5, "cooldown": LONG_COOLDOWN},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-client-fault")).start()
    yield proc
    proc.terminate()


def _breaker(gateway: GatewayProcess, backend: str, replica_url: str) -> float:
    return _metric(gateway, "pointsman_breaker_state", backend, replica_url)


@pytest.mark.parametrize("backend", ["solo", "duo"])
def test_requests_the_upstream_fails_do_not_cut_off_other_clients(
    client_fault_gateway: GatewayProcess, upstream: FakeUpstream, backup_upstream: FakeUpstream, backend: str
) -> None:
    """30 requests answered 500 (each tried 3 times) leave valid requests on the same replicas served."""
    gateway = client_fault_gateway
    fakes = [upstream] if backend == "solo" else [upstream, backup_upstream]
    bad_user, good_user = _key(), _key()
    with ThreadPoolExecutor(4) as workers:
        bad = list(workers.map(lambda _: _chat(gateway, f"{backend}-bad", bad_user), range(30)))
    good = [_chat(gateway, f"{backend}-ok", good_user) for _ in range(20)]
    assert [r.status_code for r in good] == [200] * 20, [r.text for r in good if r.status_code != 200]
    assert sum(f.state.requests[("ok", good_user)] for f in fakes) == 20

    assert [r.status_code for r in bad] == [502] * 30, "the failing requests see the upstream's failure, not 503"
    assert sum(f.state.requests[("always-500", bad_user)] for f in fakes) == 90, "every attempt reached an upstream"
    states = [_breaker(gateway, backend, f.base_url) for f in fakes]
    assert states.count(0.0) >= 1, f"the backend's last replica was ejected for 5xx answers alone: {states}"


def test_replica_failing_nearly_every_request_is_ejected_once_there_is_enough_volume(
    client_fault_gateway: GatewayProcess, upstream: FakeUpstream, broken_upstream: BrokenUpstream
) -> None:
    gateway, broken = client_fault_gateway, broken_upstream
    user = _key()
    before = broken.seen
    failed_here = lambda: broken.seen - before  # noqa: E731

    responses: list[httpx.Response] = []
    while failed_here() < MIN_REQUESTS // 2:
        responses.append(_chat(gateway, "mixed-ok", user))
        assert _breaker(gateway, "mixed", broken.base_url) == 0.0, f"ejected after {failed_here()} 5xx answers"
        assert len(responses) < 100, "the broken replica got no traffic"

    while _breaker(gateway, "mixed", broken.base_url) != 2.0:
        responses.append(_chat(gateway, "mixed-ok", user))
        assert len(responses) < 200, "a replica answering 500 to everything was never ejected"
    assert failed_here() == MIN_REQUESTS, "ejected exactly when the window held min_requests answers, all failed"
    assert _breaker(gateway, "mixed", upstream.base_url) == 0.0
    assert all(r.status_code == 200 for r in responses), "retries on the good replica served every request"
    ejections = _metric_with(gateway, "pointsman_breaker_ejections_total", backend="mixed",
                             replica=broken.base_url, reason="error_rate")
    assert ejections == 1.0

    after = [_chat(gateway, "mixed-ok", user) for _ in range(10)]
    assert all(r.status_code == 200 for r in after)
    assert failed_here() == MIN_REQUESTS, "traffic reached the ejected replica"
    for record in _records(gateway, after):
        assert record["attempts"] == 1 and record["replica"] == upstream.base_url


def _metric_with(gateway: GatewayProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


class _Restartable:
    """A fake upstream on a fixed port that a test can stop (an outage) and start again (recovery)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.fake: FakeUpstream | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def up(self) -> None:
        self.fake = FakeUpstream(self.port).start()

    def down(self) -> None:
        if self.fake is not None:
            self.fake.stop()
            self.fake = None


@pytest.fixture(scope="module")
def flapping() -> Iterator[_Restartable]:
    server = _Restartable()
    server.up()
    yield server
    server.down()


@pytest.fixture(scope="module")
def outage_gateway(
    flapping: _Restartable, dead_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    fast = {"connect": 1.0, "first_byte": 2.0, "total": 10.0, "idle": 2.0}
    config = {
        "backends": [
            {"name": "dead", "base_url": dead_url, "health": {"enabled": False}, "timeouts": fast,
             "models": [{"name": "dead-ok", "upstream_name": "ok"}]},
            # Health checks on, but a large unhealthy_after keeps them from marking the replica down
            # during the outage, so the circuit is opened by the requests and closed by a passing check.
            {"name": "checked", "base_url": flapping.base_url, "timeouts": fast,
             "health": {"enabled": True, "interval": 0.2, "timeout": 0.5, "unhealthy_after": 1000},
             "models": [{"name": "checked-ok", "upstream_name": "ok"}]},
        ],
        "retry": {"attempts": 3, "backoff_base": 0.001, "backoff_max": 0.005},
        "breaker": {"failure_threshold": 2, "cooldown": LONG_COOLDOWN},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-outage")).start()
    yield proc
    proc.terminate()


def test_outage_opens_the_circuit_and_requests_fail_fast(outage_gateway: GatewayProcess, dead_url: str) -> None:
    gateway = outage_gateway
    assert _breaker(gateway, "dead", dead_url) == 0.0
    first = _chat(gateway, "dead-ok", _key())
    assert first.status_code == 502, first.text
    assert gateway.decision(first.headers["x-pointsman-request-id"])["attempts"] == 2, "open at failure_threshold"
    assert _breaker(gateway, "dead", dead_url) == 2.0
    for _ in range(3):
        started = time.monotonic()
        response = _chat(gateway, "dead-ok", _key())
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "service_unavailable"
        assert time.monotonic() - started < 1.0
        assert gateway.decision(response.headers["x-pointsman-request-id"])["attempts"] == 0
    assert _metric_with(gateway, "pointsman_breaker_ejections_total", backend="dead", reason="transport") == 1.0


def test_recovery_follows_the_health_check_not_the_cooldown(
    outage_gateway: GatewayProcess, flapping: _Restartable
) -> None:
    gateway, user = outage_gateway, _key()
    assert _chat(gateway, "checked-ok", user).status_code == 200
    flapping.down()
    try:
        outage = _chat(gateway, "checked-ok", user)
        assert outage.status_code == 502, outage.text
        assert _breaker(gateway, "checked", flapping.base_url) == 2.0
        assert _chat(gateway, "checked-ok", user).status_code == 503
        opened = time.monotonic()
    finally:
        flapping.up()
    served = None
    while served is None:
        response = _chat(gateway, "checked-ok", user)
        if response.status_code == 200:
            served = time.monotonic()
        else:
            assert response.status_code == 503, response.text
            assert time.monotonic() - opened < 10, "not served again 10 s after the upstream came back"
            time.sleep(0.05)
    assert served - opened < LONG_COOLDOWN / 4, "recovery waited for the cooldown"
    assert _breaker(gateway, "checked", flapping.base_url) == 0.0
    assert all(_chat(gateway, "checked-ok", user).status_code == 200 for _ in range(3))


# Without health checks an ejected replica comes back through the cooldown and one half-open probe.

COOLDOWN = 1.5  # long enough for the "open" checks below to run well inside it


@pytest.fixture(scope="module")
def probe_flapping() -> Iterator[_Restartable]:
    server = _Restartable()
    server.up()
    yield server
    server.down()


@pytest.fixture(scope="module")
def probe_gateway(probe_flapping: _Restartable, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [
            {"name": "unchecked", "base_url": probe_flapping.base_url, "health": {"enabled": False},
             "timeouts": {"connect": 1.0, "first_byte": 2.0, "total": 10.0, "idle": 2.0},
             "models": [{"name": "unchecked-ok", "upstream_name": "ok"}]},
        ],
        "retry": {"attempts": 3, "backoff_base": 0.001, "backoff_max": 0.005},
        "breaker": {"failure_threshold": 2, "cooldown": COOLDOWN},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-probe")).start()
    yield proc
    proc.terminate()


def test_without_health_checks_a_probe_after_the_cooldown_decides(
    probe_gateway: GatewayProcess, probe_flapping: _Restartable
) -> None:
    gateway, user = probe_gateway, _key()
    state = lambda: _breaker(gateway, "unchecked", probe_flapping.base_url)  # noqa: E731
    assert _chat(gateway, "unchecked-ok", user).status_code == 200
    probe_flapping.down()
    try:
        assert _chat(gateway, "unchecked-ok", user).status_code == 502
        assert state() == 2.0
        response = _chat(gateway, "unchecked-ok", user)
        assert response.status_code == 503
        assert gateway.decision(response.headers["x-pointsman-request-id"])["attempts"] == 0

        eventually(lambda: state() == 1.0, "half-open after the cooldown", timeout=COOLDOWN + 5)
        probe = _chat(gateway, "unchecked-ok", user)
        assert probe.status_code == 502, "the upstream is still down"
        assert gateway.decision(probe.headers["x-pointsman-request-id"])["attempts"] == 1, "exactly one probe"
        assert state() == 2.0, "a failed probe re-opens the circuit"
        assert _chat(gateway, "unchecked-ok", user).status_code == 503
    finally:
        probe_flapping.up()
    eventually(lambda: state() == 1.0, "half-open after the cooldown", timeout=COOLDOWN + 5)
    probe = _chat(gateway, "unchecked-ok", user)
    assert probe.status_code == 200, probe.text
    assert state() == 0.0, "a successful probe closes the circuit"
    assert all(_chat(gateway, "unchecked-ok", user).status_code == 200 for _ in range(3))


def test_a_streamed_probe_that_has_begun_answering_returns_the_replica_at_once(
    probe_flapping: _Restartable, tmp_path: Path
) -> None:
    # The half-open probe's outcome was recorded only when its stream ended: while a probe streamed
    # (a long generation: minutes), every other request to the backend got a 503 "no healthy replica",
    # though the replica had answered the probe with a 200 and its first tokens. (A backend whose only
    # replica is ejected, like the embedded model's, which has no health checks, was down that long.)
    config = {
        "backends": [
            {"name": "streamed", "base_url": probe_flapping.base_url, "health": {"enabled": False},
             "timeouts": {"connect": 1.0, "first_byte": 5.0, "total": 60.0, "idle": 30.0},
             "models": [{"name": "streamed-ok", "upstream_name": "ok"},
                        {"name": "streamed-long", "upstream_name": "stall-midstream"}]},
        ],
        "retry": {"attempts": 1},
        "breaker": {"failure_threshold": 1, "cooldown": 0.5},
    }
    gateway = GatewayProcess(config, tmp_path).start()
    state = lambda: _breaker(gateway, "streamed", probe_flapping.base_url)  # noqa: E731
    try:
        probe_flapping.down()
        try:
            assert _chat(gateway, "streamed-ok", _key()).status_code == 502
            assert state() == 2.0
        finally:
            probe_flapping.up()
        eventually(lambda: state() == 1.0, "half-open after the cooldown", timeout=10)
        body = {"model": "streamed-long", "messages": MESSAGES, "stream": True}
        with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body, timeout=30) as probe:
            assert probe.status_code == 200  # the probe's stream has begun: the replica answers
            response = _chat(gateway, "streamed-ok", _key())
            assert response.status_code == 200, response.text
            assert state() == 0.0
    finally:
        gateway.terminate()


# A health check's body is drained only so far: a replica answering it with a huge or endless body
# costs neither memory nor the check.

HUGE_BODY = 128 << 20


async def test_a_health_check_reads_a_bounded_part_of_a_huge_body() -> None:
    sent = 0

    async def huge_models(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % HUGE_BODY)
        chunk = b" " * (1 << 20)
        try:
            while sent < HUGE_BODY:
                writer.write(chunk)
                await writer.drain()  # raises once the checker has dropped the connection
                sent += len(chunk)
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(huge_models, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = BackendConfig.model_validate({
        "name": "b", "base_url": f"http://127.0.0.1:{port}/v1", "models": [{"name": "m"}],
        "health": {"timeout": 60, "unhealthy_after": 1},
    })
    pool = BackendPool([config], BreakerConfig())
    client = UpstreamClient()
    await client.start()
    try:
        replica = pool.backends[0].replicas[0]
        assert await HealthChecker(pool, client).check_once(replica)
        assert replica.healthy
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    # What the kernel's socket buffers took before the connection was dropped, not the body.
    assert sent < 32 << 20, f"the health check read {sent >> 20} MiB of the body"


# A replica URL may carry HTTP basic credentials; the password is sent, never shown.


def test_credentials_in_a_replica_url_are_sent_and_never_shown(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    secret = "hunter2-" + _key()
    with_credentials = upstream.base_url.replace("http://", f"http://svc:{secret}@")
    dead = f"http://svc:{secret}@127.0.0.1:{free_port()}/v1"
    config = {
        "backends": [
            {"name": "basic", "replicas": [with_credentials], "models": [{"name": "basic-ok", "upstream_name": "ok"}]},
            {"name": "basic-dead", "base_url": dead, "timeouts": {"connect": 1.0, "first_byte": 2.0},
             "health": {"interval": 0.1, "timeout": 0.5, "unhealthy_after": 1},
             "models": [{"name": "basic-dead-ok", "upstream_name": "ok"}]},
        ],
        "retry": {"attempts": 1},
    }
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
        user = _key()
        raw = client.chat.completions.with_raw_response.create(model="basic-ok", messages=MESSAGES, user=user)  # type: ignore[arg-type]
        assert raw.http_response.status_code == 200
        sent = base64.b64encode(f"svc:{secret}".encode()).decode()
        assert any(h.get("authorization") == f"Basic {sent}" for h in upstream.state.headers), "credentials not sent"
        with pytest.raises(openai.APIStatusError):  # a failure the log reports with the replica's address
            client.chat.completions.create(model="basic-dead-ok", messages=MESSAGES)  # type: ignore[arg-type]
        eventually(lambda: "basic-dead failed health checks" in gateway.log(), "the dead replica logged")
        record = gateway.decision(raw.headers["x-pointsman-request-id"])
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
        assert record["replica"] == upstream.base_url
        assert f'replica="{upstream.base_url}"' in metrics
    finally:
        gateway.terminate()
    shown = {"metrics": metrics, "log": gateway.log(), "records": repr(gateway.decisions())}
    assert [where for where, text in shown.items() if secret in text] == []


# A 5xx answer the gateway does not retry (501, 505, ...) is still a failed answer for the breaker.


class _Answers501(LoopbackServer):
    """A replica behind something that answers 501 Not Implemented to every POST (its GET /models: 200)."""

    def __init__(self) -> None:
        self.seen = 0

        async def fail(request: Request) -> Response:
            self.seen += 1
            return JSONResponse({"error": {"message": "not implemented", "type": "server_error"}}, status_code=501)

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": []})

        super().__init__(Starlette(routes=[
            Route("/v1/chat/completions", fail, methods=["POST"]), Route("/v1/models", models, methods=["GET"]),
        ]))


def test_a_replica_answering_only_501_is_ejected_like_one_answering_500(upstream: FakeUpstream, tmp_path: Path) -> None:
    broken = _Answers501().start()
    config = {
        "backends": [{"name": "odd", "replicas": [broken.base_url, upstream.base_url], "health": {"enabled": False},
                      "balancing": {"policy": "round_robin"},
                      "models": [{"name": "odd-ok", "upstream_name": "ok"}]}],
        "breaker": {"min_requests": 4, "window": 600, "cooldown": 600},
    }
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        user = _key()
        first = [_chat(gateway, "odd-ok", user) for _ in range(8)]
        assert sorted(r.status_code for r in first) == [200] * 4 + [502] * 4  # not retried elsewhere
        assert broken.seen == 4
        assert _breaker(gateway, "odd", broken.base_url) == 2.0, "4 answers out of 4 were 5xx: ejected"
        assert all(_chat(gateway, "odd-ok", user).status_code == 200 for _ in range(4))
        assert broken.seen == 4
    finally:
        gateway.terminate()
        broken.stop()
