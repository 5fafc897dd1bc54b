"""Session stickiness in the shared Redis, against what operators and hostile clients do: a session
outlives the deployment that pinned it, session ids are whatever a client sends."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.shared_state import RedisSessionStore, redis_client
from policies.sticky import SessionStoreUnavailable
from tests.blackbox.test_auto_routing import routing_config
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.shared_state.conftest import REDIS_URL


def _sticky_config(upstream: FakeUpstream, prefix: str, *, strong: str, threshold: float) -> dict[str, Any]:
    config = routing_config(upstream)
    config["shared_state"] = {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}
    config["backends"][0]["models"][1]["name"] = strong  # type: ignore[index]
    route = config["routes"][0]  # type: ignore[index]
    route["rules"] = []
    route["sticky"] = {"ttl": 600, "escalate": False}
    route["cost_quality"] = {"signal": "difficulty", "strong": strong, "weak": "small-model", "threshold": threshold}
    return config


def _chat(gateway: GatewayProcess, session: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": "Prove that there are infinitely many primes."}],
            "max_tokens": 8}
    return httpx.post(f"{gateway.base_url}/chat/completions", json=body,
                      headers={"x-pointsman-session-id": session}, timeout=30)


def test_a_session_pinned_to_a_model_the_new_config_removed_moves_to_a_served_model(
    upstream: FakeUpstream, prefix: str, tmp_path: Path
) -> None:
    session = uuid.uuid4().hex
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = GatewayProcess(_sticky_config(upstream, prefix, strong="big-model", threshold=0.0), tmp_path / "old")
    old.start(timeout=60)
    try:
        first = _chat(old, session)
        assert first.status_code == 200 and first.headers["x-pointsman-model"] == "big-model"
    finally:
        old.terminate()
    # The next deployment replaces big-model with bigger-model; the session is still pinned in Redis.
    new = GatewayProcess(_sticky_config(upstream, prefix, strong="bigger-model", threshold=1.0), tmp_path / "new")
    new.start(timeout=60)
    try:
        for _ in range(2):  # each turn renews the session: it must not stay on the removed model
            turn = _chat(new, session)
            assert turn.status_code == 200, turn.text
            assert turn.headers["x-pointsman-model"] == "small-model"
        explained = httpx.post(f"{new.base_url}/route", json={"model": "auto", "messages": [
            {"role": "user", "content": "Prove that there are infinitely many primes."}]},
            headers={"x-pointsman-session-id": session}, timeout=30).json()
        assert explained["sticky"]["state"] == "kept" and explained["model"] == "small-model"
    finally:
        new.terminate()


async def test_a_hung_redis_costs_the_session_store_one_timeout_per_second_not_one_per_request() -> None:
    """A Redis that accepts connections and never answers: after the first timed-out call the store skips
    Redis for a second (requests are decided without stickiness at once) instead of waiting again."""
    accepted: list[asyncio.StreamWriter] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = redis_client(f"redis://127.0.0.1:{port}/0", 0.2, decode=True)
    store = RedisSessionStore(client, "pointsman-test:", ttl=60)
    try:
        for i in range(5):
            with pytest.raises(SessionStoreUnavailable):
                await store.claim(f"auto\x00\x00id\x00s{i}", "small-model")
        assert len(accepted) == 1, "one connection attempt, then a second of skipping"
    finally:
        await client.aclose()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
