"""RouteLLM's routing metrics on tiny cases computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evals.metrics import (
    CurvePoint,
    apgr,
    cost_at_quality,
    cpt,
    evaluate_scores,
    oracle_curve,
    oracle_quality,
    pgr,
    quality_at_cost,
    routing_curve,
    sweep_counts,
)

# Four prompts. The strong model is right on 0, 2, 3; the weak one only on 0.
# Always-strong quality 0.75, always-weak 0.25.
SCORES = np.array([0.1, 0.2, 0.3, 0.4])
STRONG = np.array([1.0, 0.0, 1.0, 1.0])
WEAK = np.array([1.0, 0.0, 0.0, 0.0])


def test_pgr_is_share_of_the_gap() -> None:
    assert pgr(0.5, strong=0.75, weak=0.25) == pytest.approx(0.5)
    assert pgr(0.25, strong=0.75, weak=0.25) == 0.0
    assert pgr(0.75, strong=0.75, weak=0.25) == 1.0


def test_curve_uses_qcut_edges_and_a_strict_last_threshold() -> None:
    # Two bins: edges at quantiles 0, 0.5, 1 -> 0.1, 0.25, 0.4. ">=" for the first two, ">" for the last.
    curve = routing_curve(SCORES, STRONG, WEAK, num_results=2)
    assert [p.threshold for p in curve] == pytest.approx([0.1, 0.25, 0.4])
    assert [p.strong_share for p in curve] == pytest.approx([1.0, 0.5, 0.0])
    # Half strong: prompts 2 and 3 go strong (1 + 1), 0 and 1 stay weak (1 + 0) -> 3/4.
    assert [p.quality for p in curve] == pytest.approx([0.75, 0.75, 0.25])


def test_apgr_and_cpt_by_hand() -> None:
    curve = routing_curve(SCORES, STRONG, WEAK, num_results=2)
    # AUC over (0, .25), (.5, .75), (1, .75) = .5 * .5 + .5 * .75 = .625; weak area .25, strong .75.
    assert apgr(curve, strong=0.75, weak=0.25) == pytest.approx((0.625 - 0.25) / 0.5)
    # PGR 50% = quality .5, reached a quarter of the way: interpolate on the first segment.
    assert cpt(curve, 0.5, strong=0.75, weak=0.25) == pytest.approx(0.25)
    assert cpt(curve, 0.8, strong=0.75, weak=0.25) == pytest.approx(0.4)
    m = evaluate_scores(SCORES, STRONG, WEAK, num_results=2)
    assert (m.apgr, m.cpt50, m.cpt80) == pytest.approx((0.75, 0.25, 0.4))


def test_reversed_router_is_worse_than_random_and_oracle_better() -> None:
    good = evaluate_scores(SCORES, STRONG, WEAK, num_results=2).apgr
    bad = evaluate_scores(-SCORES, STRONG, WEAK, num_results=2).apgr
    assert bad < 0.5 < good


def test_oracle_spends_strong_calls_on_positive_gains_only() -> None:
    # Gains are 0, 0, 1, 1: two useful strong calls.
    assert oracle_quality(STRONG, WEAK, 0.0) == pytest.approx(0.25)
    assert oracle_quality(STRONG, WEAK, 0.25) == pytest.approx(0.5)
    assert oracle_quality(STRONG, WEAK, 0.5) == pytest.approx(0.75)
    assert oracle_quality(STRONG, WEAK, 1.0) == pytest.approx(0.75)
    curve = oracle_curve(STRONG, WEAK, steps=4)
    # (0,.25) (.25,.5) (.5,.75) (.75,.75) (1,.75): area .09375 + .15625 + .1875 + .1875 = .625.
    assert apgr(curve, strong=0.75, weak=0.25) == pytest.approx((0.625 - 0.25) / 0.5)


def test_oracle_with_scores_that_can_lose() -> None:
    # Judge scores: the strong model is worse on the second prompt; the oracle never sends it there.
    strong, weak = np.array([9.0, 5.0, 8.0]), np.array([6.0, 7.0, 8.0])
    assert oracle_quality(strong, weak, 1.0) == pytest.approx((9 + 7 + 8) / 3)


def test_frontier_helpers_read_the_upper_envelope() -> None:
    costs, quals = [1.0, 2.0, 3.0], [0.5, 0.7, 0.6]  # the third policy is dominated
    assert quality_at_cost(costs, quals, 1.5) == pytest.approx(0.6)
    assert quality_at_cost(costs, quals, 3.0) == pytest.approx(0.7)
    assert math.isnan(quality_at_cost(costs, quals, 0.5))
    assert cost_at_quality(costs, quals, 0.6) == pytest.approx(1.5)
    assert cost_at_quality(costs, quals, 0.4) == pytest.approx(1.0)
    assert math.isnan(cost_at_quality(costs, quals, 0.8))


# ----------------------------------------------------------------------------- the oracle on the router's grid


def test_sweep_counts_are_the_strong_calls_of_a_router_with_distinct_scores() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4, 10, 57, 203, 1000):
        scores = rng.permutation(n) * 10.0  # distinct, and on a scale where float noise cannot move an edge
        curve = routing_curve(scores, np.ones(n), np.zeros(n))
        assert [round(p.strong_share * n) for p in curve] == sweep_counts(n), n
    assert sweep_counts(4, 4) == [4, 3, 2, 1, 0]
    assert sweep_counts(203) == [203, 182, 162, 142, 122, 102, 81, 61, 41, 21, 0]
    assert sweep_counts(0) == [0] * 11


def test_oracle_equals_any_router_when_the_strong_model_always_gains_the_same() -> None:
    # Every router, the oracle included, is on the straight line here: APGR 0.5 and CPT(50) 50%. The
    # oracle plotted at nominal shares with its strong calls rounded down scored 0.495 and 50.6% on 203.
    for n in (203, 1001, 7):
        strong, weak = np.ones(n), np.zeros(n)
        oracle = oracle_curve(strong, weak)
        route = routing_curve(np.random.default_rng(n).random(n), strong, weak)
        assert apgr(oracle, 1.0, 0.0) == pytest.approx(0.5) == apgr(route, 1.0, 0.0)
        assert cpt(oracle, 0.5, 1.0, 0.0) == pytest.approx(0.5)
        # Each point sits at the share it was computed for: quality = weak + share * gap.
        assert all(p.quality == pytest.approx(p.strong_share) for p in oracle)


@pytest.mark.parametrize("kind", ["binary", "continuous"])
def test_oracle_apgr_is_at_least_any_routers_on_random_data(kind: str) -> None:
    checked = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(5, 1500))
        if kind == "binary":
            strong, weak = (rng.random(n) < 0.7).astype(float), (rng.random(n) < 0.5).astype(float)
        else:
            strong, weak = rng.random(n), rng.random(n) * 0.8
        s, w = float(strong.mean()), float(weak.mean())
        if s <= w:  # APGR reads upside down when the weak model is better: not a ranking to compare
            continue
        oracle = apgr(oracle_curve(strong, weak), s, w)
        gain = strong - weak
        for scores in (rng.random(n), gain + rng.normal(0, 0.3, n), gain + rng.normal(0, 1e-6, n)):
            assert oracle >= apgr(routing_curve(scores, strong, weak), s, w) - 1e-9, (seed, n)
        checked += 1
    assert checked > 40


def test_cpt_is_the_smallest_share_reaching_the_target_where_the_curve_is_flat_there() -> None:
    # Strong always right, weak right on the 1st and 3rd highest-scored prompts: PGR 0.5 (quality 0.75) is
    # reached at 50% strong calls and stays there until 75%. np.interp on the tied qualities gave 75%.
    scores = np.array([0.25, 0.15, 0.05, 0.35])
    strong, weak = np.ones(4), np.array([0.0, 1.0, 0.0, 1.0])
    curve = routing_curve(scores, strong, weak, num_results=3)
    points = sorted((p.strong_share, p.quality) for p in curve)
    assert [x for point in points for x in point] == pytest.approx([0.0, 0.5, 0.5, 0.75, 0.75, 0.75, 1.0, 1.0])
    assert cpt(curve, 0.5, strong=1.0, weak=0.5) == pytest.approx(0.5)
    assert evaluate_scores(scores, strong, weak, num_results=3).cpt50 == pytest.approx(0.5)


def test_cpt_is_the_first_crossing_of_a_curve_that_dips() -> None:
    # Seven prompts (a noisy small data set): quality 4/7, 3/7, 3/7, 4/7, 5/7, 4/7, 5/7 at 0, 2/7, ..., 7/7
    # strong calls; PGR 0.5 (quality 9/14) is first reached halfway between 4/7 and 5/7 of the calls.
    # np.interp, which needs rising qualities, put it at 13/14, on the last segment.
    scores = np.array([0.35, 0.15, 0.65, 0.55, 0.45, 0.25, 0.05])
    strong = np.array([1.0, 0, 1, 0, 1, 1, 1])
    weak = np.array([0.0, 1, 1, 1, 1, 0, 0])
    curve = routing_curve(scores, strong, weak, num_results=6)
    assert cpt(curve, 0.5, strong=5 / 7, weak=4 / 7) == pytest.approx(4.5 / 7)


def test_cpt_is_nan_where_the_curve_never_reaches_the_target_and_reads_pgr_for_an_inverted_pair() -> None:
    # A rule pins the one prompt the strong model wins to the weak model: PGR never exceeds 0.
    scores = np.array([0.1, 0.2, 0.3, np.nan])
    strong, weak = np.array([1.0, 1, 1, 1]), np.array([1.0, 1, 1, 0])
    curve = routing_curve(scores, strong, weak, 2, pinned=np.array([0, 0, 0, -1]))
    assert np.isnan(cpt(curve, 0.5, strong=1.0, weak=0.75))
    # The weak model better on average (0.75 vs 0.25): PGR still runs from 0 (no strong call) to 1 (all),
    # here linearly, so PGR 0.5 is at 50% strong calls. np.interp on the falling qualities said 100%.
    flipped = [CurvePoint(0.0, 1.0, 0.25), CurvePoint(0.5, 0.5, 0.5), CurvePoint(1.0, 0.0, 0.75)]
    assert cpt(flipped, 0.5, strong=0.25, weak=0.75) == pytest.approx(0.5)
    assert np.isnan(cpt(flipped, 0.5, strong=0.5, weak=0.5))


@pytest.mark.parametrize("scores_kind", ["distinct", "tenths", "three values"])
@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "prompts"])
def test_resampled_apgr_equals_the_apgr_of_each_bootstrap_resample(scores_kind: str, grouped: bool) -> None:
    # The fast bootstrap reads each resample as row counts over scores sorted once; it must give the
    # APGR of the resample itself (ties in the scores, repeated prompts, resamples where the models tie).
    from evals.metrics import ResampledApgr, bootstrap, resample_counts
    from evals.retrain import safe_apgr

    rng = np.random.default_rng(11)
    checked = 0
    for trial in range(60):
        n = int(rng.integers(2, 300))
        scores = {"distinct": rng.random(n), "tenths": np.round(rng.random(n), 1),
                  "three values": rng.integers(0, 3, n).astype(float)}[scores_kind]
        strong, weak = rng.integers(0, 2, n).astype(float), rng.random(n)
        groups = rng.integers(0, max(1, n // 3), n).tolist() if grouped else None

        def stat(idx: np.ndarray) -> dict[str, float]:
            return {"apgr": safe_apgr(scores[idx], strong[idx], weak[idx])}  # noqa: B023 - used at once

        expected = bootstrap(stat, n, 4, trial, groups=groups)["apgr"]
        fast = ResampledApgr(scores, strong, weak)
        got = np.array([fast.apgr(counts) for counts in resample_counts(n, 4, trial, groups=groups)])
        assert np.array_equal(np.isnan(got), np.isnan(expected))
        defined = ~np.isnan(expected)
        assert got[defined] == pytest.approx(expected[defined], rel=1e-9, abs=1e-9)
        checked += int(defined.sum())
    assert checked > 150
    tiny = ResampledApgr(np.array([0.5, 0.2]), np.array([1.0, 0.0]), np.array([0.0, 0.0]))
    assert np.isnan(tiny.apgr(np.array([1, 0])))  # one row: no curve
