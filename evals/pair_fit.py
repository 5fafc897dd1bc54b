"""Fit a difficulty head for one model pair from labelled requests (``pointsman train``).

Method: **ridge regression on the quality gain ``strong - weak``, warm-started by a prior data set as
pseudo-rows, hyperparameters by cross-validation, Platt-calibrated.**

- Target: the gain ``strong_q - weak_q`` (not the binary "strong better"): it ranks prompts by expected
  gain, which is what APGR rewards, and it also learns from the prompts where the weak model wins.
- Features: ``build_features(embeddings, texts)`` standardised (weighted mean/std over the new rows and
  the prior at its default weight).
- Prior (:class:`PairPrior`, e.g. the bundled RouteLLM data): its rows enter the least-squares problem
  with a *total* weight of ``m`` pseudo-rows (``m`` in :data:`PRIOR_ROWS`), whatever its size. A fixed
  pseudo-row count (not a share of the new data) is a Bayesian prior: it dominates at 50 labelled
  requests and fades as the new data grows.
- Penalty ``alpha`` (on the sum of squared errors, so it also fades with more rows) and ``m`` are chosen
  by 5-fold cross-validation on the new rows only (the prior is in every training fold, never in a
  validation fold), minimising the out-of-fold squared error of the gain.
- Exported as a ``logreg`` head (coef/intercept = the ridge's), so serving is one dot product. The raw
  probability ``sigmoid(gain estimate)`` is mapped by Platt scaling, fitted on the chosen
  configuration's out-of-fold scores against "strong strictly better" (gain > 0), so column 1 is
  P(strong better) and the ranking is unchanged. Platt is skipped (``method: none``) when that label is
  constant or the fitted slope is not positive, and below 10 rows (no folds to fit it on). A second
  Platt map, of the negated scores against "weak strictly better", is reported for reading the head
  with strong and weak swapped (:mod:`classifiers.heads.reverse`).
- Deterministic given ``seed`` (it only draws the fold assignment).
- Optional ``focus``: tilt the prior's row weights towards prompts that look like the new traffic
  (importance weighting for covariate shift, :func:`_focus_weights`). Off by default (see below).

Why: ``bench/adaptation_research.py``, RouterBench-train GPT-4-1106 vs Mixtral-8x7B (ARC-challenge, MBPP,
Winogrande: out of distribution for the bundled router), 600 held-out prompts, mean APGR over 10 random
draws of 50 / 100 / 200 / 400 / 800 / 1600 labelled requests (95% CIs in /work/issue11/ADAPTATION.md).
Random 0.50 (band 0.43-0.57); the shipped router 0.567 (static) / 0.568 (MiniLM).

==========================================  =====  =====  =====  =====  =====  =====
method                                        50    100    200    400    800   1600
==========================================  =====  =====  =====  =====  =====  =====
plain LR on MiniLM embeddings (reference)   0.536  0.579  0.571  0.573  0.584  0.595
LR (binary label), C by CV, static          0.530  0.553  0.578  0.598  0.598  0.624
kNN mean gain, k by CV, static              0.511  0.533  0.515  0.548  0.537  0.533
ridge-gain, no prior, static                0.513  0.568  0.573  0.581  0.607  0.618
ridge-gain, no prior, MiniLM                0.500  0.545  0.577  0.580  0.608  0.643
**ridge-gain + prior (this), static**       0.553  0.580  0.594  0.605  0.624  0.634
**ridge-gain + prior (this), MiniLM**       0.580  0.598  0.579  0.594  0.620  0.636
ridge-gain + prior, focus 6, static         0.608  0.616  0.602  0.616  0.622  0.632
ridge-gain + prior, focus 6, MiniLM         0.603  0.588  0.563  0.566  0.589  0.643
==========================================  =====  =====  =====  =====  =====  =====

- The prior is the main win: +0.02-0.08 over the same fit without it up to 400 requests, still +0.015 at
  800 (static). It beats the reference at every size from 200 on and reaches >= 0.62 at 800.
- Regressing the gain beat logistic regression on the binary label (same features) at most sizes;
  kNN never learned much; the shipped head's logit as one more feature changed nothing.
- Choosing ``(m, alpha)`` by out-of-fold APGR instead of squared error: no measurable difference
  (within +-0.02 either way, size by size); squared error is kept as the less noisy criterion.
- Focus: +0.03-0.05 for the static encoder at 50-100 requests, but -0.01-0.03 for MiniLM at 200-800
  (MiniLM reads only the first 256 word pieces, here a few-shot preamble shared by all ARC or all
  Winogrande prompts, so its similarities say little about the question); choosing it by CV was no
  better than leaving it off. Hence off by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from classifiers.heads.head import Head

LABELS = ("weak_ok", "strong_needed")
#: Total weight of the prior, in pseudo-rows, tried by cross-validation.
PRIOR_ROWS: tuple[float, ...] = (300.0, 1000.0, 3000.0)
#: The prior weight used for standardisation (shared by every configuration) and when n is too small to CV.
DEFAULT_PRIOR_ROWS = 1000.0
#: Ridge penalties tried with a prior (strong: the prior carries the direction) and without one.
ALPHAS_WITH_PRIOR: tuple[float, ...] = (3e3, 1e4, 3e4, 1e5)
ALPHAS_NO_PRIOR: tuple[float, ...] = (3e2, 1e3, 3e3, 1e4, 3e4, 1e5)
DEFAULT_ALPHA = 1e4
#: How strongly the prior is tilted towards the new traffic (see :func:`_focus_weights`). Off by
#: default: measured, a focus of 6 helped the static encoder at 50-100 requests (+0.03-0.05 APGR) but
#: cost MiniLM 0.01-0.03 at 200-800, and choosing it by CV (0 or 6) was no better than leaving it off.
DEFAULT_FOCUS = 0.0
#: What the prior's weight is by default, for manifests (``--prior-weight`` overrides it, see the fit).
PRIOR_WEIGHT = "chosen by 5-fold CV among 300, 1000 and 3000 pseudo-rows (evals.pair_fit.PRIOR_ROWS)"
FOLDS = 5
MIN_ROWS_FOR_CV = 10


@dataclass(frozen=True)
class PairPrior:
    """Labelled rows used as a prior (warm start), e.g. the bundled data.

    ``x`` must be built like the new rows' features (same encoder, ``build_features``); qualities on the
    same scale as the new data (``[0, 1]``). ``weight`` is relative within the prior: the prior's total
    weight is set by the fit (:data:`PRIOR_ROWS`).
    """

    x: np.ndarray
    strong_q: np.ndarray
    weak_q: np.ndarray
    weight: np.ndarray


@dataclass
class _Moments:
    """Weighted sufficient statistics of (z, y): enough for a ridge fit with an unpenalised intercept."""

    w: float
    z: np.ndarray  # sum w z
    zz: np.ndarray  # sum w z z^T
    y: float  # sum w y
    zy: np.ndarray  # sum w z y

    @classmethod
    def of(cls, z: np.ndarray, y: np.ndarray, w: np.ndarray) -> _Moments:
        wz = z * w[:, None]
        return cls(float(w.sum()), wz.sum(axis=0), z.T @ wz, float(w @ y), wz.T @ y)

    def plus(self, other: _Moments, scale: float) -> _Moments:
        return _Moments(
            self.w + scale * other.w,
            self.z + scale * other.z,
            self.zz + scale * other.zz,
            self.y + scale * other.y,
            self.zy + scale * other.zy,
        )

    def ridge(self, alphas: tuple[float, ...]) -> list[tuple[np.ndarray, float]]:
        """(coef, intercept) per penalty: one eigendecomposition of the centred Gram matrix for all."""
        mz, my = self.z / self.w, self.y / self.w
        gram = self.zz - np.outer(self.z, mz)
        rhs = self.zy - self.z * my
        vals, vecs = np.linalg.eigh((gram + gram.T) / 2)
        proj = vecs.T @ rhs
        out = []
        for a in alphas:
            coef = vecs @ (proj / (np.maximum(vals, 0.0) + a))
            out.append((coef, my - float(mz @ coef)))
        return out


#: Rows per block when a statistic over every row is computed block by block (bounds the temporaries).
_BLOCK_ROWS = 8192


def _standardiser(blocks: tuple[np.ndarray, ...], w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted column mean and standard deviation (1 where a column is constant) over the rows of ``blocks``
    taken in order, as ``np.average`` over their vertical stack computes them, to the bit."""
    rows = sum(len(b) for b in blocks)
    if rows <= _BLOCK_ROWS or blocks[0].shape[1] < 2:
        x = blocks[0] if len(blocks) == 1 else np.vstack(blocks)
        mean = np.average(x, axis=0, weights=w)
        scale = np.sqrt(np.average((x - mean) ** 2, axis=0, weights=w))
    else:
        # Large data: no stacked copy and no full-size temporaries (at 500,000 rows each was a GB).
        total = w.sum()
        mean = _weighted_column_sum(blocks, w, None) / total
        scale = np.sqrt(_weighted_column_sum(blocks, w, mean) / total)
    scale[scale < 1e-8] = 1.0
    return mean, scale


