"""``pointsman ab report`` after a hostile review: no false certainty from scores or costs that never
varied, no float noise shown as a cost difference, output paths and non-UTF-8 arguments checked before
any work, a verdict that says which arm lacks scores, and plots drawn without layout warnings.
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from evals.ab import ArmSpec, ExperimentData, Options, analyze, served_rows
from evals.ab.data import empty_shadows
from evals.ab.render import write_ab_report
from gateway.cli import main as pointsman
from policies.experiments.sequential import (
    bounded_variance,
    cumulative_stats,
    mean_difference_cs,
    mean_difference_path,
    mean_path,
    normal_mixture_margin,
    proportion_difference_cs,
)
from store import DecisionRecord, FeedbackRecord, SQLiteDecisionStore
from store.records import ArmStop

ASYNC = pytest.mark.asyncio(loop_scope="session")

NAME = "exp"
START = 1_760_000_000.0
SPEC = {
    "arms": [{"name": "control", "weight": 0.35, "control": True, "shadow": False, "kind": "knob"},
             {"name": "mini", "weight": 0.65, "control": False, "shadow": False, "kind": "static"}],
    "key": "user", "strong": "big", "weak": "small",
}
COST = 2.5e-05  # every request's cost: the same model, the same tokens


async def constant_store(
    path: Path, n_control: int, n_treatment: int, score_control: float | None, score_treatment: float | None
) -> None:
    """An experiment whose every request costs ``COST`` and carries the arm's one explicit score (None: none)."""
    store = SQLiteDecisionStore(str(path))
    await store.open()
    try:
        records, feedback = [], []
        for i, arm in enumerate(["control"] * n_control + ["mini"] * n_treatment):
            rid = f"r{i}"
            records.append(DecisionRecord(
                request_id=rid, created_at=START + i, endpoint="chat.completions", route="auto",
                requested_model="auto", model="small", backend="fake", status=200, outcome="ok", latency_ms=100.0,
                cost_usd=COST, prompt_tokens=10, completion_tokens=10, experiment=NAME, experiment_arm=arm,
                arm_propensity=0.5,
            ))
            score = score_control if arm == "control" else score_treatment
            if score is not None:
                feedback.append(FeedbackRecord(rid, score, source="user"))
        await store.write_batch(records)
        await store.write_feedback(feedback)
        await store.register_experiment(NAME, "auto", SPEC)
    finally:
        await store.close()


def run(*argv: str) -> int:
    """``pointsman ab report ...`` in a thread (the CLI runs its own event loop)."""
    return pointsman(["ab", "report", *argv, "--no-progress"])


