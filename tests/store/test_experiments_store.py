"""The store's experiment contract on real SQLite and real PostgreSQL: registered experiments, arm
stops every replica reads (first stop wins), sticky assignments (first writer wins), per-arm totals
and latencies over served rows only, and an experiment's rows with their feedback for the report."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from gateway.experiments.monitor import aggregate_evidence, arm_evidence
from policies.experiments.allocation import ThompsonAllocator
from store import DecisionRecord, FeedbackRecord
from store.base import DecisionStore
from store.postgres import PostgresDecisionStore
from tests.store.conftest import pg_schema

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]
SPEC: dict[str, Any] = {
    "arms": [{"name": "control", "weight": 0.5, "control": True, "shadow": False},
             {"name": "v2", "weight": 0.5, "control": False, "shadow": False}],
    "key": "user", "paused": False,
}


async def test_register_fetch_and_replace_an_experiment(store: DecisionStore) -> None:
    assert await store.fetch_experiment("exp") is None
    await store.register_experiment("exp", "auto", SPEC)
    row = await store.fetch_experiment("exp")
    assert row is not None and row.route == "auto" and row.spec == SPEC and row.updated_at > 0
    await store.register_experiment("exp", "auto", {**SPEC, "paused": True})  # a replica restarted with a pause
    await store.register_experiment("other", "cheap", {"arms": []})
    listed = await store.list_experiments()
    assert [r.name for r in listed] == ["exp", "other"] and listed[0].spec["paused"] is True


async def test_the_first_stop_of_an_arm_is_kept_and_an_operator_can_resume_it(store: DecisionStore) -> None:
    assert await store.stop_arm("exp", "v2", "error_rate", {"lower": 0.04}, "replica-a", 100.0) is True
    assert await store.stop_arm("exp", "v2", "cost", {"ratio": 1.5}, "replica-b", 101.0) is False
    await store.stop_arm("other", "x", "latency_p95", {}, None, 99.0)
    [stop] = await store.experiment_stops("exp")
    assert (stop.arm, stop.reason, stop.detail, stop.replica, stop.stopped_at) == (
        "v2", "error_rate", {"lower": 0.04}, "replica-a", 100.0)
    assert [s.experiment for s in await store.experiment_stops()] == ["other", "exp"]  # oldest first
    assert await store.resume_arm("exp", "v2") is True and await store.resume_arm("exp", "v2") is False
    assert await store.experiment_stops("exp") == []


async def test_assignments_are_sticky_and_the_first_writer_wins(store: DecisionStore) -> None:
    assert await store.get_assignment("exp", "k1") is None
    assert await store.put_assignment("exp", "k1", "v2", 0.3, 1.0) == ("v2", 0.3)
    assert await store.put_assignment("exp", "k1", "control", 0.7, 2.0) == ("v2", 0.3)  # kept
    assert await store.get_assignment("exp", "k1") == ("v2", 0.3)
    assert await store.get_assignment("other", "k1") is None  # per experiment
    # Racing writers for one new key all come back with the same arm.
    arms = await asyncio.gather(*(store.put_assignment("exp", "k2", f"arm{i}", None, 3.0) for i in range(8)))
    assert len(set(arms)) == 1


async def test_totals_and_latencies_count_served_rows_of_every_replica(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    rows = [
        make_record(1, experiment="exp", experiment_arm="control", status=200, cost_usd=0.01, latency_ms=100.0,
                    replica="a"),
        make_record(2, experiment="exp", experiment_arm="control", status=502, outcome="error", cost_usd=None,
                    latency_ms=50.0, replica="b"),
        make_record(3, experiment="exp", experiment_arm="v2", status=200, outcome="stream_error", cost_usd=0.03,
                    latency_ms=300.0, replica="b"),
        make_record(4, experiment="exp", experiment_arm="v2", status=200, cost_usd=0.01, latency_ms=200.0),
        # not served traffic of the experiment: a client that left, a shadow decision, another experiment
        make_record(5, experiment="exp", experiment_arm="v2", status=499, outcome="client_disconnected"),
        make_record(6, request_id="req-000004:shadow:s", experiment="exp", experiment_arm="s",
                    shadow_of="req-000004", outcome="shadow"),
        make_record(7, experiment="other", experiment_arm="v2", status=500, outcome="error"),
        make_record(8, experiment_arm=None),
    ]
    await store.write_batch(rows)
    totals = await store.experiment_totals("exp")
    assert set(totals) == {"control", "v2"}
    control, v2 = totals["control"], totals["v2"]
    assert (control.requests, control.errors, control.cost_requests) == (2, 1, 1)
    assert control.cost_sum == pytest.approx(0.01) and control.cost_sq_sum == pytest.approx(0.0001)
    assert (v2.requests, v2.errors, v2.cost_requests, v2.latency_requests) == (2, 1, 2, 2)
    assert v2.cost_sum == pytest.approx(0.04) and v2.cost_sq_sum == pytest.approx(0.001)
    assert set(await store.experiment_totals("exp", since=1_700_000_003.0)) == {"v2"}
    latencies = await store.experiment_latencies("exp", since=1_700_000_002.0)
    assert {arm: sorted(v) for arm, v in latencies.items()} == {"control": [50.0], "v2": [200.0, 300.0]}


async def test_experiment_requests_hold_served_and_shadow_rows_with_feedback(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    await store.write_batch([
        make_record(1, experiment="exp", experiment_arm="control", arm_propensity=0.5, compared=True),
        make_record(2, request_id="req-000001:shadow:s", experiment="exp", experiment_arm="s",
                    shadow_of="req-000001", outcome="shadow"),
        make_record(3, experiment="other", experiment_arm="control"),
    ])
    await store.write_feedback([
        FeedbackRecord("req-000001", 1.0, source="user", created_at=5.0),
        FeedbackRecord("req-000001", 0.5, source="judge", model="", created_at=5.0),
        FeedbackRecord("req-000003", 0.0, created_at=5.0),
    ])
    logged = await store.experiment_requests("exp")
    assert [r.record.request_id for r in logged] == ["req-000001", "req-000001:shadow:s"]
    served, shadow = logged
    assert served.record.compared is True and served.record.arm_propensity == 0.5
    assert sorted((f.source, f.score) for f in served.feedback) == [("judge", 0.5), ("user", 1.0)]
    assert shadow.record.shadow_of == "req-000001" and shadow.feedback == []
    assert [r.record.request_id for r in await store.experiment_requests("exp", since=1_700_000_002.0)] == [
        "req-000001:shadow:s"]
    # A reallocation reads only the requests with feedback (its costs come from experiment_totals).
    assert await store.experiment_requests("exp", with_feedback=True) == [served]
    assert await store.experiment_requests("exp", since=1_700_000_002.0, with_feedback=True) == []


async def test_experiment_rows_leave_the_signals_reason_and_error_unread(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    # Most of a row, and no experiment read uses them: a 500,000-request experiment took 2.9 GB to read.
    signals = {"difficulty": {"value": 0.7, "detail": {"head": "logreg"}}, "pii": {"value": []}}
    decision = {"policy": "rules", "candidates": ["big"], "experiment": {"unit": "ab12"}, "cache": {"hit": False}}
    await store.write_batch([make_record(1, experiment="exp", experiment_arm="control", signals=signals,
                                         decision=decision, reason="why", error_message="boom", status=502)])
    [item] = await store.experiment_requests("exp")
    record = item.record
    assert (record.signals, record.reason, record.error_message) == ({}, "", None)
    assert record.decision == decision and record.status == 502  # what reports read is all there
    full = await store.fetch("req-000001")
    assert full is not None and (full.signals, full.reason, full.error_message) == (signals, "why", "boom")


def _experiment_with_feedback(
    make_record: MakeRecord, seed: int, *, dyadic: bool
) -> tuple[list[DecisionRecord], list[FeedbackRecord]]:
    """An adaptive experiment's rows (served on three arms, with and without a model or a cost, shadows,
    client disconnects, another experiment's rows) and every kind of feedback the outcome reads: explicit
    rows of each source, about the served model or "", judge rows, implicit failures (and an implicit row
    at 1, which is no failure), a comparison's rows about another model, other metrics, scores outside
    [0, 1]. With ``dyadic``, every score and cost is a multiple of a power of two and no request has three
    explicit rows: every sum is exact, whatever order it is added in."""
    rng = random.Random(seed)
    grid = [0.0, 0.125, 0.25, 0.5, 0.75, 1.0]

    def score() -> float:
        return rng.choice(grid) if dyadic else round(rng.random(), 6)

    records: list[DecisionRecord] = []
    feedback: list[FeedbackRecord] = []
    for i in range(1, 241):
        arm = ("control", "v2", "v3")[i % 3]
        model = None if i % 17 == 0 else f"m-{arm}"
        fields: dict[str, Any] = {"experiment": "exp", "experiment_arm": arm, "model": model}
        if i % 23 == 0:
            fields.update(status=499, outcome="client_disconnected")
        if i % 29 == 0:
            fields["experiment"] = "other"
        cost = (rng.randrange(1, 64) / 1024 if dyadic else rng.uniform(1e-4, 1e-2)) if i % 7 else None
        records.append(make_record(i, cost_usd=cost, **fields))
        rid = f"req-{i:06d}"
        if i % 11 == 0:
            records.append(make_record(1000 + i, request_id=f"{rid}:shadow:s", experiment="exp", experiment_arm="s",
                                       shadow_of=rid, outcome="shadow", model="m-s"))
            feedback.append(FeedbackRecord(f"{rid}:shadow:s", 1.0, source="judge", model="m-s"))
        served = model or ""
        combos = [(source, about) for source in ("user", "rule", "import") for about in {"", served}]
        kind = rng.random()
        if kind < 0.45:  # explicit: 1, 2 or (dyadic: 4, else up to 6) rows
            n = rng.choice([1, 2, 4] if dyadic else [1, 2, 3, 4, 5, 6])
            for source, about in rng.sample(combos, min(n, len(combos))):
                feedback.append(FeedbackRecord(rid, score(), source=source, model=about))
        if rng.random() < 0.3:  # the judge's score(s) of the served answer
            for about in rng.sample(sorted({"", served}), rng.choice([1, 2]) if served else 1):
                feedback.append(FeedbackRecord(rid, score(), source="judge", model=about))
        if rng.random() < 0.2:  # the gateway's implicit failure (or a 1, which is none)
            feedback.append(FeedbackRecord(rid, rng.choice([0.0, 1.0]), metric=rng.choice(["reask", "helpful"]),
                                           source="implicit", model=rng.choice(["", served])))
        if rng.random() < 0.2:  # a comparison's rows about another model: not about the served answer
            feedback.append(FeedbackRecord(rid, score(), source="judge", model="m-rival"))
            feedback.append(FeedbackRecord(rid, score(), source="user", model="m-rival"))
        if rng.random() < 0.2:  # another metric
            feedback.append(FeedbackRecord(rid, score(), metric="helpful", source=rng.choice(["user", "judge"]),
                                           model=rng.choice(["", served])))
        if rng.random() < 0.03:  # out of range: clamped
            feedback.append(FeedbackRecord(rid, rng.choice([-0.5, 1.5]), source="import", model=served))
    return records, feedback


@pytest.mark.parametrize("dyadic", [True, False], ids=["exact-sums", "any-scores"])
async def test_the_stores_outcome_aggregates_are_the_evidence_every_row_gives(
    store: DecisionStore, make_record: MakeRecord, dyadic: bool
) -> None:
    # What a reallocation reads (no request crosses into Python) against the evidence of every served
    # request's row and feedback, combined per request in Python as before.
    records, feedback = _experiment_with_feedback(make_record, seed=7, dyadic=dyadic)
    await store.write_batch(records)
    await store.write_feedback(feedback)
    allocator = ThompsonAllocator(["control", "v2", "v3"], "control", lam=0.5, draws=2000, salt="exp")
    for metric in ("quality", "helpful", "reask", "unrated"):
        for since in (None, 1_700_000_100.0):
            rows = await store.experiment_requests("exp", since=since)
            by_rows = arm_evidence(rows, metric)
            totals = await store.experiment_totals("exp", since=since)
            by_sql = aggregate_evidence(totals, await store.experiment_outcomes("exp", metric, since=since))
            assert set(by_sql) == set(by_rows) == {"control", "v2", "v3"}
            if dyadic:
                assert by_sql == by_rows, (metric, since)
            else:  # the same sums, added in another order: equal to the last bits
                for arm, expected in by_rows.items():
                    got = by_sql[arm]
                    assert (got.outcomes, got.cost_requests) == (expected.outcomes, expected.cost_requests)
                    for field in ("quality_sum", "cost_sum", "cost_sq_sum"):
                        assert getattr(got, field) == pytest.approx(getattr(expected, field), rel=1e-12, abs=1e-15)
            assert allocator.propensities(by_sql) == allocator.propensities(by_rows), (metric, since)
    quality = await store.experiment_outcomes("exp", "quality")
    assert all(o.outcomes > 20 for o in quality.values())  # the data exercises the outcome
    assert await store.experiment_outcomes("nothing", "quality") == {}


@pytest.mark.postgres
async def test_two_replicas_see_one_stop_and_one_assignment() -> None:
    """Two stores on one PostgreSQL database, as two gateway replicas have."""
    async with pg_schema() as dsn:
        a, b = PostgresDecisionStore(dsn), PostgresDecisionStore(dsn)
        await asyncio.gather(a.open(), b.open())
        try:
            results = await asyncio.gather(
                a.stop_arm("exp", "v2", "error_rate", {}, "a", 1.0), b.stop_arm("exp", "v2", "cost", {}, "b", 1.0)
            )
            assert sorted(results) == [False, True]
            [stop_a], [stop_b] = await a.experiment_stops("exp"), await b.experiment_stops("exp")
            assert stop_a == stop_b
            put = await asyncio.gather(a.put_assignment("exp", "k", "control", None, 1.0),
                                       b.put_assignment("exp", "k", "v2", None, 1.0))
            assert put[0] == put[1]
        finally:
            await asyncio.gather(a.close(), b.close())
