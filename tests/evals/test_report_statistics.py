"""``pointsman eval``'s intervals and baselines where the data is not a clean sample of distinct prompts:
prompts that repeat, targets a curve does not reach, and rules that pin requests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evals.metrics import bootstrap, percentile_ci
from gateway.cli import main as pointsman
from tests.evals.labelled_files import rows as labelled_rows
from tests.evals.labelled_files import write_jsonl
from tests.evals.test_report import eval_config

# ----------------------------------------------------------------------------- repeated prompts


def _coverage(prompts: int, copies: int, sims: int, *, by_prompt: bool, seed: int = 11) -> tuple[float, float]:
    """Share of simulated data sets whose bootstrap 95% CI of the mean covers the true mean (0), and the
    CIs' mean width. Each data set: ``prompts`` prompts drawn from the population, each judged ``copies``
    times (judgments of one prompt nearly agree: the prompt, not the judgment, carries the variance)."""
    rng = np.random.default_rng(seed)
    covered, widths = 0, []
    for sim in range(sims):
        per_prompt = rng.normal(0.0, 1.0, prompts)
        x = np.repeat(per_prompt, copies) + rng.normal(0.0, 0.1, prompts * copies)
        groups = np.repeat(np.arange(prompts), copies) if by_prompt else None
        draws = bootstrap(lambda i, x=x: {"mean": x[i].mean()}, len(x), 200, seed=sim, groups=groups)
        lo, hi = percentile_ci(draws["mean"])
        covered += lo <= 0.0 <= hi
        widths.append(hi - lo)
    return covered / sims, float(np.mean(widths))


def test_resampling_prompts_restores_coverage_on_repeated_prompts_and_changes_nothing_without_repeats() -> None:
    # 60 prompts judged 5 times each: the mean's true standard error is 1/sqrt(60), not 1/sqrt(300). A row
    # bootstrap's interval is sqrt(5) too narrow and covers the true mean about 62% of the time.
    rows_cover, rows_width = _coverage(60, 5, 300, by_prompt=False)
    prompt_cover, prompt_width = _coverage(60, 5, 300, by_prompt=True)
    true_width = 2 * 1.96 * np.sqrt(1.0 + 0.1**2 / 5) / np.sqrt(60)
    assert rows_cover < 0.75
    assert 0.9 <= prompt_cover <= 0.99
    assert prompt_width == pytest.approx(true_width, rel=0.1)
    assert rows_width == pytest.approx(true_width / np.sqrt(5), rel=0.1)
    # Every prompt once: resampling prompts draws exactly the rows a row bootstrap draws.
    x = np.random.default_rng(3).normal(size=300)
    plain = bootstrap(lambda i: {"mean": x[i].mean()}, 300, 300, seed=5)
    grouped = bootstrap(lambda i: {"mean": x[i].mean()}, 300, 300, seed=5, groups=[f"p{j}" for j in range(300)])
    assert np.array_equal(plain["mean"], grouped["mean"])
    once_cover, once_width = _coverage(300, 1, 300, by_prompt=True)
    assert 0.9 <= once_cover <= 0.99 and once_width == pytest.approx(2 * 1.96 * np.sqrt(1.01 / 300), rel=0.1)


def test_a_prompt_bootstrap_groups_whole_prompts_wherever_they_are_in_the_data() -> None:
    groups = ["a", "b", "a", "c", "b", "a"]
    seen: list[list[str]] = []
    bootstrap(lambda i: seen.append([groups[j] for j in i]) or {}, len(groups), 50, seed=1, groups=groups)
    for drawn in seen:
        counts = {g: drawn.count(g) for g in set(drawn)}
        # Each pick of a prompt brings all its rows: a's count is a multiple of 3, b's of 2.
        assert counts.get("a", 0) % 3 == 0 and counts.get("b", 0) % 2 == 0
        assert sum(counts[g] // groups.count(g) for g in counts) == 3  # three prompts picked per draw


def _eval(tmp_path: Path, name: str, items: list[dict[str, object]]) -> dict[str, object]:
    data = write_jsonl(tmp_path / f"{name}.jsonl", items)
    out = tmp_path / name
    code = pointsman(["eval", "--config", str(eval_config(tmp_path / "config.yaml")), "--route", "auto",
                      "--data", f"file:{data}", "--out", str(out), "--bootstrap", "300", "--no-progress"])
    assert code == 0
    report: dict[str, object] = json.loads((out / "report.json").read_text())
    return report


def _width(entry: dict[str, list[float]]) -> float:
    lo, hi = entry["ci"]
    return hi - lo


def test_a_file_judging_each_prompt_four_times_gets_the_intervals_of_its_distinct_prompts(tmp_path: Path) -> None:
    # The same 120 prompts, once each and four times each (four identical judgments). Four copies of a prompt
    # tell nothing new: the intervals must be about as wide; resampling rows halved them (1/sqrt(4)).
    items = labelled_rows(seed=21, n=120, noise=0.15)
    once = _eval(tmp_path, "once", items)
    four = _eval(tmp_path, "four", [r for r in items for _ in range(4)])
    assert four["rows"]["evaluated"] == 4 * once["rows"]["evaluated"]  # type: ignore[index]
    for path in (("knob", "quality"), ("knob", "pgr"), ("routers", "router", "apgr"), ("routers", "knn", "apgr")):
        a, b = once, four
        for key in path:
            a, b = a[key], b[key]  # type: ignore[index]
        ratio = _width(b) / _width(a)  # type: ignore[arg-type]
        assert 0.75 < ratio < 1.33, (path, ratio)
    distinct = len({r["prompt"] for r in items})
    assert once["bootstrap"]["prompts"] == four["bootstrap"]["prompts"] == distinct  # type: ignore[index]
