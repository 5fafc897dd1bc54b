"""What adaptive allocation learns from: a served request's outcome (explicit feedback first, then the
judge's score of the served model, then 0 for an implicit signal) and its cost, per arm; shadow rows and
client disconnects never count."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.experiments.monitor import aggregate_evidence, arm_evidence, request_outcome
from policies.experiments.allocation import ArmEvidence
from store.records import ArmOutcomes, ArmTotals, DecisionRecord, FeedbackRecord, LoggedRequest


def row(arm: str, *feedback: FeedbackRecord, cost: float | None = 0.001, **fields: Any) -> LoggedRequest:
    record = DecisionRecord(request_id=f"r-{id(feedback)}", created_at=0.0, endpoint="chat.completions",
                            route="auto", requested_model="auto", model="m", experiment="e", experiment_arm=arm,
                            cost_usd=cost, **fields)
    return LoggedRequest(record, None, list(feedback))


def fb(score: float, source: str = "user", metric: str = "quality", model: str = "") -> FeedbackRecord:
    return FeedbackRecord(request_id="r", score=score, metric=metric, source=source, model=model)


def test_the_outcome_of_a_served_answer() -> None:
    assert request_outcome(row("a", fb(1.0), fb(0.0, "rule"), fb(0.2, "judge", model="m")), "quality") == 0.5
    assert request_outcome(row("a", fb(0.2, "judge", model="m"), fb(0.9, "judge", model="other")), "quality") == 0.2
    assert request_outcome(row("a", fb(0.0, "implicit", metric="reask")), "quality") == 0.0
    assert request_outcome(row("a", fb(1.0, metric="helpfulness")), "quality") is None
    assert request_outcome(row("a"), "quality") is None


def test_evidence_per_arm_leaves_shadows_and_disconnects_out() -> None:
    rows = [
        row("a", fb(1.0)), row("a", fb(0.0), cost=0.003), row("a", cost=None),
        row("b", fb(0.5)), row("b", fb(1.0), shadow_of="x"), row("b", fb(1.0), outcome="client_disconnected"),
    ]
    evidence = arm_evidence(rows, "quality")
    a, b = evidence["a"], evidence["b"]
    assert (a.outcomes, a.quality_sum, a.cost_requests) == (2, 1.0, 2)
    assert a.mean_cost == pytest.approx(0.002)
    assert (b.outcomes, b.quality_sum, b.cost_requests) == (1, 0.5, 1)


def test_with_the_stores_totals_costs_are_theirs_and_rows_need_only_the_requests_with_feedback() -> None:
    # What a reallocation reads: the arms' cost sums from the store, the requests with feedback for outcomes.
    rows = [row("a", fb(1.0), cost=0.5), row("a", fb(0.0), cost=0.5), row("b", fb(1.0), shadow_of="x")]
    totals = {"a": ArmTotals("a", requests=10, cost_requests=9, cost_sum=0.02, cost_sq_sum=0.0001),
              "b": ArmTotals("b", requests=4, cost_requests=4, cost_sum=0.04, cost_sq_sum=0.0004)}
    evidence = arm_evidence(rows, "quality", totals)
    a, b = evidence["a"], evidence["b"]
    assert (a.outcomes, a.quality_sum) == (2, 1.0) and (b.outcomes, b.quality_sum) == (0, 0.0)
    assert (a.cost_requests, a.cost_sum, a.cost_sq_sum) == (9, 0.02, 0.0001)  # not the rows' 2 x 0.5
    assert (b.cost_requests, b.mean_cost) == (4, pytest.approx(0.01))  # an arm with no outcome yet has its costs


def test_the_stores_aggregates_make_the_same_evidence() -> None:
    # What a reallocation reads now: the arms' cost sums and outcome sums, both aggregated by the store.
    totals = {"a": ArmTotals("a", requests=10, cost_requests=9, cost_sum=0.02, cost_sq_sum=0.0001),
              "b": ArmTotals("b", requests=4, cost_requests=4, cost_sum=0.04, cost_sq_sum=0.0004)}
    outcomes = {"a": ArmOutcomes("a", outcomes=2, quality_sum=1.0), "c": ArmOutcomes("c", outcomes=1, quality_sum=0.5)}
    evidence = aggregate_evidence(totals, outcomes)
    assert evidence == {
        "a": ArmEvidence(2.0, 1.0, 9, 0.02, 0.0001),
        "b": ArmEvidence(0.0, 0.0, 4, 0.04, 0.0004),  # no outcome yet: its costs
        "c": ArmEvidence(1.0, 0.5, 0, 0.0, 0.0),  # feedback read after the totals: its outcomes
    }
    assert all(isinstance(e.outcomes, float) for e in evidence.values())  # as arm_evidence's (the seed reads them)
    rows = [row("a", fb(1.0), cost=0.5), row("a", fb(0.0), cost=0.5)]
    assert evidence["a"] == arm_evidence(rows, "quality", totals)["a"]
