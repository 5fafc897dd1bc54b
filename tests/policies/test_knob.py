"""The cost-quality knob: fixed threshold, and a target share calibrated on recent scores."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from policies import CostQualityKnob
from policies.knob import distribution_seed
from tests.policies.helpers import build
from tests.policies.signals import request


def _stream(rng: random.Random, n: int, shift: float = 0.0) -> list[float]:
    """Skewed scores in [0, 1] (most requests easy), like a real difficulty head's output."""
    return [min(1.0, max(0.0, rng.betavariate(2, 5) + shift)) for _ in range(n)]


def test_fixed_threshold_is_inclusive() -> None:
    knob = CostQualityKnob(threshold=0.3)
    assert knob.decide(0.3).strong and not knob.decide(0.2999).strong
    assert knob.threshold() == (0.3, "config")
    assert CostQualityKnob().threshold() == (0.5, "config")


@pytest.mark.parametrize("target", [0.1, 0.3, 0.7])
def test_target_share_converges_on_a_score_stream(target: float) -> None:
    rng = random.Random(7)
    knob = CostQualityKnob(target_share=target, window=2000, min_samples=50)
    strong = []
    for score in _stream(rng, 12_000):
        strong.append(knob.decide(score).strong)
        knob.observe(score)
    share = sum(strong[-8000:]) / 8000
    assert share == pytest.approx(target, abs=0.02)
    assert knob.threshold()[1] == "calibrated"


def test_target_share_follows_a_shift_in_traffic() -> None:
    rng = random.Random(11)
    knob = CostQualityKnob(target_share=0.3, window=1000, min_samples=50)
    before = _stream(rng, 3000)
    for score in before:
        knob.observe(score)
    threshold_before = knob.threshold()[0]
    after = _stream(rng, 6000, shift=0.25)  # traffic gets harder
    strong = []
    for score in after:
        strong.append(knob.decide(score).strong)
        knob.observe(score)
    assert knob.threshold()[0] > threshold_before + 0.15
    assert sum(strong[-4000:]) / 4000 == pytest.approx(0.3, abs=0.03)


def test_historic_scores_seed_the_calibration() -> None:
    rng = random.Random(3)
    history = _stream(rng, 2000)
    knob = CostQualityKnob(target_share=0.2, window=2000, seed=history)
    assert knob.samples == 2000 and knob.threshold()[1] == "calibrated"
    fresh = _stream(rng, 5000)
    share = sum(knob.decide(s).strong for s in fresh) / len(fresh)  # no observing: the seed alone
    assert share == pytest.approx(0.2, abs=0.03)  # quantile of 2000 samples: sd about 0.01


def test_uncalibrated_threshold_until_min_samples() -> None:
    knob = CostQualityKnob(target_share=0.25, min_samples=10)
    for score in [0.9] * 9:
        knob.observe(score)
    assert knob.threshold() == (0.75, "uncalibrated")
    knob.observe(0.9)
    assert knob.threshold()[1] == "calibrated"


def test_extreme_targets() -> None:
    scores = [i / 100 for i in range(100)]
    never = CostQualityKnob(target_share=0.0, min_samples=1, seed=scores)
    always = CostQualityKnob(target_share=1.0, min_samples=1, seed=scores)
    assert not any(never.decide(s).strong for s in scores)
    assert all(always.decide(s).strong for s in scores)


def test_window_forgets_old_scores() -> None:
    knob = CostQualityKnob(target_share=0.5, window=100, min_samples=1, seed=[0.1] * 100)
    for _ in range(100):
        knob.observe(0.8)
    assert knob.samples == 100
    assert knob.threshold()[0] == pytest.approx(0.8)