def constant_experiment(n_control: int, n_treatment: int, control: float, treatment: float) -> ExperimentData:
    """Arms alternating while both have requests; every score of an arm the same, every cost ``COST``."""
    arms = ["control", "mini"] * min(n_control, n_treatment)
    arms += ["control"] * (n_control - len(arms) // 2) + ["mini"] * (n_treatment - len(arms) // 2)
    a = np.array(arms, dtype=object)
    q = np.where(a == "control", control, treatment)
    rows = served_rows(a, {"explicit": q}, cost=np.full(a.size, COST))
    return ExperimentData(NAME, "auto", [ArmSpec("control", 0.5, control=True), ArmSpec("mini", 0.5)], rows,
                          empty_shadows())


# ----------------------------------------------------------------------------- 1. no zero-width certainty


def test_constant_scores_give_a_finite_positive_width_that_shrinks_with_n() -> None:
    widths = []
    for n in (2, 12, 18, 50, 100, 1000, 10_000):
        cs = mean_difference_cs(np.full(n, 0.9), np.full(n, 0.8), bounds=(0.0, 1.0))
        assert cs.estimate == pytest.approx(0.1)
        assert math.isfinite(cs.lower) and math.isfinite(cs.upper)
        assert cs.upper - cs.lower > 0, n  # never a zero-width "always-valid" interval
        widths.append(cs.upper - cs.lower)
        lo, hi = mean_path([n], [0.8], [0.0], bounds=(0.0, 1.0))
        assert 0.0 <= lo[0] < 0.8 < hi[0] <= 1.0  # each arm too: clipped to [0, 1], never a point
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.01  # and it still shrinks with n
    # The review's case: 12 scores of 0.8 against 18 of 0.9 is no proof of anything...
    small = mean_difference_cs(np.full(18, 0.9), np.full(12, 0.8), bounds=(0.0, 1.0))
    assert not small.significant and small.lower < 0 < 0.1 < small.upper
    # ... 1000 of each is (the difference is real).
    assert mean_difference_cs(np.full(1000, 0.9), np.full(1000, 0.8), bounds=(0.0, 1.0)).lower > 0.09
    # Equal constant arms never differ, at any size.
    for n in (5, 100, 10_000):
        same = mean_difference_cs(np.full(n, 0.7), np.full(n, 0.7), bounds=(0.0, 1.0))
        assert same.estimate == 0.0 and same.lower < 0 < same.upper


def test_the_smoothing_is_the_proportions_for_0_1_data_and_only_ever_widens() -> None:
    for hits, n in ((0, 10), (3, 10), (10, 10), (50, 100)):
        x = np.r_[np.ones(hits), np.zeros(n - hits)]
        smoothed = (hits + 0.5) / (n + 1)
        var = float(bounded_variance(n, x.mean(), x.var(ddof=1), (0.0, 1.0)))
        assert var == pytest.approx(max(smoothed * (1 - smoothed), x.var(ddof=1)))
    # All-zero arms: the same interval as the rate difference's (both smoothed the same way).
    rate = proportion_difference_cs(0, 40, 0, 40)
    mean = mean_difference_cs(np.zeros(40), np.zeros(40), bounds=(0.0, 1.0))
    assert (mean.lower, mean.upper) == pytest.approx((rate.lower, rate.upper))
    rng = np.random.default_rng(4)
    for _ in range(20):
        x = rng.uniform(size=int(rng.integers(2, 300)))
        assert float(bounded_variance(x.size, x.mean(), x.var(ddof=1), (0.0, 1.0))) >= x.var(ddof=1)
    # On a range of width w the smoothing scales with w²; unknown variances stay unknown.
    assert float(bounded_variance(20, 5.0, 0.0, (0.0, 10.0))) == pytest.approx(
        100 * float(bounded_variance(20, 0.5, 0.0, (0.0, 1.0))))
    assert math.isnan(float(bounded_variance(1, 0.5, math.nan, (0.0, 1.0))))
    # Without bounds the plain plug-in is unchanged (the guardrails' cost test calls it that way).
    plain = mean_difference_path([50], [0.6], [0.04], [50], [0.5], [0.04]).at(0)
    assert plain.upper - plain.estimate == pytest.approx(float(normal_mixture_margin(0.04 / 50 * 2, 0.08)))


def test_a_constant_cost_in_both_arms_is_zero_difference_not_float_noise() -> None:
    treatment, control = np.full(41, COST), np.full(22, COST)
    cs = mean_difference_cs(treatment, control, bounds=(0.0, COST), clip=False)
    assert cs.estimate == 0.0
    assert cs.lower < 0 < cs.upper and cs.upper - cs.lower > 0  # smoothed: not a zero-width certainty
    assert cs.upper > 1e-7  # of the order of the costs, not 1e-21
    _, mean, var = cumulative_stats(np.full(57, COST))
    assert (mean == COST).all() and (var[1:] == 0).all()  # the running mean is exact for equal values
    # Means that differ by rounding only are equal; a real (tiny) difference is kept.
    path = mean_difference_path([30], [COST * (1 + 1e-15)], [0.0], [30], [COST], [0.0])
    assert path.estimate[0] == 0.0
    assert mean_difference_path([30], [COST * (1 + 1e-6)], [0.0], [30], [COST], [0.0]).estimate[0] != 0.0


@ASYNC
async def test_the_reviews_constant_scores_store_declares_no_winner(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "store.db"
    await constant_store(db, 22, 41, 0.8, 0.9)
    out = tmp_path / "report"
    assert await asyncio.to_thread(run, NAME, "--store", str(db), "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "better than" not in printed and "[0.100, 0.100]" not in printed
    assert printed.startswith("not enough data yet")
    data = json.loads((out / "ab-report.json").read_text())
    assert data["verdicts"]["mini"]["kind"] == "not_enough_data"
    diff = data["differences"]["mini"]
    q = diff["quality"]["explicit"]
    assert q["estimate"] == pytest.approx(0.1) and not q["significant"]
    assert q["ci"][0] < 0 < 0.1 < q["ci"][1]
    for arm, mean in (("control", 0.8), ("mini", 0.9)):
        stats = data["arms"][arm]
        lo, hi = stats["quality"]["explicit"]["ci"]
        assert lo < mean <= hi <= 1.0 and hi - lo > 0.05
        lo, hi = stats["quality"]["implicit"]["ci"]  # no implicit signal anywhere: 1.0 each, not certain
        assert lo < 1.0 and hi == 1.0
        lo, hi = stats["cost_per_request"]["ci"]
        assert lo < COST < hi  # a cost's range is read from the data: it smooths but never clips
    cost = diff["cost_per_request"]
    assert cost["estimate"] == 0.0 and not cost["significant"]
    assert cost["ci"][0] < -1e-7 and cost["ci"][1] > 1e-7
    md = (out / "ab-report.md").read_text()
    assert "e-2" not in md and "0.800 [0.800, 0.800]" not in md and "+$0 [" in md


def test_constant_scores_declare_the_real_winner_once_there_are_many() -> None:
    small = analyze(constant_experiment(12, 18, 0.8, 0.9))
    assert small["verdicts"]["mini"]["kind"] == "not_enough_data"
    large = analyze(constant_experiment(1000, 1000, 0.8, 0.9))
    verdict = large["verdicts"]["mini"]
    assert verdict["kind"] == "better" and verdict["winner"] == "mini"
    lo, hi = large["differences"]["mini"]["quality"]["explicit"]["ci"]
    assert 0.09 < lo < 0.1 < hi < 0.11
    assert "no cost difference detected ($0 per request [-$" in verdict["text"]
    same = analyze(constant_experiment(1000, 1000, 0.8, 0.8), Options(min_effect=0.02))
    assert same["verdicts"]["mini"]["kind"] == "no_difference"


# ----------------------------------------------------------------------------- 2. output paths checked first


@ASYNC
async def test_an_output_name_taken_by_a_directory_is_an_out_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    db = tmp_path / "store.db"
    await constant_store(db, 30, 30, 0.5, 0.6)
    for taken, formats in (("ab-report.md", "md,html,json"), ("ab-report.json", "json"),
                           ("quality_over_time.png", "html")):
        out = tmp_path / f"out-{taken}"
        (out / taken).mkdir(parents=True)
        assert await asyncio.to_thread(run, NAME, "--store", str(db), "--out", str(out), "--format", formats) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pointsman ab: --out {out}: {out / taken} exists and is not a regular file"), err
        assert "cannot read the store" not in err
        assert sorted(p.name for p in out.iterdir()) == [taken]  # nothing written: no PNG, no half report
    # Checked before the store is read: a missing store is not what is reported.
    out = tmp_path / "out-first"
    (out / "ab-report.html").mkdir(parents=True)
    assert await asyncio.to_thread(run, NAME, "--store", str(tmp_path / "missing.db"), "--out", str(out)) == 2
    assert "ab-report.html exists and is not a regular file" in capsys.readouterr().err
    # The library call refuses the same way, before drawing anything.
    report = analyze(constant_experiment(20, 20, 0.5, 0.6))
    with pytest.raises(ValueError, match="exists and is not a regular file"):
        write_ab_report(report, out)
    assert sorted(p.name for p in out.iterdir()) == ["ab-report.html"]


# ----------------------------------------------------------------------------- 3. non-UTF-8 arguments


@ASYNC
async def test_arguments_that_are_not_utf8_are_usage_errors_naming_the_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    db = tmp_path / "store.db"
    await constant_store(db, 5, 5, 0.5, 0.6)
    bad = b"exp\xff".decode("utf-8", "surrogateescape")  # what Python makes of such a command-line byte
    out = tmp_path / "out"
    assert await asyncio.to_thread(run, bad, "--store", str(db), "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "experiment name 'exp\\udcff': not valid UTF-8" in err and "cannot read the store" not in err
    metric = b"x\xff".decode("utf-8", "surrogateescape")
    assert await asyncio.to_thread(run, NAME, "--store", str(db), "--out", str(out), "--metric", metric) == 2
    err = capsys.readouterr().err
    assert "--metric 'x\\udcff': not valid UTF-8" in err and "codec" not in err
    # Paths are bytes to the file system: a non-UTF-8 --out still works.
    odd = tmp_path / b"r\xff".decode("utf-8", "surrogateescape")
    assert await asyncio.to_thread(run, NAME, "--store", str(db), "--out", str(odd), "--format", "json") == 0
    assert (odd / "ab-report.json").is_file()
    assert "r\\xff/ab-report.json" in capsys.readouterr().out  # printed with the byte escaped


# ----------------------------------------------------------------------------- 4. which arm lacks scores


@ASYNC
async def test_the_verdict_names_the_arm_without_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "store.db"
    await constant_store(db, 22, 19, None, 0.9)
    out = tmp_path / "out"
    assert await asyncio.to_thread(run, NAME, "--store", str(db), "--out", str(out), "--format", "json") == 0
    text = capsys.readouterr().out
    assert "scored requests per arm (control has no explicit score yet; mini has 19)" in text, text
    assert "none has" not in text and "a explicit" not in text
    # Neither arm scored (the source forced): both named, with the right article.
    for source, phrase in (("explicit", "an explicit"), ("judge", "a judge")):
        assert await asyncio.to_thread(run, NAME, "--store", str(db), "--out", str(out), "--format", "json",
                                       "--quality-source", source, "--metric", "nothing") == 0
        assert f"(neither arm has {phrase} score yet)" in capsys.readouterr().out
    rows = served_rows(np.array(["control", "mini"] * 10, dtype=object),
                       {"judge": np.tile([0.5, np.nan], 10)})
    report = analyze(ExperimentData(NAME, "auto", [ArmSpec("control", 0.5, control=True), ArmSpec("mini", 0.5)],
                                    rows, empty_shadows()))
    assert "(mini has no judge score yet; control has 10)" in report["verdicts"]["mini"]["text"]


# ----------------------------------------------------------------------------- 5. plots without layout warnings


@pytest.mark.parametrize("n_per_arm", [1, 2, 3, 5])
def test_small_experiments_plot_without_layout_warnings(tmp_path: Path, n_per_arm: int) -> None:
    # Control's requests first: the first looks have no difference yet, which put the "smallest
    # difference" label left of the x range and collapsed the constrained layout.
    arms = np.array(["control"] * n_per_arm + ["mini"] * n_per_arm, dtype=object)
    rows = served_rows(arms, {"explicit": np.where(arms == "control", 0.8, 0.9)}, created_at=START + np.arange(
        arms.size), cost=np.full(arms.size, COST))
    stops = [ArmStop(NAME, "mini", "cost", {"ratio": 2.0}, START + 10 * arms.size + 100, "replica-a")]
    data = ExperimentData(NAME, "auto", [ArmSpec("control", 0.5, control=True), ArmSpec("mini", 0.5)], rows,
                          empty_shadows(), stops=stops)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only inside this test: any warning from drawing fails it
        paths = write_ab_report(analyze(data), tmp_path)
    assert {"quality_over_time", "requests_over_time"} <= set(paths)
    for name in ("quality_over_time", "requests_over_time", "difference_over_time"):
        if name in paths:
            assert paths[name].read_bytes().startswith(b"\x89PNG")
