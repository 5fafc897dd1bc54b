"""Difficulty heads: P(the strong model is needed) for a routed pair, trained on RouteLLM data.

Candidates (all on embedding + cheap text features, standardised):
- ``logreg``: logistic regression on the binary label ``strong_needed``.
- ``ridge``: ridge regression on the quality gain (strong - weak; MT-bench judge scores divided by 9 so
  every data set spans [-1, 1]). It ranks by expected gain, which is what APGR rewards, and uses the
  prompts where the weak model wins too. Exported as a linear head; Platt scaling on validation turns
  its score into P(strong needed).
- ``mlp``: one hidden layer, early stopping.
- ``knn``: cosine kNN label rate over the training prompts (the index holds training prompts only).
- ``grouped``: group priors learned on train only. The training prompts' groups (MMLU subject, GSM8K,
  MT-bench category: metadata, never an input at serving time) give centroids and smoothed mean gains;
  a prompt's score is the softmax(cosine / tau)-weighted group gain, plus per data family a ridge expert
  on the residual, weighted by the gate's mass on that family. Pools the noisy per-prompt labels the way
  a subject prior does, and lets GSM8K-like prompts get a GSM8K-specific ranking. ``gate="logreg"``
  learns the gate instead: a multinomial logistic regression over the groups on the unit embedding
  (the same softmax form, so the serving head is unchanged); it places MMLU prompts in their subject
  better than the nearest centroid does (held-out MMLU APGR +0.015, see bench/README.md).
- ``gbm``: histogram gradient boosting (bench only: not exportable without pickle).

Selection uses 5-fold cross-validation inside train+validation (the test split is never touched);
the chosen candidate is refitted on train and calibrated on validation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from classifiers.heads.fit import fit_head
from classifiers.heads.head import Head
from evals.data.split import fold_of
from evals.dataset import PairData
from evals.metrics import evaluate_scores

LABELS = ("weak_ok", "strong_needed")
EVAL_DATASETS = ("mmlu", "gsm8k")


@dataclass(frozen=True)
class Candidate:
    """One head configuration to try."""

    kind: str  # logreg | ridge | mlp | knn | gbm
    hyper: dict[str, Any] = field(default_factory=dict)
    features: str = "emb+cheap"  # "emb" | "emb+cheap"

    @property
    def name(self) -> str:
        """Readable id, e.g. ``ridge(alpha=30)``."""
        hp = ",".join(f"{k}={v}" for k, v in self.hyper.items())
        return f"{self.kind}({hp})" + ("" if self.features == "emb+cheap" else f"[{self.features}]")

    @property
    def exportable(self) -> bool:
        """Whether the head can be saved as manifest + npz."""
        return self.kind != "gbm"


DEFAULT_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("logreg", {"C": 0.003}),
    Candidate("logreg", {"C": 0.03}),
    Candidate("ridge", {"alpha": 30.0}),
    Candidate("ridge", {"alpha": 300.0}),
    Candidate("mlp", {"hidden": (64,), "alpha": 10.0}),
    Candidate("knn", {"k": 100}, features="emb"),
    Candidate("grouped", {"tau": 0.02, "alpha": 3000.0}),
    Candidate("grouped", {"tau": 0.05, "alpha": 3000.0}),
    Candidate("grouped", {"gate": "logreg", "C": 10.0, "alpha": 3000.0}),
)


def gain_target(data: PairData) -> np.ndarray:
    """Strong minus weak quality, with MT-bench's 1-10 judge scale mapped onto [-1, 1]."""
    g = data.strong - data.weak
    return np.where(data.dataset == "mt_bench", g / 9.0, g)


def _features(data: PairData, cand: Candidate) -> np.ndarray:
    return data.embeddings if cand.features == "emb" else data.features


class FittedDifficulty:
    """A fitted candidate: scores rows with a numpy head (exportable kinds) or a scikit-learn model."""

    def __init__(self, cand: Candidate, head: Head | None, model: Any) -> None:
        self.cand, self.head, self.model = cand, head, model

    def score(self, x: np.ndarray) -> np.ndarray:
        """Calibrated P(strong needed) when calibrated, else a monotone raw score."""
        if self.head is not None:
            return self.head.predict_proba(x)[:, 1]
        return np.asarray(self.model.predict_proba(x)[:, 1])


def fit_candidate(cand: Candidate, data: PairData, rows: np.ndarray, seed: int) -> FittedDifficulty:
    """Fit ``cand`` on ``rows`` (boolean mask or indices) of ``data``."""
    x = _features(data, cand)[rows]
    if cand.kind == "ridge":
        from sklearn.linear_model import Ridge

        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale[scale < 1e-8] = 1.0
        model = Ridge(alpha=float(cand.hyper["alpha"])).fit((x - mean) / scale, gain_target(data)[rows])
        head = Head(
            kind="logreg",
            labels=LABELS,
            params={
                "mean": mean,
                "scale": scale,
                "coef": model.coef_.reshape(1, -1).astype(np.float32),
                "intercept": np.array([model.intercept_], dtype=np.float64),
            },
            config={"n_classes": 2, "fit": "ridge", "target": "gain", **cand.hyper},
        )
        return FittedDifficulty(cand, head, model)
    if cand.kind == "grouped":
        return FittedDifficulty(cand, _fit_grouped(data, rows, cand.hyper), None)
    if cand.kind == "gbm":
        from sklearn.ensemble import HistGradientBoostingClassifier

        model = HistGradientBoostingClassifier(random_state=seed, **cand.hyper).fit(x, data.needed[rows])
        return FittedDifficulty(cand, None, model)
    head, model = fit_head(cand.kind, x, data.needed[rows], LABELS, seed=seed, **cand.hyper)
    return FittedDifficulty(cand, head, model)


