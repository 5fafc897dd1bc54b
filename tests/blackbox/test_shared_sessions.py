"""Session stickiness shared by gateway replicas through a real Redis (``shared_state.kind: redis``).

Two gateway processes on one Redis stand in for two replicas behind a load balancer: a conversation
pinned by one stays on its model when the other serves its next turn. Redis that is down at start-up
stops the gateway with a message naming the key; Redis lost mid-traffic leaves requests decided (without
stickiness) instead of failed. Redis runs at 127.0.0.1:6379 (``.ci/run`` starts it when it is not up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from openai import OpenAI

from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.routing import RoutingBrain
from policies import RequestContext
from tests.blackbox.test_auto_routing import routing_config
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess

REDIS_URL = "redis://127.0.0.1:6379/0"


def shared_config(upstream: FakeUpstream, prefix: str, url: str = REDIS_URL) -> dict[str, Any]:
    config = routing_config(upstream)
    config["shared_state"] = {"kind": "redis", "url": url, "key_prefix": prefix}
    return config


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    """A key prefix of this module's own, removed afterwards (the Redis is shared with other users)."""
    name = f"pointsman-test-{uuid.uuid4().hex[:8]}:"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=name + "*"):
        client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def replicas(
    upstream: FakeUpstream, prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    a = GatewayProcess(shared_config(upstream, prefix), tmp_path_factory.mktemp("replica-a")).start(timeout=60)
    try:
        b = GatewayProcess(shared_config(upstream, prefix), tmp_path_factory.mktemp("replica-b")).start(timeout=60)
    except BaseException:
        a.terminate()
        raise
    yield a, b
    a.terminate()
    b.terminate()


def _ask(gateway: GatewayProcess, messages: list[dict[str, Any]], headers: dict[str, str]) -> tuple[str, str]:
    sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)
    raw = sdk.chat.completions.with_raw_response.create(model="auto", messages=messages, extra_headers=headers)  # type: ignore[arg-type]
    raw.parse()
    return raw.headers["x-pointsman-model"], raw.headers["x-pointsman-request-id"]


def test_a_conversation_stays_on_its_model_across_replicas(replicas: tuple[GatewayProcess, GatewayProcess]) -> None:
    a, b = replicas
    session = {"x-pointsman-session-id": uuid.uuid4().hex}
    turn1 = [{"role": "user", "content": "Prove that there are infinitely many primes."}]
    first, _ = _ask(a, turn1, {**session, "x-pointsman-threshold": "0"})  # the knob says strong
    assert first == "big-model"
    turn2 = [*turn1, {"role": "assistant", "content": "Suppose finitely many..."}, {"role": "user", "content": "ok"}]
    second, rid = _ask(b, turn2, {**session, "x-pointsman-threshold": "1"})  # the knob says weak
    assert second == "big-model", "replica B found the session replica A pinned"
    record = json.loads(b.decision(rid)["decision"])
    assert "session stays on big-model" in json.dumps(record)
    # Control: a new conversation on replica B is decided on its own.
    other, _ = _ask(b, [{"role": "user", "content": "hi"}],
                    {"x-pointsman-session-id": uuid.uuid4().hex, "x-pointsman-threshold": "1"})
    assert other == "small-model"


def test_an_escalation_on_one_replica_holds_on_the_other(replicas: tuple[GatewayProcess, GatewayProcess]) -> None:
    a, b = replicas
    session = {"x-pointsman-session-id": uuid.uuid4().hex}
    turn1 = [{"role": "user", "content": "Tell me a fun fact."}]
    assert _ask(a, turn1, {**session, "x-pointsman-threshold": "1"})[0] == "small-model"
    turn2 = [*turn1, {"role": "assistant", "content": "..."}, {"role": "user", "content": "Now prove it."}]
    assert _ask(b, turn2, {**session, "x-pointsman-threshold": "0"})[0] == "big-model"  # escalated on B
    turn3 = [*turn2, {"role": "assistant", "content": "..."}, {"role": "user", "content": "thanks"}]
    third, rid = _ask(a, turn3, {**session, "x-pointsman-threshold": "1"})
    assert third == "big-model", "replica A sees the escalation replica B stored"
    assert "session stays on big-model" in a.decision(rid)["decision"]


def test_redis_holds_hashed_session_keys_with_the_route_ttl(
    replicas: tuple[GatewayProcess, GatewayProcess], prefix: str
) -> None:
    a, _ = replicas
    session_id = f"user-visible-{uuid.uuid4().hex}"
    _ask(a, [{"role": "user", "content": "Derive the quadratic formula."}],
         {"x-pointsman-session-id": session_id, "x-pointsman-threshold": "0"})
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [k.decode() for k in client.scan_iter(match=prefix + "sticky:*")]
        assert keys and all(session_id not in k for k in keys)
        values = {client.get(k) for k in keys}
        assert b"big-model" in values
        ttls = [client.pttl(k) for k in keys]
        assert all(0 < t <= 600_000 for t in ttls)  # the route's sticky.ttl: 600 s
    finally:
        client.close()


def test_redis_down_at_start_up_stops_the_gateway_naming_the_key(upstream: FakeUpstream, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(shared_config(upstream, "x:", url="redis://127.0.0.1:1/0")))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "shared_state.url: cannot reach Redis" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_redis_url_that_is_not_redis_is_refused_naming_the_key(upstream: FakeUpstream) -> None:
    config = shared_config(upstream, "x:", url="http://127.0.0.1:6379")
    with pytest.raises(ConfigError, match="shared_state") as info:
        parse_config(config, env={})
    assert "redis://" in str(info.value)


class _Proxy:
    """A TCP relay to Redis that can be cut, as a network partition or a Redis restart would."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()


@pytest.fixture
async def cut_brain(upstream: FakeUpstream, prefix: str) -> AsyncIterator[tuple[RoutingBrain, _Proxy]]:
    proxy = _Proxy()
    port = await proxy.start()
    brain = RoutingBrain(parse_config(shared_config(upstream, prefix, url=f"redis://127.0.0.1:{port}/0"), env={}))
    await brain.start()
    try:
        yield brain, proxy
    finally:
        await brain.close()


def _ctx(session: str, threshold: str, text: str) -> RequestContext:
    return RequestContext(
        request_id=uuid.uuid4().hex, endpoint="chat.completions", route="auto",
        body={"model": "auto", "messages": [{"role": "user", "content": text}]},
        headers={"x-pointsman-session-id": session, "x-pointsman-threshold": threshold},
    )


@pytest.mark.timeout(60)
async def test_losing_redis_mid_traffic_decides_without_stickiness(cut_brain: tuple[RoutingBrain, _Proxy]) -> None:
    brain, proxy = cut_brain
    policy = brain.policies["auto"]
    session = uuid.uuid4().hex
    pinned = await policy.decide(_ctx(session, "0", "Prove Fermat's little theorem."))
    assert pinned.candidates[0] == "big-model" and pinned.details["sticky"] == "pinned"
    kept = await policy.decide(_ctx(session, "1", "ok"))
    assert kept.candidates[0] == "big-model" and kept.details["sticky"] == "kept"
    await proxy.cut()
    for _ in range(3):  # every request still gets a plan: the knob's own choice, said to be unsticky
        plan = await policy.decide(_ctx(session, "1", "ok"))
        assert plan.candidates[0] == "small-model"
        assert plan.details["sticky"] == "unavailable"
        assert "session store unavailable" in plan.reason