def _weighted_column_sum(blocks: tuple[np.ndarray, ...], w: np.ndarray, centre: np.ndarray | None) -> np.ndarray:
    """``sum_i w_i * row_i`` (``centre`` given: ``w_i * (row_i - centre) ** 2``) over the rows of ``blocks``.

    numpy sums a C-ordered matrix over axis 0 row after row into one accumulator row; each block's sum
    starts from the running total (added into its first row), so the sum is that one, bit for bit.
    """
    acc: np.ndarray | None = None
    offset = 0
    for block in blocks:
        for start in range(0, len(block), _BLOCK_ROWS):
            part = block[start : start + _BLOCK_ROWS]
            if centre is not None:
                part = (part - centre) ** 2
            part = part * w[offset + start : offset + start + len(part), None]
            if acc is not None:
                part[0] += acc
            acc = part.sum(axis=0)
        offset += len(block)
    assert acc is not None
    return acc


def rank_gain(scores: np.ndarray, gain: np.ndarray, weight: np.ndarray) -> float:
    """Weighted mean of ``gain * (percentile(score) - 0.5)``: the area under the routing curve, unnormalised.

    Sending the top ``s`` share of prompts to the strong model over every ``s`` in [0, 1] routes prompt
    ``i`` strong for a share ``percentile_i`` of the sweep, so the quality curve's area is
    ``mean(weak) + mean(gain * percentile)``: this is APGR's numerator up to constants, without dividing
    by the (noisy, possibly tiny) strong-weak gap of a small sample.
    """
    from scipy.stats import rankdata

    # Tied scores share their average rank: a constant scorer earns exactly 0 (random routing).
    pct = (rankdata(scores) - 0.5) / len(scores)
    return float(np.average(gain * (pct - 0.5), weights=weight))


