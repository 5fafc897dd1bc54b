"""Loaders read the shared data with the row counts its README states; the split is deterministic."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from evals.data import (
    load_gsm8k,
    load_mmlu,
    load_mt_bench,
    load_routerbench,
    resolve_data_dir,
    split_indices,
    split_of,
)
from evals.data.split import fold_of
from tests.conftest import routing_data_dir


@pytest.fixture(scope="module")
def data_dir() -> Path:
    return routing_data_dir("routellm")  # fails on CI, skips elsewhere, when the data is missing


def test_data_dir_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "flag") == tmp_path / "flag"
    monkeypatch.delenv("POINTSMAN_DATA_DIR")
    assert resolve_data_dir().parts[-2:] == ("shared", "data")


def test_routellm_row_counts_match_the_readme(data_dir: Path) -> None:
    mmlu = load_mmlu(data_dir, drop_contaminated=False)
    assert len(mmlu) == 14042
    assert len({r.group for r in mmlu}) == 57
    assert len(load_gsm8k(data_dir, drop_contaminated=False)) == 1319
    assert len(load_mt_bench(data_dir, drop_contaminated=False)) == 80
    # Accuracies quoted in the README.
    assert sum(r.strong_quality for r in mmlu) / len(mmlu) == pytest.approx(0.806, abs=5e-4)
    assert sum(r.weak_quality for r in mmlu) / len(mmlu) == pytest.approx(0.681, abs=5e-4)


def test_contaminated_prompts_are_dropped(data_dir: Path) -> None:
    assert 14042 - 5 <= len(load_mmlu(data_dir)) < 14042
    assert 1319 - 12 <= len(load_gsm8k(data_dir)) < 1319
    assert len(load_mt_bench(data_dir)) < 80


def test_labels(data_dir: Path) -> None:
    for r in load_gsm8k(data_dir):
        assert r.strong_needed == (r.strong_quality == 1.0 and r.weak_quality == 0.0)
        assert r.domain == "math"
    mt = load_mt_bench(data_dir)
    assert all(len(r.turns) == 2 and r.prompt == r.turns[0] for r in mt)
    assert all(1.0 <= r.strong_quality <= 10.0 for r in mt)


def test_routerbench_rows_prompts_and_nans(data_dir: Path) -> None:
    rows = load_routerbench(data_dir)
    assert Counter(r.task for r in rows) == {"arc-challenge": 1039, "mbpp": 299, "winogrande": 887}
    assert all(len(r.quality) == 11 and set(r.cost) == set(r.quality) for r in rows)
    assert not any(r.prompt.startswith("[") for r in rows)  # the list wrapper is removed
    assert any(math.isnan(q) for r in rows for q in r.quality.values())  # empty cells become NaN


def test_split_is_deterministic_and_by_prompt() -> None:
    prompts = [f"prompt {i}" for i in range(5000)]
    first, again = split_indices(prompts), split_indices(list(prompts))
    assert first == again
    shares = {k: len(v) / len(prompts) for k, v in first.items()}
    assert shares["train"] == pytest.approx(0.7, abs=0.03)
    assert shares["val"] == pytest.approx(0.1, abs=0.02)
    assert shares["test"] == pytest.approx(0.2, abs=0.03)
    assert split_of("prompt 1", seed=1) == split_of("prompt 1", seed=1)
    # A different seed is a different split.
    assert [split_of(p, seed=7) for p in prompts[:200]] != [split_of(p) for p in prompts[:200]]
    assert [fold_of(p, 5) for p in prompts[:100]] == [fold_of(p, 5) for p in prompts[:100]]


def test_no_prompt_in_two_splits(data_dir: Path) -> None:
    # MMLU repeats some prompts across rows; every copy must land in the same split.
    recs = load_mmlu(data_dir) + load_gsm8k(data_dir) + load_mt_bench(data_dir)
    split_by_prompt: dict[str, set[str]] = {}
    for r in recs:
        split_by_prompt.setdefault(r.prompt, set()).add(split_of(r.prompt))
    assert all(len(s) == 1 for s in split_by_prompt.values())
    assert len({r.prompt for r in recs}) < len(recs)  # the duplicates exist, so the check bites
