"""The store contract, run against real SQLite and real PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from store import COLUMNS, DecisionRecord, SubCallRecord
from store.base import DecisionStore

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]


def full_record() -> DecisionRecord:
    """A record with every field set to a non-default value."""
    return DecisionRecord(
        request_id="req-full",
        created_at=1_733_000_000.123456,
        endpoint="chat.completions",
        route="auto",
        requested_model="auto",
        tenant="acme",
        stream=True,
        signals={
            "domain": "math",
            "p_strong": 0.8125,
            "keywords": ["integral", "proof"],
            "nested": {"pii": False, "lang": "de", "n": 3, "none": None},
            "unicode": "Grüße, 世界 🚦",
        },
        decision={
            "policy": "threshold",
            "candidates": [{"model": "big", "utility": 0.9}, {"model": "small", "utility": 0.4}],
            "plan": "single",
        },
        reason="p_strong 0.81 >= threshold 0.5",
        model="big-model",
        backend="vllm-a",
        replica="http://10.0.0.5:8000",
        status=200,
        outcome="stream_error",
        error_type="upstream_error",
        error_message="upstream closed the stream",
        attempts=3,
        latency_ms=1234.5,
        ttft_ms=87.25,
        overhead_ms=1.75,
        prompt_tokens=512,
        completion_tokens=64,
        cost_usd=0.000123,
        experiment_arm="B",
        experiment="router-v2",
        shadow_of="req-served",
        arm_propensity=0.25,
        compared=True,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        router_version="v0003-abc123",
        propensity=0.85,
        workflow={"kind": "cascade", "name": "fast", "escalated": True, "steps": [{"index": 0, "confidence": 0.6}],
                  "capped": None, "cost_usd": 0.0001},
    )


async def test_every_field_round_trips(store: DecisionStore) -> None:
    rec = full_record()
    # Guard the test itself: a field added to the record must be given a value here.
    defaults = DecisionRecord(request_id="x", created_at=0.0, endpoint="", route=None, requested_model=None)
    unset = [n for n in COLUMNS if n not in ("request_id",) and getattr(rec, n) == getattr(defaults, n)]
    assert unset == [], f"full_record() leaves fields at their defaults: {unset}"

    await store.write_batch([rec])
    got = await store.fetch("req-full")
    assert got == rec
    assert isinstance(got.stream, bool)
    assert isinstance(got.signals, dict) and isinstance(got.decision, dict)


async def test_none_and_empty_values_round_trip(store: DecisionStore) -> None:
    rec = DecisionRecord(
        request_id="req-minimal",
        created_at=1_733_000_000.0,
        endpoint="embeddings",
        route=None,
        requested_model=None,
    )
    await store.write_batch([rec])
    got = await store.fetch("req-minimal")
    assert got == rec
    assert got.signals == {} and got.decision == {}
    assert got.model is None and got.latency_ms is None and got.cost_usd is None
    assert got.workflow is None  # a request one model answered has no workflow tree (NULL, not {})
    assert await store.fetch_subcalls("req-minimal") == []


async def test_subcalls_are_written_with_their_decision(store: DecisionStore, make_record: MakeRecord) -> None:
    calls = [
        SubCallRecord(request_id="req-000001", index=0, workflow="fast", step="cheap", model="small", backend="b",
                      status=200, prompt_tokens=11, completion_tokens=7, cost_usd=2.5e-05, latency_ms=12.5,
                      confidence=0.62, outcome="ok", created_at=1_700_000_001.0, tenant="acme"),
        SubCallRecord(request_id="req-000001", index=1, workflow="fast", step="strong", model="big", status=502,
                      latency_ms=30.0, outcome="error", error="upstream failed", created_at=1_700_000_001.0,
                      tenant="acme"),
    ]
    record = make_record(1, tenant="acme", workflow={"kind": "cascade", "name": "fast"}, subcalls=calls)
    await store.write_batch([record, make_record(2, tenant="acme")])
    await store.write_batch([record])  # a retried batch writes no sub-call twice
    assert await store.fetch_subcalls("req-000001") == calls
    got = await store.fetch("req-000001")
    assert got is not None and got.workflow == {"kind": "cascade", "name": "fast"} and not got.subcalls
    assert await store.forget(request_id="req-000001") == {
        "decisions": 1, "feedback": 0, "conversations": 0, "subcalls": 2}
    assert await store.fetch_subcalls("req-000001") == []


async def test_fetch_unknown_id_is_none(store: DecisionStore) -> None:
    assert await store.fetch("no-such-request") is None
    assert await store.count() == 0


async def test_large_batch_is_written_whole(store: DecisionStore, make_record: MakeRecord) -> None:
    records = [make_record(i, signals={"i": i}, tenant=f"t{i % 7}") for i in range(5000)]
    await store.write_batch(records)
    assert await store.count() == 5000
    got = await store.fetch("req-004321")
    assert got is not None and got.signals == {"i": 4321} and got.tenant == "t2"


async def test_duplicate_request_id_is_ignored(store: DecisionStore, make_record: MakeRecord) -> None:
    first = make_record(1, model="first")
    await store.write_batch([first, make_record(2)])
    # A retried batch (and a duplicate inside one batch) must neither fail nor overwrite.
    await store.write_batch([make_record(1, model="second"), make_record(2), make_record(3)])
    await store.write_batch([make_record(4), make_record(4, model="dup-in-batch")])
    assert await store.count() == 4
    got = await store.fetch("req-000001")
    assert got is not None and got.model == "first"
    got4 = await store.fetch("req-000004")
    assert got4 is not None and got4.model is None


async def test_empty_batch_is_a_no_op(store: DecisionStore) -> None:
    await store.write_batch([])
    assert await store.count() == 0


async def test_recent_is_newest_first_and_limited(store: DecisionStore, make_record: MakeRecord) -> None:
    await store.write_batch([make_record(i) for i in (5, 1, 9, 3, 7)])
    recent = await store.recent(limit=3)
    assert [r.request_id for r in recent] == ["req-000009", "req-000007", "req-000005"]
    assert len(await store.recent()) == 5


class Opaque:
    def __str__(self) -> str:
        return "<opaque>"


async def test_awkward_values_are_stored_not_refused(store: DecisionStore, make_record: MakeRecord) -> None:
    """Values a strict database would refuse must not make a batch fail (it would be retried for
    ever): NaN in signals, NUL characters, tuples, non-string keys, floats in int columns."""
    rec = make_record(
        1,
        signals={"nan": math.nan, "inf": math.inf, 3: (1, 2), "nul": "a\x00b", "obj": Opaque()},
        error_message="bad\x00byte",
        prompt_tokens=12.0,
        latency_ms=5,
        ttft_ms=math.nan,
    )
    await store.write_batch([rec, make_record(2)])
    assert await store.count() == 2
    got = await store.fetch("req-000001")
    assert got is not None
    assert got.signals["nan"] is None and got.signals["inf"] is None
    assert got.signals["3"] == [1, 2]
    assert got.signals["nul"] in ("ab", "a\x00b")
    assert got.error_message in ("badbyte", "bad\x00byte")
    assert got.prompt_tokens == 12 and isinstance(got.prompt_tokens, int)
    assert got.signals["obj"] == "<opaque>"
    assert got.latency_ms == 5.0
    assert got.ttft_ms is None


async def test_open_and_close_are_idempotent(store: DecisionStore, make_record: MakeRecord) -> None:
    await store.open()
    await store.write_batch([make_record(1)])
    assert await store.count() == 1