FAMILIES = ("mmlu", "gsm8k", "mt_bench")


def _fit_grouped(data: PairData, rows: np.ndarray, hyper: dict[str, Any]) -> Head:
    from sklearn.linear_model import Ridge

    from classifiers.heads._numpy import softmax

    idx = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
    tau, alpha, shrink = (
        float(hyper.get("tau", 0.02)),
        float(hyper.get("alpha", 3000.0)),
        float(hyper.get("shrink", 5.0)),
    )
    emb, x, gain = data.embeddings[idx], data.features[idx], gain_target(data)[idx]
    groups = np.array([f"{data.records[i].dataset}:{data.records[i].group}" for i in idx])
    names = sorted(set(groups.tolist()))
    gi = np.searchsorted(names, groups)
    counts = np.bincount(gi, minlength=len(names)).astype(float)
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    rates = np.bincount(gi, weights=gain, minlength=len(names)) / (counts + shrink)
    if hyper.get("gate") == "logreg":
        # A multinomial logistic regression over the groups on the unit embedding: the same softmax
        # form as the centroid gate (weights in "centroids", tau 1, intercepts in "log_prior").
        from sklearn.linear_model import LogisticRegression

        clf = LogisticRegression(C=float(hyper.get("C", 10.0)), max_iter=2000).fit(unit, gi)
        cent, log_prior, tau = clf.coef_, clf.intercept_.astype(np.float64), 1.0
    else:
        cent = np.stack([emb[gi == g].mean(axis=0) for g in range(len(names))])
        cent /= np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
        log_prior = np.log(counts / counts.sum())
    family = np.array([FAMILIES.index(n.split(":", 1)[0]) for n in names])
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-8] = 1.0
    z = (x - mean) / scale
    gate = softmax(unit @ cent.T / tau + log_prior)
    resid = gain - gate @ rates
    fam_rows = np.array([FAMILIES.index(data.records[i].dataset) for i in idx])
    coef = np.zeros((len(FAMILIES), x.shape[1]), dtype=np.float32)
    intercept = np.zeros(len(FAMILIES))
    for f in range(len(FAMILIES)):
        m = fam_rows == f
        if m.sum() >= 20:  # too few prompts (MT-bench folds) for an expert: the group prior alone
            r = Ridge(alpha=alpha).fit(z[m], resid[m])
            coef[f], intercept[f] = r.coef_, r.intercept_
    return Head(
        kind="grouped",
        labels=LABELS,
        params={
            "mean": mean,
            "scale": scale,
            "centroids": cent.astype(np.float32),
            "log_prior": log_prior,
            "rates": rates,
            "family": family.astype(np.int8),
            "expert_coef": coef,
            "expert_intercept": intercept,
        },
        config={
            "n_classes": 2,
            "embedding_dim": int(emb.shape[1]),
            "tau": tau,
            "alpha": alpha,
            "shrink": shrink,
            "groups": names,
            "families": list(FAMILIES),
        },
    )


def apgr_by_dataset(
    scores: np.ndarray, data: PairData, rows: np.ndarray, datasets: Sequence[str] = EVAL_DATASETS
) -> dict[str, float]:
    """APGR of ``scores`` (aligned with ``rows``) per data set."""
    idx = np.flatnonzero(rows) if rows.dtype == bool else rows
    out = {}
    for name in datasets:
        m = data.dataset[idx] == name
        if m.sum() >= 10:
            out[name] = evaluate_scores(scores[m], data.strong[idx][m], data.weak[idx][m]).apgr
    return out


def cross_validated_scores(
    cand: Candidate,
    data: PairData,
    rows: np.ndarray,
    seed: int,
    k: int = 5,
    on_fold: Callable[[], None] | None = None,
) -> np.ndarray:
    """Out-of-fold scores over ``rows`` (boolean mask): every row scored by a model that did not see it."""
    idx = np.flatnonzero(rows)
    folds = np.array([fold_of(data.records[i].prompt, k, seed) for i in idx])
    out = np.zeros(len(idx))
    for f in range(k):
        train = np.zeros(len(data.records), dtype=bool)
        train[idx[folds != f]] = True
        fitted = fit_candidate(cand, data, train, seed)
        out[folds == f] = fitted.score(_features(data, cand)[idx[folds == f]])
        if on_fold is not None:
            on_fold()
    return out


def features_of(data: PairData, cand: Candidate) -> np.ndarray:
    """The feature matrix a candidate uses."""
    return _features(data, cand)