Config = tuple[float, float, float]  # (prior focus beta, prior weight in rows, ridge alpha)
Fit = tuple[np.ndarray, float]  # (coef, intercept)


def _name(cfg: Config) -> str:
    return f"focus={cfg[0]:g},prior_rows={cfg[1]:g},alpha={cfg[2]:g}"


def _embedding_columns(x: np.ndarray) -> int:
    """Leading columns of ``x`` that hold the unit-norm embedding (``build_features`` puts it first).

    The cheap text statistics (``CHEAP_FEATURE_NAMES``) are either appended or absent; an embedding row
    is unit-norm, or zero for a text with no known token (static encoder). 0 when neither layout fits.
    """
    from classifiers.heads.features import CHEAP_FEATURE_NAMES

    for dim in (x.shape[1] - len(CHEAP_FEATURE_NAMES), x.shape[1]):
        if dim <= 0:
            continue
        norms = np.linalg.norm(x[:, :dim], axis=1)
        if np.all((np.abs(norms - 1.0) < 1e-3) | (norms < 1e-6)):
            return dim
    return 0


def _fold_similarity(prior_emb: np.ndarray, emb: np.ndarray, folds: np.ndarray | None) -> np.ndarray:
    """(prior rows, folds) matrix: each prior row's highest cosine similarity to the new rows of each fold.

    One column (all new rows) without folds. Chunked over the prior to bound memory.
    """
    groups = [np.ones(len(emb), dtype=bool)] if folds is None else [folds == f for f in range(FOLDS)]
    out = np.full((len(prior_emb), len(groups)), -1.0)
    e = emb.astype(np.float32)
    for start in range(0, len(prior_emb), 4096):
        sims = prior_emb[start : start + 4096].astype(np.float32) @ e.T
        for j, g in enumerate(groups):
            if g.any():
                out[start : start + 4096, j] = sims[:, g].max(axis=1)
    return out


