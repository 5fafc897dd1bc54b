"""Two gateway replicas sharing the real Redis and PostgreSQL: a key's rate limit and budget hold across
both (whichever replica serves the next request), every decision record (429s included) lands in the
one store, and the cost-quality knob's target-share window is one window for both."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis as redis_sync

from gateway.config import parse_config
from gateway.routing import RoutingBrain
from policies import RequestContext
from tests.blackbox.test_auto_routing import routing_config
from tests.experiments.test_two_replicas_postgres import query
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually
from tests.shared_state.conftest import REDIS_URL
from tests.shared_state.test_limits_gateway import KEYS, quota_config
from tests.store.conftest import sync_pg_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    with sync_pg_schema() as dsn:
        yield dsn


@pytest.fixture
def replicas(
    upstream: FakeUpstream, prefix: str, pg_dsn: str, tmp_path: Path
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    config = quota_config(upstream, {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix})
    config["store"] = {"kind": "postgres", "dsn": pg_dsn, "flush_interval": 0.05}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = GatewayProcess(config, tmp_path / "a").start(timeout=60)
    try:
        b = GatewayProcess(config, tmp_path / "b").start(timeout=60)
    except BaseException:
        a.terminate()
        raise
    yield a, b
    a.terminate()
    b.terminate()


def _ask(gateway: GatewayProcess, key: str, ids: list[str]) -> Any:
    sdk = openai.OpenAI(base_url=gateway.base_url, api_key=KEYS[key], max_retries=0, timeout=30)
    try:
        reply = sdk.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=16)
    except openai.APIStatusError as exc:
        ids.append(exc.response.headers["x-pointsman-request-id"])
        raise
    ids.append(reply.headers["x-pointsman-request-id"])
    return reply


def test_a_rate_limit_and_a_budget_hold_across_two_replicas_and_one_store(
    replicas: tuple[GatewayProcess, GatewayProcess], pg_dsn: str, prefix: str
) -> None:
    a, b = replicas
    ids: list[str] = []
    _ask(a, "rpm", ids)
    _ask(b, "rpm", ids)  # the second of 2 per minute, on the other replica
    for gateway in (a, b):
        with pytest.raises(openai.RateLimitError, match="API key 'rpm'"):
            _ask(gateway, "rpm", ids)

    served = 0
    with pytest.raises(openai.RateLimitError) as info:
        for i in range(10):  # $0.025 each, alternating replicas: the one $0.10 budget stops both
            _ask((a, b)[i % 2], "budget", ids)
            served += 1
            time.sleep(0.05)  # settlement is written after the answer (one more round trip)
    assert 2 <= served <= 4
    assert info.value.body["code"] == "budget_exceeded"  # type: ignore[index]

    client = redis_sync.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        day = time.strftime("%Y-%m-%d", time.gmtime())
        spent = int(client.get(f"{prefix}budget:budget:day:{day}") or 0) / 1e9
        assert 0.025 * served - 1e-9 <= spent <= 0.1  # settled to the real cost, never above the budget
    finally:
        client.close()

    eventually(lambda: len(query(pg_dsn, "SELECT request_id FROM decisions WHERE request_id = ANY($1::text[])", ids))
               == len(ids), "every decision record of both replicas in the one store", timeout=10)
    rows = query(pg_dsn, "SELECT status, error_type, tenant FROM decisions WHERE request_id = ANY($1::text[])", ids)
    assert sorted(r["status"] for r in rows).count(429) == 3
    assert {r["error_type"] for r in rows if r["status"] == 429} == {"rate_limit_exceeded", "budget_exceeded"}


def _ctx(text: str) -> RequestContext:
    return RequestContext(
        request_id=uuid.uuid4().hex, endpoint="chat.completions", route="auto",
        body={"model": "auto", "messages": [{"role": "user", "content": text}]}, headers={},
    )


@pytest.mark.timeout(120)
async def test_the_knob_window_is_shared_by_replicas(upstream: FakeUpstream, prefix: str) -> None:
    config = routing_config(upstream)
    route = config["routes"][0]  # type: ignore[index]
    route["cost_quality"] = {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                             "target_strong_share": 0.3, "min_samples": 5}
    route.pop("sticky")
    config["shared_state"] = {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "knob_sync_interval": 0.1}
    parsed = parse_config(config, env={})
    a, b = RoutingBrain(parsed), RoutingBrain(parsed)
    await a.start()
    await b.start()
    try:
        knob_a, knob_b = a.policies["auto"].knob, b.policies["auto"].knob  # type: ignore[attr-defined]
        assert knob_a.samples == knob_b.samples == 0
        for text in ("Prove Fermat's little theorem.", "hi", "What is 2+2?", "Write a haiku.", "Sort a list in C",
                     "Explain quantum entanglement rigorously.", "thanks"):
            await a.policies["auto"].decide(_ctx(text))
        for _ in range(100):  # replica B syncs every 0.1 s
            if knob_b.samples == 7:
                break
            await asyncio.sleep(0.05)
        assert knob_b.samples == 7, "replica B calibrates on the scores replica A observed"
        assert sorted(knob_b.scores()) == sorted(knob_a.scores())
        assert knob_b.threshold() == knob_a.threshold() and knob_b.threshold()[1] == "calibrated"
    finally:
        await a.close()
        await b.close()
