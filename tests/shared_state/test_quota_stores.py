"""The quota store contract, run against both implementations: in memory and the real Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.quota import Bucket, Correction, MemoryQuotaStore, QuotaStore, QuotaUnavailable, RedisQuotaStore, Spend
from gateway.quota._types import NANO, WINDOW_MS
from tests.fakes.upstream import free_port
from tests.shared_state.conftest import REDIS_URL


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[tuple[QuotaStore, str]]:
    if request.param == "memory":
        yield MemoryQuotaStore(), prefix
        return
    client = aredis.Redis.from_url(REDIS_URL, socket_timeout=0.25, decode_responses=True)
    yield RedisQuotaStore(client), prefix
    await client.aclose()


def _spend(key: str, usd: float, cost: float) -> Spend:
    return Spend(key, round(usd * NANO), round(cost * NANO), 3600, "day", time.time() + 3600, "API key 'k'")


async def test_requests_per_minute_allow_a_minute_burst_then_refuse_with_retry_after(
    store: tuple[QuotaStore, str],
) -> None:
    quotas, prefix = store
    bucket = Bucket(prefix + "req", 3, 1, "requests", "API key 'k'")
    answers = [await quotas.reserve([bucket], []) for _ in range(4)]
    assert [a.allowed for a in answers] == [True, True, True, False]
    assert [a.remaining[0][0] for a in answers[:3]] == [2, 1, 0]
    refused = answers[3]
    assert refused.refused == 0
    assert 0 < refused.retry_after_ms <= 20_000  # one request frees every 60/3 s


async def test_a_refusal_says_how_far_past_the_window_the_request_would_reach(store: tuple[QuotaStore, str]) -> None:
    # The 429's x-ratelimit-reset is derived from this (gateway/quota/quotas.py): retry_after is the
    # bucket's TAT plus the refused request's own interval, less now and the window; so TAT - now (when
    # the bucket is full again) is retry_after + window - interval, within the window.
    quotas, prefix = store
    bucket = Bucket(prefix + "req", 3, 1, "requests", "API key 'k'")
    for _ in range(3):
        assert (await quotas.reserve([bucket], [])).allowed
    refused = await quotas.reserve([bucket], [])
    assert not refused.allowed
    full_again_ms = refused.retry_after_ms + WINDOW_MS - bucket.interval_ms * bucket.cost
    assert 55_000 < full_again_ms <= WINDOW_MS


async def test_tokens_are_reserved_then_settled_with_the_real_usage(store: tuple[QuotaStore, str]) -> None:
    quotas, prefix = store
    tokens = Bucket(prefix + "tok", 1000, 600, "tokens", "API key 'k'")
    assert (await quotas.reserve([tokens], [])).allowed
    assert not (await quotas.reserve([tokens], [])).allowed  # 600 + 600 > 1000
    await quotas.settle([Correction(tokens.key, tokens.interval_ms, 100 - 600)], [])  # it used 100
    assert (await quotas.reserve([tokens], [])).allowed  # 100 + 600 <= 1000


async def test_a_budget_refuses_what_does_not_fit_and_a_release_gives_it_back(store: tuple[QuotaStore, str]) -> None:
    quotas, prefix = store
    key = prefix + "budget:k:day:x"
    assert (await quotas.reserve([], [_spend(key, 1.0, 0.6)])).allowed
    refused = await quotas.reserve([], [_spend(key, 1.0, 0.6)])
    assert not refused.allowed and refused.refused == 0
    assert refused.spent_nano == round(0.6 * NANO)
    assert 3_000_000 < refused.retry_after_ms <= 3_600_000  # the period's end
    await quotas.settle([], [(key, -round(0.6 * NANO))])  # the call failed: released
    assert (await quotas.reserve([], [_spend(key, 1.0, 0.6)])).allowed


async def test_a_refusal_takes_nothing_from_the_other_limits(store: tuple[QuotaStore, str]) -> None:
    quotas, prefix = store
    requests = Bucket(prefix + "req", 10, 1, "requests", "API key 'k'")
    key = prefix + "budget:k:day:y"
    assert not (await quotas.reserve([requests], [_spend(key, 1.0, 2.0)])).allowed
    for _ in range(10):  # the refused request took none of the 10 requests
        assert (await quotas.reserve([requests], [])).allowed


async def test_redis_unreachable_is_quota_unavailable_quickly() -> None:
    client = aredis.Redis(port=free_port(), socket_timeout=0.25, socket_connect_timeout=0.25,
                          retry=Retry(NoBackoff(), 0))  # as SharedState opens it
    store = RedisQuotaStore(client)
    bucket = Bucket("x:req", 10, 1, "requests", "API key 'k'")
    started = time.monotonic()
    with pytest.raises(QuotaUnavailable):
        await store.reserve([bucket], [])
    with pytest.raises(QuotaUnavailable, match="skipped"):  # fails fast while Redis is known down
        await store.reserve([bucket], [])
    assert time.monotonic() - started < 1.0
    await client.aclose()


async def test_tokens_used_past_the_reservation_are_charged_even_after_the_bucket_drained() -> None:
    # A long call on a busy gateway: its bucket drains while it runs and the store sweeps drained buckets
    # away; the settlement must still charge what the call used beyond its reservation (Redis does: a
    # bucket that expired meanwhile starts again from now).
    now = [1_000_000.0]
    store = MemoryQuotaStore(clock=lambda: now[0])
    tokens = Bucket("tok", 600, 100, "tokens", "API key 'k'")  # 100 ms a token
    assert (await store.reserve([tokens], [])).allowed
    now[0] += 30.0  # the call streams for 30 s; the bucket is full again after 10
    for i in range(5000):  # other keys' traffic meanwhile: the store sweeps drained buckets every few thousand
        await store.reserve([Bucket(f"other-{i}", 600, 1, "requests", "API key 'o'")], [])
    await store.settle([Correction(tokens.key, tokens.interval_ms, 650 - 100)], [])  # it used 650 tokens
    refused = await store.reserve([tokens], [])  # the minute's 600 are spent: nothing fits now
    assert not refused.allowed and refused.refused == 0