def _focus_weights(similarity: np.ndarray, base: np.ndarray, beta: float) -> np.ndarray:
    """Prior row weights tilted towards the new traffic: ``base * exp(beta * (u - 1))``, normalised to sum 1.

    ``u`` in (0, 1) is the rank of the row's similarity to its nearest new prompt among the prior's
    rows. Ranks, not raw similarities, so ``beta`` means the same for any encoder and a few outliers
    (a prior prompt identical to one shared preamble) cannot take all the weight: ``beta = 6`` weighs
    the closest rows ``e^6 = 403`` times more than the farthest and keeps an effective sample size of
    ~1/3 of the prior. This is importance weighting for covariate shift: the prior's prompts that look
    like the user's traffic speak for it.
    """
    from scipy.stats import rankdata

    u = (rankdata(similarity) - 0.5) / len(similarity)
    w = base * np.exp(beta * (u - 1.0))
    return np.asarray(w / w.sum())


def inner_folds(n: int, k: int, seed: int, groups: Sequence[str] | None = None) -> np.ndarray:
    """The fold of each of ``n`` rows for choosing the penalty, ``k`` folds fixed by ``seed``; the rows of
    one of ``groups`` (a prompt judged several times) always share a fold, or the fold scoring a prompt
    would have fitted on its copies, and the choice would reward memorising them (a file judging 80
    prompts of pure noise five times each picked the weakest penalty; once each, the strongest). With
    every group distinct (or none given) the folds are those of earlier releases, row by row."""
    rng = np.random.default_rng(seed)
    if groups is None:
        return rng.permutation(np.arange(n) % k)
    if len(groups) != n:
        raise ValueError(f"groups has {len(groups)} entries for {n} rows")
    index: dict[str, int] = {}
    ids = np.array([index.setdefault(g, len(index)) for g in groups])
    if len(index) == n:
        return rng.permutation(np.arange(n) % k)
    return rng.permutation(np.arange(len(index)) % k)[ids]


