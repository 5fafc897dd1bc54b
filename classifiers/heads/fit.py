"""Fit heads with scikit-learn and export them to numpy :class:`Head` objects (training time only).

Calibration is fitted on a validation set the model did not train on: Platt scaling for binary heads
(monotone, so the ranking and therefore APGR is unchanged), temperature scaling for multiclass heads,
and Platt scaling per label for multilabel heads.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from classifiers.heads.head import Head, apply_calibration


def _standardiser(x: np.ndarray, standardise: bool) -> tuple[np.ndarray, np.ndarray]:
    if not standardise:
        return np.zeros(x.shape[1]), np.ones(x.shape[1])
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-8] = 1.0
    return mean, scale


def fit_head(
    kind: str,
    x: np.ndarray,
    y: np.ndarray,
    labels: Sequence[str],
    *,
    seed: int = 0,
    sample_weight: np.ndarray | None = None,
    **hyper: Any,
) -> tuple[Head, Any]:
    """Fit a head of ``kind`` on features ``x`` and integer labels ``y`` (indices into ``labels``).

    Returns the numpy head (uncalibrated) and the fitted scikit-learn estimator (for comparisons).
    Hyperparameters: logreg ``C``; mlp ``hidden`` (tuple), ``alpha``, ``max_iter``; knn ``k``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    n_classes = len(labels)
    mean, scale = _standardiser(x, standardise=kind != "knn")
    z = (x - mean) / scale
    params: dict[str, np.ndarray] = {"mean": mean, "scale": scale}
    config: dict[str, Any] = {"n_classes": n_classes}
    model: Any
    if kind == "logreg":
        model = LogisticRegression(C=float(hyper.get("C", 0.1)), max_iter=2000, random_state=seed)
        model.fit(z, y, sample_weight=sample_weight)
        params["coef"] = model.coef_.astype(np.float32)
        params["intercept"] = model.intercept_.astype(np.float64)
        config["C"] = float(hyper.get("C", 0.1))
    elif kind == "mlp":
        hidden = tuple(hyper.get("hidden", (64,)))
        model = MLPClassifier(
            hidden_layer_sizes=hidden,
            alpha=float(hyper.get("alpha", 1e-2)),
            max_iter=int(hyper.get("max_iter", 200)),
            early_stopping=True,
            random_state=seed,
        )
        model.fit(z, y)
        for i, (w, b) in enumerate(zip(model.coefs_, model.intercepts_, strict=True)):
            params[f"W{i}"] = w.astype(np.float32)
            params[f"b{i}"] = b.astype(np.float64)
        config.update(activation=model.activation, n_layers=len(model.coefs_), hidden=list(hidden))
    elif kind == "knn":
        k = int(hyper.get("k", 50))
        norm = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        params["X"] = norm.astype(np.float16)
        params["y"] = y.astype(np.int16)
        config.update(k=k, alpha=1.0)
        model = None
    else:
        raise ValueError(f"unknown head kind {kind!r}")
    return Head(kind=kind, labels=tuple(labels), params=params, config=config), model


def fit_multilabel(
    x: np.ndarray,
    y: np.ndarray,
    labels: Sequence[str],
    *,
    C: float = 0.1,
    seed: int = 0,
    progress: Iterable[int] | None = None,
) -> Head:
    """One logistic regression per label (a ``multilabel`` head) on features ``x``.

    ``y`` is ``(n, len(labels))`` with 0/1 outcomes and NaN where a label is unknown: each label is fitted
    on its own known rows only. The standardisation is shared (all rows of ``x``). A label that is
    constant on its rows gets a zero weight vector and the logit of its (clipped) rate as intercept.
    ``progress`` may wrap ``range(len(labels))`` (e.g. with tqdm). Returns the uncalibrated head.
    """
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if y.shape != (len(x), len(labels)):
        raise ValueError(f"y has shape {y.shape}; expected {(len(x), len(labels))}")
    mean, scale = _standardiser(x, standardise=True)
    z = (x - mean) / scale
    coef = np.zeros((len(labels), x.shape[1]), dtype=np.float32)
    intercept = np.zeros(len(labels), dtype=np.float64)
    constant: list[str] = []
    for j in progress if progress is not None else range(len(labels)):
        known = ~np.isnan(y[:, j])
        target = y[known, j] > 0.5
        if not known.any() or target.all() or not target.any():
            rate = float(np.clip(target.mean() if known.any() else 0.5, 1e-3, 1 - 1e-3))
            intercept[j] = np.log(rate / (1 - rate))
            constant.append(labels[j])
            continue
        model = LogisticRegression(C=C, max_iter=2000, random_state=seed).fit(z[known], target)
        coef[j] = model.coef_[0].astype(np.float32)
        intercept[j] = float(model.intercept_[0])
    config: dict[str, Any] = {"n_classes": len(labels), "C": float(C), "constant_labels": constant}
    params = {"mean": mean, "scale": scale, "coef": coef, "intercept": intercept}
    return Head(kind="multilabel", labels=tuple(labels), params=params, config=config)


