"""The always-valid statistics behind experiments, and the A/B report's verdict on simulated experiments.

The two acceptance simulations run the report's own analysis (:func:`evals.ab.analysis.analyze`, what
``pointsman ab report`` calls), reading its difference path after every 100 requests per arm: a real
difference is found, and identical arms are rarely (<= alpha + simulation error) ever declared different.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import optimize

from evals.ab import ArmSpec, ExperimentData, Options, analyze, served_rows
from evals.ab.data import empty_shadows
from policies.experiments import (
    mean_difference_cs,
    proportion_difference_cs,
    sample_ratio_check,
)
from policies.experiments.sequential import (
    bounded_variance,
    cumulative_stats,
    mean_difference_path,
    normal_mixture_margin,
    rho_for_planned_n,
    samples_to_detect,
)

N_PER_ARM = 5000
EXPERIMENTS = 200
LOOK_EVERY = 200  # served requests between looks: 100 per arm (arms alternate)


def beta_scores(rng: np.random.Generator, mean: float, sd: float, size: int) -> np.ndarray:
    """Scores in [0, 1] with the given mean and standard deviation (a beta distribution)."""
    k = mean * (1 - mean) / sd**2 - 1
    return rng.beta(mean * k, (1 - mean) * k, size)


def experiment(rng: np.random.Generator, difference: float, n_per_arm: int = N_PER_ARM) -> ExperimentData:
    """A 50/50 experiment whose arms alternate request by request; judge scores sd 0.3, means 0.5 and 0.5+d."""
    quality = np.empty(2 * n_per_arm)
    quality[0::2] = beta_scores(rng, 0.5, 0.3, n_per_arm)
    quality[1::2] = beta_scores(rng, 0.5 + difference, 0.3, n_per_arm)
    arms = np.array(["control", "treatment"] * n_per_arm, dtype=object)
    rows = served_rows(arms, {"judge": quality})
    return ExperimentData("sim", "auto", [ArmSpec("control", 0.5, control=True), ArmSpec("treatment", 0.5)],
                          rows, empty_shadows())


def first_claims(difference: float, seed: int) -> tuple[list[str | None], list[dict]]:
    """Per simulated experiment: the winner the report declared at its first significant look (or None)."""
    rng = np.random.default_rng(seed)
    claims: list[str | None] = []
    reports = []
    for _ in range(EXPERIMENTS):
        report = analyze(experiment(rng, difference), Options(look_every=LOOK_EVERY))
        path = report["timeline"]["differences"]["treatment"]
        assert list(path["n_treatment"][:2]) == [100, 200]  # looks after every 100 requests per arm
        significant = path["significant"]
        if significant.any():
            first = int(np.argmax(significant))
            claims.append("treatment" if path["estimate"][first] > 0 else "control")
        else:
            claims.append(None)
        reports.append(report)
    return claims, reports


def test_a_real_difference_of_005_is_found_within_5000_requests_per_arm() -> None:
    claims, reports = first_claims(0.05, seed=13)
    power = sum(c == "treatment" for c in claims) / EXPERIMENTS
    assert power >= 0.80, power
    # The verdict reads the path's last look: where that look excludes 0 the verdict names the winner.
    for report in reports:
        last = report["timeline"]["differences"]["treatment"]["significant"][-1]
        verdict = report["verdicts"]["treatment"]
        assert (verdict["kind"] in ("better", "worse")) == bool(last)
        if verdict["kind"] == "better":
            assert verdict["winner"] == "treatment"
            assert verdict["text"].startswith("treatment better than control on quality (judge) by 0.0")


def test_identical_arms_read_after_every_100_requests_rarely_ever_claim_a_winner() -> None:
    claims, _ = first_claims(0.0, seed=29)
    ever = sum(c is not None for c in claims) / EXPERIMENTS
    assert ever <= 0.08, ever


def test_peeking_at_a_fixed_sample_interval_would_have_claimed_winners_far_more_often() -> None:
    """Why the report uses confidence sequences: the same 50 looks with a 95% t-interval go wrong often."""
    rng = np.random.default_rng(29)
    looks = np.arange(100, N_PER_ARM + 1, 100) - 1
    naive = 0
    for _ in range(EXPERIMENTS):
        nt, mt, vt = (s[looks] for s in cumulative_stats(beta_scores(rng, 0.5, 0.3, N_PER_ARM)))
        nc, mc, vc = (s[looks] for s in cumulative_stats(beta_scores(rng, 0.5, 0.3, N_PER_ARM)))
        z = (mt - mc) / np.sqrt(vt / nt + vc / nc)
        naive += bool((np.abs(z) > 1.96).any())
    assert naive / EXPERIMENTS > 0.15


def test_the_report_says_not_enough_data_after_50_requests_per_arm() -> None:
    report = analyze(experiment(np.random.default_rng(3), 0.05, n_per_arm=50))
    verdict = report["verdicts"]["treatment"]
    assert verdict["kind"] == "not_enough_data"
    assert verdict["text"].startswith("not enough data yet: about ")
    assert "more requests per arm would detect a difference of" in verdict["text"]
    # The difference named is the smallest that counts (default 0.02); the requests are where the
    # interval's half-width would shrink to it, at the variances seen so far (smoothed within [0, 1]
    # like the intervals').
    assert verdict["detectable_difference"] == 0.02
    var_t, var_c = (float(bounded_variance(50, q["mean"], q["sd"] ** 2, (0.0, 1.0)))
                    for q in (report["arms"][a]["quality"]["judge"] for a in ("treatment", "control")))
    needed = samples_to_detect(0.02, var_t, var_c, rho=rho_for_planned_n(1000))
    assert 4000 < needed < 20000  # sd 0.3 per arm: thousands of requests to see 0.02
    assert verdict["more_requests_per_arm"] == needed - 50
    expected = f"about {needed - 50:,} more requests per arm would detect a difference of 0.02 in quality (judge)"
    assert expected in verdict["text"]
    assert report["verdict"] == verdict["text"]


def test_identical_arms_with_a_narrow_interval_say_no_difference() -> None:
    report = analyze(experiment(np.random.default_rng(5), 0.0, n_per_arm=20000), Options(min_effect=0.03))
    assert report["verdicts"]["treatment"]["kind"] == "no_difference"
    assert report["verdict"].startswith("no difference detected between treatment and control")


# ----------------------------------------------------------------------------- the confidence sequence


def test_rho_for_a_planned_size_minimises_the_width_there() -> None:
    alpha, n = 0.05, 1000

    def width(r2: float) -> float:
        return float(normal_mixture_margin(1 / n, 1.0, alpha=alpha, rho=math.sqrt(r2)))

    best = optimize.minimize_scalar(width, bounds=(1e-8, 1.0), method="bounded")
    assert rho_for_planned_n(n, alpha) ** 2 == pytest.approx(best.x, rel=1e-3)


def test_the_boundary_is_the_published_normal_mixture_formula() -> None:
    # Waudby-Smith et al. (2024), Theorem 2.2:
    # sigma * sqrt(2(t rho^2 + 1) / (t^2 rho^2) * log(sqrt(t rho^2 + 1) / alpha))
    t, rho, sigma, alpha = 400, 0.1, 0.3, 0.05
    expected = sigma * math.sqrt(2 * (t * rho**2 + 1) / (t**2 * rho**2) * math.log(math.sqrt(t * rho**2 + 1) / alpha))
    assert float(normal_mixture_margin(sigma**2 / t, sigma**2, alpha=alpha, rho=rho)) == pytest.approx(expected)


def test_mean_difference_cs_matches_the_vectorised_path_and_covers_the_truth() -> None:
    rng = np.random.default_rng(1)
    t, c = rng.normal(0.6, 0.3, 800), rng.normal(0.5, 0.3, 1200)
    cs = mean_difference_cs(t, c)
    assert cs.estimate == pytest.approx(t.mean() - c.mean())
    assert cs.lower < 0.1 < cs.upper
    assert (cs.n_treatment, cs.n_control) == (800, 1200)
    nt, mt, vt = cumulative_stats(t)
    nc, mc, vc = cumulative_stats(c)
    path = mean_difference_path(nt[-1:], mt[-1:], vt[-1:], nc[-1:], mc[-1:], vc[-1:])
    last = path.at(0)
    assert (last.estimate, last.lower, last.upper) == pytest.approx((cs.estimate, cs.lower, cs.upper))
    # Wider than the fixed-sample 95% interval: the price of reading it at any time.
    se = math.sqrt(t.var(ddof=1) / 800 + c.var(ddof=1) / 1200)
    assert cs.half_width > 1.96 * se


def test_small_or_missing_samples_give_an_unbounded_interval_not_an_exception() -> None:
    for treatment, control in (([], []), ([1.0], [0.0]), ([np.nan, 0.4], [0.1, 0.2, 0.3])):
        cs = mean_difference_cs(treatment, control)
        assert (cs.lower, cs.upper) == (-math.inf, math.inf)
        assert not cs.significant
    cs = mean_difference_cs([0.2, np.nan, 0.4, 0.6], [0.1, 0.2, 0.3])  # NaNs are skipped, not propagated
    assert cs.n_treatment == 3 and math.isfinite(cs.lower)


def test_cumulative_stats_match_numpy_at_every_prefix() -> None:
    x = np.random.default_rng(2).normal(1e6, 1.0, 50)  # far from zero: the shifted sums keep precision
    n, mean, var = cumulative_stats(x)
    assert n[-1] == 50 and np.isnan(var[0])
    assert mean[9] == pytest.approx(x[:10].mean())
    assert var[9] == pytest.approx(x[:10].var(ddof=1), rel=1e-6)


def test_proportion_difference_cs() -> None:
    none_either = proportion_difference_cs(0, 10, 0, 10)
    assert none_either.estimate == 0 and 0 < none_either.upper < 1  # smoothed: 0/10 is not certainty
    worse = proportion_difference_cs(300, 2000, 100, 2000)
    assert worse.significant and worse.lower > 0
    assert worse.estimate == pytest.approx(0.1) and (worse.n_treatment, worse.n_control) == (2000, 2000)
    assert worse.lower < 0.1 < worse.upper
    with pytest.raises(ValueError, match="successes must be in"):
        proportion_difference_cs(11, 10, 0, 10)


def test_samples_to_detect_is_where_the_half_width_reaches_the_effect() -> None:
    n = samples_to_detect(0.05, 0.09, 0.09)
    assert float(normal_mixture_margin(0.18 / n, 0.18)) <= 0.05 < float(normal_mixture_margin(0.18 / (n - 1), 0.18))
    assert samples_to_detect(0.0, 0.09, 0.09) == 10**9


# ----------------------------------------------------------------------------- sample-ratio mismatch


def test_srm_flags_a_52_48_split_of_20000_but_not_50_3_49_7() -> None:
    weights = {"control": 0.5, "treatment": 0.5}
    broken = sample_ratio_check({"control": 10400, "treatment": 9600}, weights)
    assert broken.mismatch and broken.p_value < 1e-6
    fine = sample_ratio_check({"control": 10060, "treatment": 9940}, weights)
    assert not fine.mismatch and fine.p_value > 0.3
    assert fine.expected_share == weights and fine.counts == {"control": 10060, "treatment": 9940}


def test_srm_with_traffic_on_an_unweighted_arm_is_a_mismatch() -> None:
    check = sample_ratio_check({"a": 500, "b": 480, "ghost": 3}, {"a": 1, "b": 1})
    assert check.mismatch and check.p_value == 0.0
    assert not sample_ratio_check({}, {"a": 1, "b": 1}).mismatch


def test_the_report_flags_srm_and_says_do_not_trust() -> None:
    rng = np.random.default_rng(8)
    arms = np.array(["control"] * 10400 + ["treatment"] * 9600, dtype=object)
    rng.shuffle(arms)
    data = ExperimentData("srm", "auto", [ArmSpec("control", 0.5, control=True), ArmSpec("treatment", 0.5)],
                          served_rows(arms, {"judge": rng.uniform(size=arms.size)}), empty_shadows())
    report = analyze(data)
    assert report["srm"]["mismatch"]
    assert report["verdicts"]["treatment"]["kind"] == "srm"
    assert report["verdict"].startswith("SRM: assignment is broken, do not trust")


def test_srm_counts_assignment_keys_not_requests() -> None:
    """Assignment is per key: 150 keys per arm split evenly, but the treatment's keys happen to send
    more requests. Counted per request that is a broken split; per key it is not."""
    rng = np.random.default_rng(3)
    units = [f"k{i:03d}" for i in range(300)]
    arm_of = {u: ("control" if i < 150 else "treatment") for i, u in enumerate(units)}
    sent = [u for u in units for _ in range(1 if arm_of[u] == "control" else 2)]  # heavier treatment keys
    rng.shuffle(sent)
    arms = np.array([arm_of[u] for u in sent], dtype=object)
    rows = served_rows(arms, {"judge": rng.uniform(size=arms.size)})
    spec = [ArmSpec("control", 0.5, control=True), ArmSpec("treatment", 0.5)]
    by_request = analyze(ExperimentData("keys", "auto", spec, rows, empty_shadows()))
    assert by_request["srm"]["mismatch"]  # 150 vs 300 requests
    keyed = dataclasses.replace(rows, unit=np.array(sent, dtype=object))
    by_key = analyze(ExperimentData("keys", "auto", spec, keyed, empty_shadows()))
    assert not by_key["srm"]["mismatch"]
    assert by_key["srm"]["counts"] == {"control": 150, "treatment": 150}
    assert "assignment keys" in by_key["srm_note"]


def test_a_rate_difference_never_leaves_minus_one_to_one() -> None:
    every, none = proportion_difference_cs(100, 100, 0, 100), proportion_difference_cs(0, 100, 100, 100)
    assert every.significant and every.lower >= -1.0 and every.upper == 1.0
    assert none.significant and none.lower == -1.0 and none.upper <= 1.0