def fit_pair_difficulty(
    x: np.ndarray,
    strong_q: np.ndarray,
    weak_q: np.ndarray,
    weight: np.ndarray,
    *,
    seed: int,
    prior: PairPrior | None = None,
    prior_weight: float | None = None,
    focus: float = DEFAULT_FOCUS,
    embedding_dim: int | None = None,
    select: str = "mse",
    overwrite_x: bool = False,
    groups: Sequence[str] | None = None,
) -> tuple[Head, dict[str, Any]]:
    """Fit the pair's difficulty head; column 1 of ``predict_proba`` ranks prompts by need for ``strong``.

    Args:
        x: Features, ``classifiers.heads.build_features(embeddings, texts)``.
        strong_q, weak_q: Per-row quality of the strong and the weak model, in [0, 1].
        weight: Per-row weight (>= 0, not all 0).
        seed: Fixes the fold assignment, and so the whole fit.
        prior: Rows used as a warm start (see :class:`PairPrior`).
        prior_weight: Fix the prior's total weight instead of choosing it: this many times the new
            rows' total weight (``0`` turns the prior off). Default: chosen by cross-validation.
        focus: How strongly the prior is focused on the new traffic (``beta`` of
            :func:`_focus_weights`; ``0``, the default, keeps every prior row at its own weight).
        embedding_dim: How many leading columns of ``x`` are the unit-norm embedding (the focus
            measures cosine similarity on them). Default: detected (:func:`_embedding_columns`).
        select: Cross-validation criterion: ``"mse"`` (out-of-fold squared error of the gain; the
            default) or ``"rank"`` (out-of-fold :func:`rank_gain`, kept for the research comparison).
        overwrite_x: ``x`` may be overwritten (standardised in place) when it is already float64; a
            copy of a large ``x`` is a GB at 500,000 rows. Another dtype is converted into a copy anyway.
        groups: Per-row prompt key: rows of one prompt share a cross-validation fold (:func:`inner_folds`).

    Returns:
        The head (kind ``logreg``, labels ``("weak_ok", "strong_needed")``) and a report: the method,
        the chosen ``alpha`` and ``prior_weight_rows``, the prior's size ``prior_rows``, the
        out-of-fold squared error per configuration (``cv_mse``), the out-of-fold ranking score
        (:func:`rank_gain`) of the chosen one, row counts, calibration, and ``reverse_calibration``:
        the Platt map of the negated scores to P(weak strictly better), for reading the head with
        strong and weak swapped (:mod:`classifiers.heads.reverse`).
    """
    # asarray returns the caller's own array when it is float64 already: overwritten only when allowed.
    owned = overwrite_x or not (isinstance(x, np.ndarray) and x.dtype == np.float64)
    x = np.asarray(x, dtype=np.float64)
    strong_q = np.asarray(strong_q, dtype=np.float64)
    weak_q = np.asarray(weak_q, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    n = len(x)
    if not (len(strong_q) == len(weak_q) == len(weight) == n):
        raise ValueError("x, strong_q, weak_q and weight must have the same number of rows")
    if n < 2:
        raise ValueError(f"need at least 2 labelled rows, got {n}")
    if prior_weight is not None and prior_weight < 0:
        raise ValueError(f"prior_weight must be >= 0, got {prior_weight}")
    if focus < 0:
        raise ValueError(f"focus must be >= 0, got {focus}")
    if select not in ("mse", "rank"):
        raise ValueError(f"select must be 'mse' or 'rank', got {select!r}")
    if (weight < 0).any() or weight.sum() <= 0:
        raise ValueError("weights must be >= 0 and not all 0")
    gain = strong_q - weak_q
    has_prior = prior is not None and len(prior.x) > 0 and prior_weight != 0
    folds = inner_folds(n, FOLDS, seed, groups) if n >= MIN_ROWS_FOR_CV else None

    # Standardise over the new rows plus the prior at its default weight (one scale for every config).
    focus_grid: tuple[float, ...] = (0.0,)
    dim = _embedding_columns(x) if embedding_dim is None else embedding_dim
    if prior is not None and has_prior:
        px = np.asarray(prior.x, dtype=np.float64)
        if px.shape[1] != x.shape[1]:
            raise ValueError(f"prior has {px.shape[1]} features, the data {x.shape[1]}")
        pw = np.asarray(prior.weight, dtype=np.float64)
        pw = pw / pw.sum()
        pg = np.asarray(prior.strong_q, dtype=np.float64) - np.asarray(prior.weak_q, dtype=np.float64)
        mean, scale = _standardiser((x, px), np.concatenate([weight, pw * DEFAULT_PRIOR_ROWS]))
        zp = (px - mean) / scale
        grid_m: tuple[float, ...] = PRIOR_ROWS if prior_weight is None else (prior_weight * float(weight.sum()),)
        alphas = ALPHAS_WITH_PRIOR
        if dim > 0 and focus != 0:
            focus_grid = (focus,)
            sims = _fold_similarity(px[:, :dim], x[:, :dim], folds)
    else:
        mean, scale = _standardiser((x,), weight)
        grid_m, alphas = (0.0,), ALPHAS_NO_PRIOR
    # Standardised in place when ``x`` is this function's own float64 copy: the features are not needed
    # again, and a second n x d float64 matrix was a GB at 500,000 rows. The same operations, the same bits.
    if owned:
        x -= mean
        z = x
    else:
        z = x - mean
    z /= scale
    del x
    prior_cache: dict[tuple[int, float], _Moments] = {}

    def prior_moments(fold: int, beta: float) -> _Moments:
        """The prior's moments (total weight 1), focused on the rows outside ``fold`` (-1: all rows)."""
        key = (fold, beta) if beta != 0 else (-2, 0.0)  # unfocused moments do not depend on the fold
        if key not in prior_cache:
            w = pw
            if beta != 0:
                cols = [f for f in range(sims.shape[1]) if f != fold]
                w = _focus_weights(sims[:, cols].max(axis=1), pw, beta)
            prior_cache[key] = _Moments.of(zp, pg, w)
        return prior_cache[key]

    data_cache: dict[int, _Moments] = {}

    def data_moments(rows: np.ndarray, fold: int) -> _Moments:
        """The new rows' moments outside ``fold`` (-1: all rows): one n x d^2 product per fold, shared by
        every prior weight tried (each used to recompute it)."""
        if fold not in data_cache:
            every = fold < 0 and bool(rows.all())  # the final fit: z itself, not a copy of all of it
            data_cache[fold] = _Moments.of(z if every else z[rows], gain[rows], weight[rows])
        return data_cache[fold]

    def solve(rows: np.ndarray, fold: int, m: float, beta: float, alist: tuple[float, ...]) -> list[Fit]:
        mom = data_moments(rows, fold)
        if has_prior and m > 0:
            mom = mom.plus(prior_moments(fold, beta), m)
        return mom.ridge(alist)

    configs = [(b, m, a) for b in focus_grid for m in grid_m for a in alphas]
    cv_mse: dict[str, float] = {}
    oof: dict[Config, np.ndarray] = {}
    if folds is not None:
        for cfg in configs:
            oof[cfg] = np.zeros(n)
        for f in range(FOLDS):
            train, test = folds != f, folds == f
            if weight[train].sum() <= 0:
                continue
            for b in focus_grid:
                for m in grid_m:
                    for a, (coef, icpt) in zip(alphas, solve(train, f, m, b, alphas), strict=True):
                        oof[(b, m, a)][test] = z[test] @ coef + icpt
        for cfg in configs:
            cv_mse[_name(cfg)] = float(np.average((oof[cfg] - gain) ** 2, weights=weight))
        if select == "mse":
            best = min(configs, key=lambda c: cv_mse[_name(c)])  # exact ties: the first in grid order
        else:
            best = max(configs, key=lambda c: rank_gain(oof[c], gain, weight))
    else:
        best = (focus_grid[0], grid_m[0] if len(grid_m) == 1 else DEFAULT_PRIOR_ROWS, DEFAULT_ALPHA)
    b_best, m_best, a_best = best
    coef, intercept = solve(np.ones(n, dtype=bool), -1, m_best, b_best, (a_best,))[0]
    head = Head(
        kind="logreg",
        labels=LABELS,
        params={
            "mean": mean,
            "scale": scale,
            "coef": coef.reshape(1, -1).astype(np.float32),
            "intercept": np.array([intercept], dtype=np.float64),
        },
        config={
            "n_classes": 2,
            "fit": "ridge",
            "target": "gain",
            "alpha": a_best,
            "prior_weight_rows": m_best,
            "prior_focus": b_best,
        },
    )
    scores = oof.get(best)
    head.calibration = _platt_on_scores(scores, gain > 0, weight) if scores is not None else {"method": "none"}
    # The same pair read the other way round (a route naming the weak model strong) ranks by -score;
    # P(weak strictly better) gets its own Platt map, as ties make it no mirror of P(strong better).
    reverse = _platt_on_scores(-scores, gain < 0, weight) if scores is not None else {"method": "none"}
    report: dict[str, Any] = {
        "method": "ridge-gain" + ("+prior" if has_prior else ""),
        "alpha": a_best,
        "prior_weight_rows": m_best,  # the prior's total weight, in rows of the new data's scale
        "prior_weight": "cv" if prior_weight is None or not has_prior else prior_weight,
        "prior_focus": b_best,
        "cv_mse": cv_mse,
        "cv_rank_gain": rank_gain(scores, gain, weight) if scores is not None else None,
        "folds": FOLDS if scores is not None else 0,
        "rows": n,
        "prior_rows": len(prior.x) if prior is not None and has_prior else 0,
        "calibration": head.calibration["method"],
        "reverse_calibration": reverse,
    }
    return head, report


def _platt_on_scores(score: np.ndarray, y: np.ndarray, weight: np.ndarray) -> dict[str, Any]:
    """Platt map from the head's raw probability ``sigmoid(score)`` to P(``y``): P(strong better), or
    with the scores negated P(weak better)."""
    from sklearn.linear_model import LogisticRegression

    if y.min() == y.max():
        return {"method": "none"}
    lr = LogisticRegression(C=1e4, max_iter=1000).fit(score.reshape(-1, 1), y.astype(int), sample_weight=weight)
    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    # logit(sigmoid(score)) == score, so Head's Platt form sigmoid(a * logit(p) + b) applies as is.
    if a > 0:
        return {"method": "platt", "a": a, "b": b}
    # The out-of-fold scores do not separate the label (few or noisy rows). The raw sigmoid of a
    # small gain estimate sits just above 0.5, so a 0.5 threshold would send nearly everything to the
    # strong model: keep the ranking (slope 1) and centre the probabilities on the observed rate.
    rate = float(np.clip(np.average(y, weights=weight), 1e-3, 1 - 1e-3))
    centre = float(np.average(score, weights=weight))
    return {"method": "platt", "a": 1.0, "b": float(np.log(rate / (1 - rate)) - centre), "fallback": "base_rate"}