async def test_policy_calibrates_from_the_traffic_it_decides() -> None:
    policy, _ = build("""
name: auto
policy: rules
cost_quality: {strong: big, weak: small, target_strong_share: 0.25, window: 400, min_samples: 20}
""")
    rng = random.Random(5)
    chosen = []
    for score in _stream(rng, 1600):
        plan = await policy.decide(request(f"question [d={score:.4f}]"))
        chosen.append(plan.candidates[0])
    assert chosen[-1000:].count("big") / 1000 == pytest.approx(0.25, abs=0.04)
    assert plan.details["threshold_source"] == "calibrated"


async def test_policy_seeded_with_historic_scores() -> None:
    rng = random.Random(9)
    policy, _ = build(
        "name: auto\npolicy: rules\ncost_quality: {strong: big, weak: small, target_strong_share: 0.5}\n",
        historic_scores=_stream(rng, 500),
    )
    plan = await policy.decide(request("q [d=0.95]"))
    assert plan.candidates == ("big",) and plan.details["threshold_source"] == "calibrated"
    assert 0.15 < plan.details["threshold"] < 0.45  # the median of Beta(2, 5) is about 0.26


def test_a_distribution_seed_follows_the_recorded_quantiles() -> None:
    quantiles = [0.0, 0.1, 0.2, 0.9, 1.0]  # a quarter of the mass per step
    seed = distribution_seed(quantiles, 100)
    assert len(seed) == 100 and seed == sorted(seed)
    knob = CostQualityKnob(target_share=0.25, min_samples=50, seed=seed)
    threshold, source = knob.threshold()
    assert source == "calibrated" and threshold == pytest.approx(0.9, abs=0.01)  # the top quarter: above 0.9
    assert distribution_seed([0.5, 0.4], 10) == []  # not a quantile list: no seed rather than a wrong one
    assert distribution_seed([0.1, float("nan")], 10) == [] and distribution_seed([0.3], 10) == []


def test_identical_scores_straddling_the_cut_split_to_the_target_share() -> None:
    """Many identical prompts (one score, repeated): they must split, not all go strong (or weak)."""
    rng = random.Random(13)
    knob = CostQualityKnob(target_share=0.3, window=2000, min_samples=50)
    strong = []
    for i in range(12_000):
        score = 0.3 if i % 2 else _stream(rng, 1)[0]  # half the traffic is one prompt; Beta(2, 5) median ~0.26
        strong.append(knob.decide(score, draw=rng.random()).strong)
        knob.observe(score)
    assert sum(strong[-8000:]) / 8000 == pytest.approx(0.3, abs=0.03)
    decision = knob.decide(0.3, draw=0.0)
    assert decision.threshold == 0.3 and decision.tie_share is not None and 0.0 < decision.tie_share < 1.0
    assert not knob.decide(0.3, draw=0.999).strong and knob.decide(0.31, draw=0.999).strong


def test_a_window_of_one_repeated_score_still_gives_the_target_share() -> None:
    knob = CostQualityKnob(target_share=0.3, min_samples=10, seed=[0.42] * 1000)
    rng = random.Random(2)
    share = sum(knob.decide(0.42, draw=rng.random()).strong for _ in range(4000)) / 4000
    assert share == pytest.approx(0.3, abs=0.03)
    assert knob.decide(0.42, override=0.42).strong  # an override is a plain threshold: no tie split


async def test_policy_splits_identical_prompts_by_request_id() -> None:
    policy, _ = build("""
name: auto
policy: rules
cost_quality: {strong: big, weak: small, target_strong_share: 0.25, window: 400, min_samples: 20}
""")
    chosen = []
    for i in range(1200):
        plan = await policy.decide(replace(request("the same question [d=0.5000]"), request_id=f"r{i}"))
        chosen.append(plan.candidates[0])
    assert chosen[-800:].count("big") / 800 == pytest.approx(0.25, abs=0.05)
    assert plan.details["threshold_source"] == "calibrated" and 0.0 < plan.details["tie_share"] < 1.0
    again = await policy.explain(replace(request("the same question [d=0.5000]"), request_id="r1199"))
    assert again["model"] == chosen[-1]  # the split is fixed per request id: replays and /v1/route agree

