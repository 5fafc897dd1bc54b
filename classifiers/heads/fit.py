"""Fit heads with scikit-learn and export them to numpy :class:`Head` objects (training time only).

Calibration is fitted on a validation set the model did not train on: Platt scaling for binary heads
(monotone, so the ranking and therefore APGR is unchanged) and temperature scaling for multiclass heads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
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


def fit_calibration(head: Head, x_val: np.ndarray, y_val: np.ndarray) -> dict[str, Any]:
    """Fit the head's calibrator on validation data and install it; returns the calibration dict."""
    raw = head.raw_proba(x_val)
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


__all__ = ["apply_calibration", "calibration_report", "fit_calibration", "fit_head"]