def _platt(raw: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """Platt parameters ``(a, b)`` for positive-class scores ``raw``; None when not fittable or not monotone."""
    from sklearn.linear_model import LogisticRegression

    y = np.asarray(y, dtype=np.int64)
    if len(y) < 2 or y.min() == y.max():
        return None
    eps = 1e-7
    p = np.clip(raw, eps, 1 - eps)
    logit = np.log(p / (1 - p)).reshape(-1, 1)
    lr = LogisticRegression(C=1e4, max_iter=1000).fit(logit, y)
    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    return (a, b) if a > 0 else None


def fit_calibration(head: Head, x_val: np.ndarray, y_val: np.ndarray) -> dict[str, Any]:
    """Fit the head's calibrator on validation data and install it; returns the calibration dict.

    For a ``multilabel`` head ``y_val`` is ``(n, n_labels)`` with NaN for unknown cells; a label whose
    Platt map cannot be fitted (one class only) or would invert the ranking keeps its raw scores (a=1, b=0).
    """
    raw = head.raw_proba(x_val)
    if head.kind == "multilabel":
        y_all = np.asarray(y_val, dtype=np.float64)
        a_list, b_list = [], []
        for j in range(raw.shape[1]):
            known = ~np.isnan(y_all[:, j])
            fitted = _platt(raw[known, j], y_all[known, j] > 0.5)
            a, b = fitted if fitted is not None else (1.0, 0.0)
            a_list.append(a)
            b_list.append(b)
        head.calibration = {"method": "platt_per_label", "a": a_list, "b": b_list}
        return head.calibration
    y_val = np.asarray(y_val, dtype=np.int64)
    eps = 1e-7
    if raw.shape[1] == 2:
        from sklearn.linear_model import LogisticRegression

        p = np.clip(raw[:, 1], eps, 1 - eps)
        logit = np.log(p / (1 - p)).reshape(-1, 1)
        lr = LogisticRegression(C=1e4, max_iter=1000).fit(logit, y_val)
        calib: dict[str, Any] = {"method": "platt", "a": float(lr.coef_[0, 0]), "b": float(lr.intercept_[0])}
        if calib["a"] <= 0:  # a non-monotone map would invert the ranking: keep the raw scores instead
            calib = {"method": "none"}
    else:
        from scipy.optimize import minimize_scalar

        logp = np.log(np.clip(raw, eps, 1.0))

        def nll(log_t: float) -> float:
            z = logp / np.exp(log_t)
            z = z - z.max(axis=1, keepdims=True)
            lse = np.log(np.exp(z).sum(axis=1))
            return float(-(z[np.arange(len(y_val)), y_val] - lse).mean())

        res = minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded")
        calib = {"method": "temperature", "t": float(np.exp(res.x))}
    head.calibration = calib
    return calib


def calibration_report(proba: np.ndarray, y: np.ndarray, bins: int = 10) -> dict[str, float]:
    """Brier score (positive class or multiclass) and expected calibration error of the top class."""
    y = np.asarray(y, dtype=np.int64)
    onehot = np.eye(proba.shape[1])[y]
    brier = float(((proba - onehot) ** 2).sum(axis=1).mean())
    conf = proba.max(axis=1)
    correct = (proba.argmax(axis=1) == y).astype(float)
    edges = np.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in itertools.pairwise(edges):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += m.mean() * abs(conf[m].mean() - correct[m].mean())
    return {"brier": brier, "ece": float(ece)}


__all__ = ["apply_calibration", "calibration_report", "fit_calibration", "fit_head", "fit_multilabel"]
