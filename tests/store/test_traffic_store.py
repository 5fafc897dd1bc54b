"""The store's dashboard aggregate (``traffic``) on real SQLite and real PostgreSQL: served rows per
time bucket, route and model with errors, rejections, cost, tokens, latency and cache hits; a latency
histogram per bucket; shadow rows and rows before the window left out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from store import DecisionRecord, NullDecisionStore
from store.base import DecisionStore
from store.traffic_sql import LATENCY_BOUNDS_MS

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]
T0 = 1_700_000_000.0


async def test_traffic_aggregates_served_rows_per_bucket_route_and_model(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    def rec(i: int, at: float, **kw: object) -> DecisionRecord:
        fields: dict[str, object] = {"created_at": T0 + at, "model": "weak", "status": 200, "latency_ms": 30.0,
                                     "prompt_tokens": 11, "completion_tokens": 7, "cost_usd": 0.001}
        fields.update(kw)
        return make_record(i, **fields)

    await store.write_batch([
        rec(0, -5.0),                                               # before the window: left out
        rec(1, 1.0),
        rec(2, 2.0, model="strong", cost_usd=0.01, latency_ms=700.0),
        rec(3, 3.0, status=502, outcome="error", cost_usd=None, prompt_tokens=None, completion_tokens=None,
            latency_ms=None),
        rec(4, 4.0, status=403, model=None, cost_usd=None, prompt_tokens=None, completion_tokens=None),
        rec(5, 12.0, decision={"cache": {"hit": True, "result": "hit"}}, cost_usd=0.0),
        rec(6, 13.0, decision={"cache": {"hit": False, "result": "miss"}}),
        rec(9, 13.5, decision={"cache": {"hit": False, "result": "bypass", "reason": "endpoint"}}),
        rec(7, 14.0, route=None, requested_model="weak", outcome="stream_error", latency_ms=4000.0),
        rec(8, 14.5, request_id="req-000007:shadow:alt", shadow_of="req-000007", model="strong"),  # not traffic
    ])
    window = await store.traffic(T0, 10.0)
    assert window.since == T0 and window.bucket_seconds == 10.0
    got = {(b.bucket, b.route, b.model): b for b in window.buckets}
    assert set(got) == {(0, "auto", "weak"), (0, "auto", "strong"), (0, "auto", None), (1, "auto", "weak"),
                        (1, None, "weak")}
    weak0 = got[(0, "auto", "weak")]
    assert (weak0.requests, weak0.errors, weak0.rejected) == (2, 1, 0)
    assert weak0.cost_usd == pytest.approx(0.001)
    assert (weak0.prompt_tokens, weak0.completion_tokens, weak0.latency_requests) == (11, 7, 1)
    assert weak0.latency_sum_ms == pytest.approx(30.0)
    assert got[(0, "auto", "strong")].cost_usd == pytest.approx(0.01)
    assert (got[(0, "auto", None)].requests, got[(0, "auto", None)].rejected) == (1, 1)
    weak1 = got[(1, "auto", "weak")]
    assert (weak1.requests, weak1.cache_lookups, weak1.cache_hits) == (3, 2, 1)  # a bypass is no lookup
    assert weak0.cache_lookups == 0
    assert got[(1, None, "weak")].errors == 1  # a stream that broke after its 200
    # Latency histogram: bucket 0 has 30, 700 and 30 ms (the 403), bucket 1 has 30, 30, 30 and 4000 ms.
    def bin_of(ms: float) -> int:
        return next(i for i, bound in enumerate(LATENCY_BOUNDS_MS) if ms <= bound)

    hist = {(b.bucket, b.bin): b.count for b in window.latency}
    assert hist == {(0, bin_of(30)): 2, (0, bin_of(700)): 1, (1, bin_of(30)): 3, (1, bin_of(4000)): 1}


async def test_traffic_of_an_empty_window(store: DecisionStore, make_record: MakeRecord) -> None:
    await store.write_batch([make_record(1, created_at=T0)])
    window = await store.traffic(T0 + 60, 5.0)
    assert window.buckets == [] and window.latency == []
    with pytest.raises(ValueError):
        await store.traffic(T0, 0)


async def test_the_null_store_has_no_traffic() -> None:
    window = await NullDecisionStore().traffic(T0, 60.0)
    assert (window.since, window.bucket_seconds, window.buckets, window.latency) == (T0, 60.0, [], [])
