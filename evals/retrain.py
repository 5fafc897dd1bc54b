"""``pointsman train --data SRC ... --out REGISTRY``: train router heads from labelled requests into a registry.

What gets trained (per encoder):
- two models in the data (or ``--strong``/``--weak``): the difficulty head for that pair; the strong
  model is the one with the higher mean quality over the requests labelled for both, unless named;
- more models: the per-model quality head (``quality-labelled-<encoder>``, for ``multi_model``
  routes) and the difficulty head of every pair with at least :data:`MIN_PAIR_PROMPTS` prompts labelled
  for both models.

A pair head is fitted by :func:`evals.pair_fit.fit_pair_difficulty` on ``build_features(embedding,
text)`` (embedding only when some request kept no text, only its embedding). Its in-distribution
figure is the k-fold cross-validated APGR over *all* labelled prompts (folds by prompt hash, so a
repeated prompt never sits on both sides), with a bootstrap 95% CI over prompts and the band a random
router reaches on the same prompts.

Warm start (``--warm-start``): the bundled RouteLLM data (GPT-4 vs Mixtral) joins every pair's fit as
a prior at a reduced total weight (``--prior-weight``, relative to the new data's total weight). For the
bundled pair itself that is the same task; for another pair it is a transfer assumption: prompts where
GPT-4 beats Mixtral (multi-step math, hard reasoning) are broadly the ones where a stronger model of any
pair helps. At a tenth of the new data's weight it steadies the first few hundred labels and fades as
labels grow; the cross-validated figure (computed with the prior in every fold) says whether it helped.
The version records whether the prior's pair matched.

Everything is seeded: the same inputs and ``--seed`` give the same weights (``weights_sha256`` in
``version.json``, and the hex part of the version id).
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from classifiers.heads import Head, build_features
from classifiers.heads.reverse import REVERSE_KEY, reversed_pair_head
from classifiers.registry import RegistryError, RouterRegistry, is_registry, model_slugs, pair_artifact
from evals.data.prior import PRIOR_ROWS
from evals.data.split import fold_of
from evals.holdout import describe as describe_holdout
from evals.holdout import split_sources
from evals.labelled import LabelledRequest, LoadedSource, display_spec, encoder_matches, models_of
from evals.metrics import (
    QualityGap,
    ResampledApgr,
    evaluate_scores,
    group_codes,
    quality_gap,
    resample_counts,
)
from evals.trained_rows import write_trained_rows

Log = Callable[[str], None]

#: Rows per block when a large matrix is copied block by block (bounds the temporaries).
_BLOCK_ROWS = 8192

#: A pair needs this many distinct prompts labelled for both models to be trained (and cross-validated):
#: a prompt judged several times is one prompt's evidence, as the CV folds and the promotion gate count it.
MIN_PAIR_PROMPTS = 20
DEFAULT_FOLDS = 5
DEFAULT_RESAMPLES = 1000
QUALITY_SOURCE = "labelled"
QUALITY_C_GRID: tuple[float, ...] = (0.001, 0.01, 0.1)
#: The warm-start prior uses at most this many bundled prompts: all of the shipped sample by default.
PRIOR_MAX_ROWS = PRIOR_ROWS


class TrainError(ValueError):
    """Training cannot proceed as asked (too few labels, unknown model, ...): a usage error."""


# ----------------------------------------------------------------------------- embedding and features


@dataclass
class Embedded:
    """The rows that have a vector for one encoder, their vectors and texts (None when only the
    embedding was stored)."""

    rows: list[LabelledRequest]
    embeddings: np.ndarray
    texts: list[str | None]
    dropped: int = 0

    @property
    def all_text(self) -> bool:
        """Whether every row has its text (then heads get the cheap text statistics too)."""
        return all(t is not None for t in self.texts)

    def features(self, idx: np.ndarray | None = None, cheap: bool | None = None) -> np.ndarray:
        """``build_features`` of ``idx`` (all rows by default); ``cheap`` defaults to :attr:`all_text`."""
        sel = np.arange(len(self.rows)) if idx is None else np.asarray(idx, dtype=int)
        use_cheap = self.all_text if cheap is None else cheap
        if not use_cheap:
            return build_features(self.embeddings[sel])
        texts = [self.texts[i] for i in sel]
        if any(t is None for t in texts):
            raise ValueError("cheap features need every row's text")
        # build_features' matrix (embedding then the cheap statistics, float32), filled in place: its
        # hstack held the selected embeddings twice, half a GB each at 500,000 rows.
        extra = build_features(np.zeros((len(texts), 0), np.float32), [t or "" for t in texts])
        dim = self.embeddings.shape[1]
        out = np.empty((len(sel), dim + extra.shape[1]), dtype=np.float32)
        for start in range(0, len(sel), _BLOCK_ROWS):
            out[start : start + _BLOCK_ROWS, :dim] = self.embeddings[sel[start : start + _BLOCK_ROWS]]
        out[:, dim:] = extra
        return out

    def subset(self, idx: Sequence[int] | np.ndarray) -> Embedded:
        """The rows at ``idx``."""
        sel = np.asarray(idx, dtype=int)
        return Embedded([self.rows[i] for i in sel], self.embeddings[sel], [self.texts[i] for i in sel])


def embed_rows(rows: Sequence[LabelledRequest], encoder: Any, *, progress: bool = True) -> Embedded:
    """Vectors for ``rows`` from ``encoder`` (``evals.embeddings`` contract encoder).

    A stored embedding made by this encoder (its id matches) is used as is; otherwise the text is
    encoded (cached on disk by content). Rows with neither are dropped and counted.
    """
    from evals.embeddings import embed_texts

    keep: list[int] = []
    texts: list[str | None] = []
    to_encode: list[int] = []  # positions in ``keep``
    stored_at: list[tuple[int, np.ndarray]] = []
    dropped = 0
    for i, r in enumerate(rows):
        text = r.text() if r.has_text else None
        stored = r.embedding
        if stored is not None and encoder_matches(r.encoder_id, encoder.id) and stored.shape == (encoder.dim,):
            stored_at.append((len(keep), stored))
        elif text is not None:
            to_encode.append(len(keep))
        else:
            dropped += 1
            continue
        keep.append(i)
        texts.append(text)
    # One matrix filled in place (a dict of per-row vectors and their stacked copy held every vector twice).
    emb = np.zeros((len(keep), encoder.dim), np.float32)
    for k, stored in stored_at:
        emb[k] = stored
    if to_encode:
        emb[to_encode] = embed_texts(encoder, [texts[k] or "" for k in to_encode], progress=progress)
    kept = list(rows) if len(keep) == len(rows) else [rows[i] for i in keep]
    return Embedded(kept, emb, texts, dropped)


def head_features(head: Head, data: Embedded) -> tuple[np.ndarray, np.ndarray]:
    """Features for ``head`` (per its manifest's feature schema) and which rows of ``data`` have them.

    A head trained with the cheap text statistics cannot score rows whose text was not stored.
    """
    cheap = bool(head.manifest.get("feature_schema", {}).get("cheap"))
    ok = np.array([not cheap or t is not None for t in data.texts], dtype=bool)
    return data.features(np.flatnonzero(ok), cheap=cheap), ok


class KeyedRequest(Protocol):
    """What :func:`row_key` reads: a labelled row (``LabelledRequest``) or a logged outcome (``LoggedOutcome``)."""

    @property
    def request_id(self) -> str | None: ...

    @property
    def embedding(self) -> np.ndarray | None: ...

    @property
    def has_text(self) -> bool: ...

    def text(self) -> str: ...


def row_key(r: KeyedRequest) -> str:
    """What identifies a prompt for fold assignment, the hold-out and training-row records: its text, else
    its request id or stored vector."""
    if r.has_text:
        return r.text()
    if r.request_id:
        return f"request:{r.request_id}"
    assert r.embedding is not None
    return "embedding:" + hashlib.sha256(np.ascontiguousarray(r.embedding, np.float32).tobytes()).hexdigest()


# ----------------------------------------------------------------------------- metrics


def safe_apgr(scores: np.ndarray, strong: np.ndarray, weak: np.ndarray) -> float:
    """APGR, or NaN when the two models tie on average (the gap APGR normalises by is zero)."""
    if len(scores) < 2 or abs(float(np.mean(strong)) - float(np.mean(weak))) < 1e-12:
        return float("nan")
    return float(evaluate_scores(scores, strong, weak).apgr)


def bootstrap_apgr(
    scores: np.ndarray,
    strong: np.ndarray,
    weak: np.ndarray,
    *,
    resamples: int,
    seed: int,
    groups: Sequence[object] | None = None,
) -> tuple[float, float]:
    """95% percentile bootstrap CI of APGR over prompts. ``groups`` (each row's prompt, e.g. its
    :func:`row_key`) resamples whole prompts: rows judging one prompt several times are not independent,
    and drawing them one by one makes the interval too narrow. Rows all distinct: the plain bootstrap."""

    fast = ResampledApgr(scores, strong, weak)  # bootstrap()'s draws, each read as row counts
    arr = np.array([fast.apgr(counts) for counts in resample_counts(len(scores), resamples, seed, groups=groups)])
    arr = arr[np.isfinite(arr)]
    if len(arr) == 0:
        return float("nan"), float("nan")
    return float(np.percentile(arr, 2.5)), float(np.percentile(arr, 97.5))


def random_band(
    strong: np.ndarray, weak: np.ndarray, *, resamples: int, seed: int, groups: Sequence[object] | None = None
) -> tuple[float, float]:
    """The 95% band of APGR that random scores reach on these prompts: one score per prompt (``groups``),
    as any router scores a prompt the same each time it comes."""
    rng = np.random.default_rng(seed + 7919)
    codes, m = group_codes(groups, len(strong))
    values = [safe_apgr(rng.random(m)[codes], strong, weak) for _ in range(resamples)]
    arr = np.array(values)
    arr = arr[np.isfinite(arr)]
    if len(arr) == 0:
        return float("nan"), float("nan")
    return float(np.percentile(arr, 2.5)), float(np.percentile(arr, 97.5))


# ----------------------------------------------------------------------------- pairs


def choose_pairs(
    rows: Sequence[LabelledRequest], strong: str | None, weak: str | None, *, min_prompts: int = MIN_PAIR_PROMPTS
) -> tuple[list[tuple[str, str]], list[str]]:
    """The (strong, weak) pairs to train and any notes about pairs left out.

    Raises :class:`TrainError` when the data cannot train what was asked.
    """
    models = models_of(rows)
    if (strong is None) != (weak is None):
        raise TrainError("--strong and --weak go together")
    if strong is not None and weak is not None:
        for name, flag in ((strong, "--strong"), (weak, "--weak")):
            if name not in models:
                raise TrainError(f"{flag} {name!r} has no quality in the data (models: {', '.join(models) or 'none'})")
        if strong == weak:
            raise TrainError("--strong and --weak name the same model")
        n = _prompt_count(r for r in rows if r.labelled_for(strong, weak))
        if n < min_prompts:
            raise TrainError(f"only {n} prompts are labelled for both {strong} and {weak}; need {min_prompts}")
        return [(strong, weak)], []
    if len(models) < 2:
        raise TrainError(
            f"the data has qualities for {len(models)} model(s) ({', '.join(models) or 'none'}); a difficulty "
            "head needs requests labelled for two models"
        )
    pairs: list[tuple[str, str]] = []
    notes: list[str] = []
    for a, b in itertools.combinations(models, 2):
        both = [r for r in rows if r.labelled_for(a, b)]
        n = _prompt_count(both)
        if n < min_prompts:
            notes.append(f"pair {a} / {b}: {n} prompts labelled for both (< {min_prompts}), not trained")
            continue
        mean_a = float(np.mean([r.qualities[a] for r in both]))
        mean_b = float(np.mean([r.qualities[b] for r in both]))
        pairs.append((a, b) if mean_a >= mean_b else (b, a))
    if not pairs:
        raise TrainError("no model pair has enough prompts labelled for both models; " + "; ".join(notes))
    return pairs, notes


def _prompt_count(rows: Iterable[LabelledRequest]) -> int:
    """Distinct prompts among ``rows`` (by :func:`row_key`)."""
    return len({row_key(r) for r in rows})


@dataclass
class PairResult:
    """One trained pair head and its figures."""

    strong: str
    weak: str
    encoder: str
    artifact: str
    head: Head
    metrics: dict[str, Any]
    gap: QualityGap  # the pair's mean quality gap over its labelled prompts (also in ``metrics``)


def _pair_arrays(data: Embedded, strong: str, weak: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    idx = np.array([i for i, r in enumerate(data.rows) if r.labelled_for(strong, weak)], dtype=int)
    qs = np.array([data.rows[i].qualities[strong] for i in idx], dtype=np.float64)
    qw = np.array([data.rows[i].qualities[weak] for i in idx], dtype=np.float64)
    w = np.array([data.rows[i].weight for i in idx], dtype=np.float64)
    return idx, qs, qw, w


def cross_validate_pair(
    x: np.ndarray,
    qs: np.ndarray,
    qw: np.ndarray,
    w: np.ndarray,
    keys: Sequence[str],
    *,
    seed: int,
    folds: int,
    prior: Any,
    prior_weight: float | None,
    progress: bool,
    label: str,
) -> np.ndarray:
    """Out-of-fold P(strong needed) for every row: each scored by a head that never saw its prompt."""
    from tqdm import tqdm

    fold = np.array([fold_of(k, folds, seed) for k in keys])
    oof = np.full(len(x), np.nan)
    for f in tqdm(range(folds), desc=f"cross-validate {label}", unit="fold", disable=not progress, file=sys.stderr):
        test, train = fold == f, fold != f
        if not test.any() or train.sum() < 2:
            continue
        # The fold's rows straight into float64, the fitter's precision (exact), standardised there in place.
        xt = _rows_float64(x, np.flatnonzero(train))
        head, _ = fit_pair(
            xt, qs[train], qw[train], w[train], seed=seed, prior=prior, prior_weight=prior_weight, overwrite_x=True,
            groups=[k for k, kept in zip(keys, train, strict=True) if kept],
        )
        del xt  # standardised in place: no use to anyone, and n x d float64
        oof[test] = head.predict_proba(x[test])[:, 1]
    missing = np.isnan(oof)
    if missing.any():  # a fold that could not be fitted (tiny data): those rows get the neutral score
        oof[missing] = 0.5
    return oof


def _rows_float64(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``x[idx]`` as float64, block by block (no float32 copy of the selection on the way)."""
    out = np.empty((len(idx), x.shape[1]), dtype=np.float64)
    for start in range(0, len(idx), _BLOCK_ROWS):
        out[start : start + _BLOCK_ROWS] = x[idx[start : start + _BLOCK_ROWS]]
    return out


def train_pair(
    data: Embedded,
    strong: str,
    weak: str,
    encoder_name: str,
    encoder_id: str,
    *,
    seed: int,
    folds: int,
    resamples: int,
    prior: Any,
    prior_weight: float | None,
    prior_info: dict[str, Any] | None,
    sources: list[dict[str, Any]],
    progress: bool,
    log: Log,
    slugs: Mapping[str, str] | None = None,
) -> PairResult:
    """Cross-validate, then fit on every labelled prompt, the difficulty head of ``strong`` vs ``weak``.

    ``slugs`` (:func:`classifiers.registry.model_slugs` over every model trained in the run) names the
    head's directory, so two models whose names slug alike never share one.
    """
    from evals.train import created_at, feature_schema

    idx, qs, qw, w = _pair_arrays(data, strong, weak)
    cheap = all(data.texts[i] is not None for i in idx)
    x = data.features(idx, cheap=cheap)
    # A row's key is its text when it has one (row_key), already rendered by embed_rows.
    keys = [t if (t := data.texts[i]) is not None else row_key(data.rows[i]) for i in idx]
    k = max(2, min(folds, len(idx)))
    # Rows labelled for both models may judge one prompt several times: the prompts are what the CV folds,
    # the bootstrap and the random band count (by key), so they are what the figure is "over".
    prompts = len(set(keys))
    label = f"{strong} vs {weak} [{encoder_name}]"
    t0 = time.perf_counter()
    oof = cross_validate_pair(
        x, qs, qw, w, keys, seed=seed, folds=k, prior=prior, prior_weight=prior_weight, progress=progress, label=label
    )
    apgr = safe_apgr(oof, qs, qw)
    lo, hi = bootstrap_apgr(oof, qs, qw, resamples=resamples, seed=seed, groups=keys)
    r_lo, r_hi = random_band(qs, qw, resamples=min(resamples, 500), seed=seed, groups=keys)
    head, fit_report = fit_pair(x, qs, qw, w, seed=seed, prior=prior, prior_weight=prior_weight, groups=keys)
    reverse_calibration = fit_report.pop("reverse_calibration", {"method": "none"})
    gap = quality_gap(qs, qw)
    metrics: dict[str, Any] = {
        "rows": len(idx),  # rows labelled for both models
        "prompts": prompts,  # the distinct prompts among them
        "folds": k,
        "cv_apgr": _round(apgr),
        "cv_apgr_ci95": [_round(lo), _round(hi)],
        "random_apgr_band95": [_round(r_lo), _round(r_hi)],
        "bootstrap_resamples": resamples,
        "mean_quality": {"strong": _round(float(qs.mean())), "weak": _round(float(qw.mean()))},
        "quality_gap": {"value": _round(gap.value), "ci95": [_round(gap.lo), _round(gap.hi)],
                        "resolved": not gap.unresolved},
        "strong_better_share": _round(float(np.mean(qs > qw))),
        "weak_better_share": _round(float(np.mean(qw > qs))),
        "fit": fit_report,
        "figure": "k-fold cross-validated APGR over every labelled prompt (folds by prompt hash), "
        "bootstrap 95% CI over prompts; random_apgr_band95 = what random scores reach on the same prompts",
    }
    log(
        f"  {label}: {labelled_count(prompts, len(idx))}, {k}-fold CV APGR "
        f"{with_interval(metrics['cv_apgr'], metrics['cv_apgr_ci95'])} "
        f"(random {_fmt(metrics['random_apgr_band95'][0])} to {_fmt(metrics['random_apgr_band95'][1])}) "
        f"in {time.perf_counter() - t0:.0f}s"
    )
    artifact = pair_artifact(strong, weak, encoder_name, slugs)
    head.manifest = {
        "name": artifact,
        "task": "difficulty",
        "description": f"P(strong model needed) for {strong} (strong) vs {weak} (weak)",
        "model_pair": {"strong": strong, "weak": weak},
        "positive_label": "strong_needed",
        "label_definition": "quality gain strong - weak on labelled requests (qualities in [0, 1])",
        "encoder": encoder_id,
        "feature_schema": feature_schema(encoder_id, int(data.embeddings.shape[1]), cheap),
        "data": {
            "sources": sources,
            "rows": len(idx),
            "prompts": prompts,
            "train_sha256": hashlib.sha256(
                "\n".join(sorted(keys)).encode() + qs.tobytes() + qw.tobytes() + w.tobytes()
            ).hexdigest(),
            "prior": prior_info,
        },
        "metrics": metrics,
        # How this head's scores spread over the labelled prompts: a target_strong_share knob starts
        # calibrated from them (policies.knob.distribution_seed) instead of at 1 - target. The head's
        # own scores, not the out-of-fold ones: five fold heads smear the distribution (measured on
        # RouterBench GPT-4 vs Mixtral halves, target 0.1 / 0.3 / 0.5: held-out strong shares 0.086 /
        # 0.277 / 0.463 from these, 0.0 / 0.385 / 0.406 from the out-of-fold scores).
        "score_quantiles": score_quantiles(head, x),
        "created_at": created_at(),
    }
    # A route may name the pair the other way round (its dearer model strong, though this data says the
    # other does better): what reading the head reversed needs, so that route serves instead of failing.
    head.manifest[REVERSE_KEY] = {
        "of": f"reading this head as {weak} (strong) vs {strong} (weak): calibration of the negated score "
        "to P(weak model strictly better), fitted on the same out-of-fold scores, and its score quantiles",
        "calibration": reverse_calibration,
    }
    head.manifest[REVERSE_KEY]["score_quantiles"] = score_quantiles(reversed_pair_head(head), x)
    return PairResult(strong, weak, encoder_name, artifact, head, metrics, gap)


def labelled_count(prompts: int, rows: int) -> str:
    """``24 labelled prompts (30 rows labelled for both models)``: a pair's distinct prompts and its rows."""
    return f"{prompts} labelled prompt{'s' if prompts != 1 else ''} ({rows} row{'s' if rows != 1 else ''} " \
        "labelled for both models)"


def score_quantiles(head: Head, x: np.ndarray) -> dict[str, Any]:
    """How ``head``'s P(strong needed) spreads over the rows ``x``, at 0%, 1%, ..., 100%."""
    values = np.quantile(head.predict_proba(x)[:, 1], np.linspace(0.0, 1.0, 101))
    return {
        "of": "this head's P(strong needed) over its labelled prompts, at 0%, 1%, ..., 100%",
        "values": [round(float(v), 6) for v in values],
    }


def _round(v: float) -> float | None:
    return None if not np.isfinite(v) else round(float(v), 4)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def with_interval(value: float | None, interval: Sequence[float | None]) -> str:
    """``0.612 [95% CI 0.571 to 0.650]``, or ``n/a`` alone (an interval beside a missing value means nothing;
    "to" rather than a hyphen, which reads as a minus beside negative bounds)."""
    if value is None:
        return "n/a"
    return f"{value:.3f} [95% CI {_fmt(interval[0])} to {_fmt(interval[1])}]"


# ----------------------------------------------------------------------------- quality head (> 2 models)


def train_quality_head(
    data: Embedded,
    models: Sequence[str],
    encoder_name: str,
    encoder_id: str,
    *,
    seed: int,
    folds: int,
    sources: list[dict[str, Any]],
    progress: bool,
    log: Log,
) -> Head:
    """The per-model quality head (``multilabel``) of ``evals.quality``, from labelled requests.

    Qualities are binarised at 0.5 (a judge's tie counts as not good). C is chosen by the mean
    cross-validated AUC over models; Platt scaling per model is fitted on the out-of-fold scores.
    """
    from tqdm import tqdm

    from classifiers.heads.fit import fit_multilabel
    from classifiers.provider import QUALITY_ARTIFACT
    from evals.quality import roc_auc
    from evals.train import created_at, feature_schema

    y = np.array([[np.nan if r.qualities.get(m) is None else r.qualities[m] for m in models] for r in data.rows])
    x = data.features()
    fold = np.array([fold_of(row_key(r), folds, seed) for r in data.rows])
    best: tuple[float, float, np.ndarray] | None = None
    tried: dict[str, float] = {}
    for c in QUALITY_C_GRID:
        oof = np.full(y.shape, np.nan)
        for f in tqdm(range(folds), desc=f"quality head C={c:g}", unit="fold", disable=not progress, file=sys.stderr):
            test, train = fold == f, fold != f
            if not test.any() or not train.any():
                continue
            head = fit_multilabel(x[train], y[train], list(models), C=c, seed=seed)
            oof[test] = head.raw_proba(x[test])
        aucs = []
        for j in range(len(models)):
            known = ~np.isnan(y[:, j]) & ~np.isnan(oof[:, j])
            aucs.append(roc_auc(y[known, j] > 0.5, oof[known, j]))
        mean_auc = float(np.nanmean(aucs)) if np.isfinite(aucs).any() else float("nan")
        tried[f"C={c:g}"] = _round(mean_auc) or 0.0
        if best is None or (np.isfinite(mean_auc) and mean_auc > best[0]):
            best = (mean_auc, c, oof)
    assert best is not None
    mean_auc, chosen, oof = best
    head = fit_multilabel(x, y, list(models), C=chosen, seed=seed)
    head.calibration = _platt_per_label(oof, y)
    per_model = {}
    for j, m in enumerate(models):
        known = ~np.isnan(y[:, j]) & ~np.isnan(oof[:, j])
        per_model[m] = {"cv_auc": _round(roc_auc(y[known, j] > 0.5, oof[known, j])), "rows": int(known.sum())}
    costs = {m: [r.costs[m] for r in data.rows if m in r.costs] for m in models}
    log(f"  quality head [{encoder_name}]: {len(models)} models, CV mean AUC {mean_auc:.3f} (C={chosen:g})")
    head.manifest = {
        "name": QUALITY_ARTIFACT.format(source=QUALITY_SOURCE, encoder=encoder_name),
        "task": "quality",
        "signal": "quality",
        "description": "P(the model answers this conversation well), per model, from labelled requests",
        "label_definition": "positive = the model's quality on the request > 0.5; unknown qualities skipped",
        "encoder": encoder_id,
        "feature_schema": feature_schema(encoder_id, int(data.embeddings.shape[1]), data.all_text),
        "data": {"sources": sources, "rows": len(data.rows)},
        "model_costs": {
            "unit": "USD per call, mean over the labelled requests that give one (usable as multi_model.costs)",
            "values": {m: float(f"{np.mean(v):.4g}") for m, v in costs.items() if v},
        },
        "metrics": {"cv_mean_auc": _round(mean_auc), "cv_mean_auc_by_C": tried, "chosen_C": chosen,
                    "per_model": per_model, "folds": folds},
        "created_at": created_at(),
    }
    return head


def _platt_per_label(scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    eps = 1e-7
    a_list, b_list = [], []
    for j in range(y.shape[1]):
        known = ~np.isnan(y[:, j]) & ~np.isnan(scores[:, j])
        target = y[known, j] > 0.5
        a, b = 1.0, 0.0
        if known.sum() >= 10 and target.any() and not target.all():
            p = np.clip(scores[known, j], eps, 1 - eps)
            lr = LogisticRegression(C=1e4, max_iter=1000).fit(np.log(p / (1 - p)).reshape(-1, 1), target.astype(int))
            if lr.coef_[0, 0] > 0:  # a decreasing map would invert the ranking: keep the raw score
                a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
        a_list.append(a)
        b_list.append(b)
    return {"method": "platt_per_label", "a": a_list, "b": b_list}


# ----------------------------------------------------------------------------- the whole run


@dataclass
class TrainOptions:
    """What ``pointsman train --data ...`` was asked to do."""

    sources: list[str]
    encoders: list[str]
    out: Path
    strong: str | None = None
    weak: str | None = None
    warm_start: bool | None = None  # None: on (the shipped prior), off only if it cannot be read
    prior_weight: float | None = None
    seed: int = 0
    folds: int = DEFAULT_FOLDS
    resamples: int = DEFAULT_RESAMPLES
    data_dir: str | None = None
    prior_rows: int = PRIOR_MAX_ROWS  # at most this many bundled prompts in the warm-start prior
    progress: bool = True
    argv: list[str] = field(default_factory=list)
    holdout: float | None = None  # keep this fraction of every source out of training (evals.holdout)


@dataclass
class TrainResult:
    """The version written and whether it is active."""

    version: str
    active: bool
    registry: Path
    pairs: list[PairResult]
    info: dict[str, Any]


def _prior(
    opts: TrainOptions, encoder: Any, strong: str, weak: str, cheap: bool, loaded_bundled: bool, log: Log
) -> tuple[Any, dict[str, Any] | None, list[LabelledRequest]]:
    """The warm-start prior for one pair (bundled data as a ``PairPrior``), what the version records about
    it, and its rows (trained on too); (None, None, []) without one."""
    if opts.warm_start is False:
        return None, None, []
    from evals.data import STRONG, WEAK
    from evals.data.prior import PRIOR_FILE, load_prior_rows, sample_rows
    from evals.pair_fit import PRIOR_WEIGHT, PairPrior

    matches = (strong, weak) == (STRONG, WEAK)
    if matches and loaded_bundled:
        log(f"  warm start skipped for {strong} vs {weak}: the bundled data is already training data")
        return None, {"source": "bundled", "used": False, "reason": "bundled data is training data"}, []
    try:
        # The sample that ships in the package (evals/data/prior): the same prior on every install.
        rows = load_prior_rows()
    except OSError as exc:  # a broken install: say so, and train without a prior unless it was asked for
        if opts.warm_start is None:
            log(f"  no warm start for {strong} vs {weak}: the shipped prior {PRIOR_FILE} cannot be read ({exc})")
            return None, {"source": "bundled", "used": False, "reason": f"cannot read {PRIOR_FILE}"}, []
        raise TrainError(f"--warm-start needs the shipped prior {PRIOR_FILE}: {exc}") from exc
    # Fewer rows on request (a seeded sample): the prior's total weight is fixed anyway, and every fit
    # (one per CV fold and penalty) pays for each prior row.
    rows = sample_rows(rows, opts.prior_rows, opts.seed)
    emb = embed_rows(rows, encoder, progress=opts.progress)
    x = emb.features(cheap=cheap)
    qs = np.array([r.qualities[STRONG] for r in emb.rows], dtype=np.float64)
    qw = np.array([r.qualities[WEAK] for r in emb.rows], dtype=np.float64)
    prior = PairPrior(x=x, strong_q=qs, weak_q=qw, weight=np.ones(len(qs)))
    info = {
        "source": "bundled",
        "used": True,
        "pair": {"strong": STRONG, "weak": WEAK},
        "matches_pair": matches,
        "rows": len(qs),
        "sampled_from": "a seeded sample of the bundled RouteLLM prompts (MMLU, GSM8K, MT-bench)",
        "weight": PRIOR_WEIGHT if opts.prior_weight is None else opts.prior_weight,
        "weight_meaning": "total weight of the prior relative to the new data's total weight",
    }
    return prior, info, list(emb.rows)


def train_registry_version(opts: TrainOptions, log: Log = print) -> TrainResult:
    """Load, embed, train and write one registry version (see the module docstring).

    ``--out`` is checked before the long part (a registry that cannot be written fails at once, not after
    the training). A run that fails or is interrupted leaves no trace: its staging directory is removed,
    and so is a registry it created itself that nothing else has written a version into since (a run
    killed outright leaves its staging directory, which ``pointsman registry prune`` removes).
    Raises :class:`TrainError` (and ``DataError``, ``RegistryError``: all ``ValueError``) for what the
    user can fix, each one line naming the option, file or field.
    """
    from evals.embeddings import get_encoder
    from evals.labelled import load_source
    from evals.train import created_at

    registry = RouterRegistry(opts.out)
    out = Path(opts.out)
    try:
        foreign = not is_registry(out) and out.exists() and (not out.is_dir() or any(out.iterdir()))
    except OSError as exc:
        raise TrainError(f"--out {out}: cannot read it ({exc.strerror})") from None
    if foreign:
        raise TrainError(
            f"--out {out} exists and is not a router registry (no registry.json); give a registry, or a new or "
            "empty directory"
        )
    try:
        registry.check_writable()
    except RegistryError as exc:
        raise TrainError(f"--out {out}: {exc}") from None
    # What this run would create, so a failed run can take it away again (never what was there before).
    was_registry, existed = is_registry(out), out.exists()
    new_parents = [p for p in out.absolute().parents if not p.exists()]
    if opts.prior_weight is not None:
        _check_prior_weight_supported()
    loaded: list[LoadedSource] = []
    for spec in opts.sources:
        log(f"loading {display_spec(spec)}")
        src = load_source(spec, data_dir=opts.data_dir)
        skipped = f" (skipped: {src.skipped})" if src.skipped else ""
        weightless = sum(r.weight == 0 for r in src.rows)
        zero = f" ({weightless} with weight 0: not trained on)" if weightless else ""
        read = f"{len(src.rows)} row{'s' if len(src.rows) != 1 else ''}"
        log(f"  {read}{zero}, models: {', '.join(models_of(src.rows)) or 'none'}{skipped}")
        loaded.append(src)
    if opts.holdout is not None:
        kept = split_sources(loaded, opts.holdout, "train")
        total, train_rows = sum(len(s.rows) for s in loaded), sum(len(s.rows) for s in kept)
        log(f"  --holdout {opts.holdout:g}: {total - train_rows} of {total} rows held out for the "
            "gate, training on the other " + str(train_rows))
        loaded = kept
    # A request of weight 0 teaches a head nothing: it is no training row, so it counts toward no pair's
    # minimum and is not recorded as trained on (the gate and pointsman eval may grade on it).
    rows = [r for src in loaded for r in src.rows if r.weight > 0]
    if not rows and any(src.rows for src in loaded):
        named = ", ".join(display_spec(src.spec) for src in loaded)
        raise TrainError(f"{named}: every labelled request has weight 0; there is nothing to train on")
    sources = [src.describe() for src in loaded]
    pairs, notes = choose_pairs(rows, opts.strong, opts.weak)
    for note in notes:
        log(f"  {note}")
    models = models_of(rows)
    multi = opts.strong is None and len(models) > 2
    slugs = model_slugs({m for pair in pairs for m in pair})
    staging: Path | None = None
    results: list[PairResult] = []
    metrics: dict[str, Any] = {"pairs": [], "quality": {}}
    encoder_ids: dict[str, str] = {}
    loaded_bundled = any(s == "bundled" for s in opts.sources)
    # Every request a head was fitted on (the prior's too): the gate leaves these out of its held-out data.
    trained_on: list[LabelledRequest] = list(rows)
    prior_recorded = False
    try:
        staging = registry.staging_dir()
        for name in opts.encoders:
            log(f"[{name}] loading the encoder and embedding {len(rows)} rows")
            encoder = get_encoder(name)
            encoder_ids[name] = encoder.id
            data = embed_rows(rows, encoder, progress=opts.progress)
            if data.dropped:
                log(f"  {data.dropped} rows have no text and no {encoder.id} embedding: left out")
            for strong, weak in pairs:
                idx = [i for i, r in enumerate(data.rows) if r.labelled_for(strong, weak)]
                usable = _prompt_count(data.rows[i] for i in idx)
                if usable < MIN_PAIR_PROMPTS:
                    raise TrainError(
                        f"{strong} vs {weak}: only {usable} labelled prompts usable with encoder {name}"
                    )
                cheap = all(data.texts[i] is not None for i in idx)
                prior, prior_info, prior_rows = _prior(opts, encoder, strong, weak, cheap, loaded_bundled, log)
                if prior_rows and not prior_recorded:  # the same seeded sample for every pair and encoder
                    trained_on.extend(prior_rows)
                    prior_recorded = True
                result = train_pair(
                    data, strong, weak, name, encoder.id, seed=opts.seed, folds=opts.folds,
                    resamples=opts.resamples, prior=prior, prior_weight=opts.prior_weight, prior_info=prior_info,
                    sources=sources, progress=opts.progress, log=log, slugs=slugs,
                )
                result.head.save(staging / result.artifact)
                results.append(result)
                metrics["pairs"].append(
                    {"strong": strong, "weak": weak, "encoder": name, "artifact": result.artifact, **result.metrics}
                )
            if multi:
                head = train_quality_head(
                    data, models, name, encoder.id, seed=opts.seed, folds=opts.folds, sources=sources,
                    progress=opts.progress, log=log,
                )
                head.save(staging / str(head.manifest["name"]))
                metrics["quality"][name] = {"artifact": head.manifest["name"], **head.manifest["metrics"]}
        info: dict[str, Any] = {
            "created_at": created_at(),
            "data": sources,
            "metrics": metrics,
            "encoders": list(opts.encoders),
            "encoder_ids": encoder_ids,
            "pairs": [{"strong": r.strong, "weak": r.weak, "artifact": r.artifact, "encoder": r.encoder}
                      for r in results],
            "models": models,
            "training": {"seed": opts.seed, "folds": opts.folds, "warm_start": opts.warm_start,
                         "prior_weight": opts.prior_weight, "argv": [display_spec(a) for a in opts.argv]},
        }
        if opts.holdout is not None:
            info["holdout"] = describe_holdout(opts.holdout)
        info["trained_rows"] = write_trained_rows(staging, trained_on)
        version = registry.add_version(staging, info)
    except BaseException:
        if staging is not None:
            registry.discard_staging(staging)
        if not was_registry:
            _discard_new_registry(registry, existed, new_parents)
        raise
    # The parent is the version that was active when this one was added (read under the registry's lock, so
    # a concurrent run's first version counts); none means this one is the first, made active as it was added.
    info["parent"] = registry.info(version).parent
    return TrainResult(version, info["parent"] is None, Path(opts.out), results, info)


def _discard_new_registry(registry: RouterRegistry, existed: bool, new_parents: Sequence[Path]) -> None:
    """Take away the registry a failed run created (when it holds no version), and the parent directories
    the run created for it; an empty directory given as ``--out`` stays."""
    try:
        if not registry.remove_if_unused(keep_directory=existed) or existed:
            return
    except RegistryError:
        return  # best effort: the run's own error is the one to report
    for parent in new_parents:  # nearest first
        try:
            parent.rmdir()
        except OSError:
            return


def _check_prior_weight_supported() -> None:
    import inspect

    from evals.pair_fit import fit_pair_difficulty

    if "prior_weight" not in inspect.signature(fit_pair_difficulty).parameters:
        raise TrainError("--prior-weight is not supported by this build's pair fitter (evals.pair_fit)")


def fit_pair(
    x: np.ndarray,
    qs: np.ndarray,
    qw: np.ndarray,
    w: np.ndarray,
    *,
    seed: int,
    prior: Any = None,
    prior_weight: float | None = None,
    overwrite_x: bool = False,
    groups: Sequence[str] | None = None,
) -> tuple[Head, dict[str, Any]]:
    """:func:`evals.pair_fit.fit_pair_difficulty`, passing ``prior_weight`` only when one was asked for
    (and ``overwrite_x``, which lets it standardise a float64 ``x`` in place, only when set); ``groups``
    (each row's prompt key) keeps a prompt's rows in one fold of its penalty choice."""
    from evals.pair_fit import fit_pair_difficulty

    extra: dict[str, Any] = {} if prior is None or prior_weight is None else {"prior_weight": prior_weight}
    if overwrite_x:
        extra["overwrite_x"] = True
    return fit_pair_difficulty(x, qs, qw, w, seed=seed, prior=prior, groups=groups, **extra)
