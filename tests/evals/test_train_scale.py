"""``pointsman train`` on large labelled files: memory stays near the data's own size, results unchanged.

At 500,000 rows every extra copy of the feature matrix is a GB: the pair fit used to hold the features as
float64 several times over (a stacked copy with the prior, full-size temporaries of the weighted mean and
spread, a standardised copy), and the embedding cache read every list it had ever cached, whole, to find
a few vectors. These tests measure allocations with tracemalloc (numpy reports its buffers to it), not time.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evals.embeddings
from evals.embeddings import embed_texts, get_encoder
from evals.pair_fit import PairPrior, fit_pair_difficulty


def _peak_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _rows(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    strong = (rng.random(n) < 0.8).astype(float)
    weak = (rng.random(n) < np.where(x[:, 0] > 0, 0.2, 0.8)).astype(float)
    return x, strong, weak


def test_pair_fit_with_a_prior_holds_the_features_about_twice_not_five_times() -> None:
    # 30,000 rows x 200 features: 48 MB as float64, the fitter's precision.
    x, s, w = _rows(30_000, 200, seed=1)
    px, ps, pw = _rows(3_000, 200, seed=2)
    prior = PairPrior(x=px, strong_q=ps, weak_q=pw, weight=np.ones(len(px)))
    (head, report), peak = _peak_bytes(lambda: fit_pair_difficulty(x, s, w, np.ones(len(x)), seed=0, prior=prior))
    x64 = x.size * 8
    # The float64 features standardised in place, plus one fold's rows and their weighted copy (2 x 0.8);
    # it used to be over 5x (stacked with the prior, the mean's and the spread's temporaries, a copy).
    assert peak < 3.0 * x64, f"peak {peak / 2**20:.0f} MB for {x64 / 2**20:.0f} MB of float64 features"
    assert report["rows"] == 30_000 and report["method"] == "ridge-gain+prior"
    assert head.predict_proba(x[:5].astype(np.float64)).shape == (5, 2)


def test_pair_fit_leaves_a_float64_input_as_it_was_and_in_place_fits_alike() -> None:
    x, s, w = _rows(12_000, 40, seed=3)
    x64 = x.astype(np.float64)
    before = x64.copy()
    head, report = fit_pair_difficulty(x64, s, w, np.ones(len(x)), seed=0)
    assert np.array_equal(x64, before)  # the caller's features are not standardised under it
    scratch = x.astype(np.float64)
    head2, report2 = fit_pair_difficulty(scratch, s, w, np.ones(len(x)), seed=0, overwrite_x=True)
    head3, _ = fit_pair_difficulty(x, s, w, np.ones(len(x)), seed=0)  # float32: converted into its own copy
    for other in (head2, head3):
        for key in ("mean", "scale", "coef", "intercept"):
            assert np.array_equal(head.params[key], other.params[key]), key
    assert report["cv_mse"] == report2["cv_mse"]


def test_blockwise_standardiser_has_the_bits_of_np_average_over_the_stacked_rows() -> None:
    from evals.pair_fit import _standardiser

    rng = np.random.default_rng(5)
    x = rng.normal(size=(20_001, 33)) * rng.random((20_001, 1)) * 100
    px = rng.normal(size=(3_000, 33))
    w = rng.random(len(x) + len(px))
    stacked = np.vstack([x, px])
    mean = np.average(stacked, axis=0, weights=w)
    scale = np.sqrt(np.average((stacked - mean) ** 2, axis=0, weights=w))
    got_mean, got_scale = _standardiser((x, px), w)
    assert np.array_equal(got_mean, mean) and np.array_equal(got_scale, scale)


def test_embedding_cache_reads_only_the_vectors_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evals.embeddings, "CACHE_DIR", tmp_path / "embeddings")
    encoder = get_encoder("static")
    old = [f"earlier training file, request {i}: how do I sort a list of {i} numbers?" for i in range(40_000)]
    cached = embed_texts(encoder, old, progress=False)  # a big list cached by an earlier run
    new = [old[7], "a prompt never seen before", old[39_999], "another new one"]
    got, peak = _peak_bytes(lambda: embed_texts(encoder, new, progress=False))
    assert np.array_equal(got[[0, 2]], cached[[7, 39_999]])
    assert np.array_equal(got[[1, 3]], np.asarray(encoder.encode([new[1], new[3]]), dtype=np.float32))
    # The earlier list's vectors are 40,000 x dim float32; reading them all used to be the peak.
    assert peak < cached.nbytes / 4, f"peak {peak / 2**20:.1f} MB, cached list {cached.nbytes / 2**20:.1f} MB"
