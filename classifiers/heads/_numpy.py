"""Numpy forward passes of the supported head kinds (no scikit-learn needed at serving time)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function (float64 out).

    exp(-|z|) never overflows; for z >= 0 the value is 1 / (1 + exp(-z)), else exp(z) / (1 + exp(z)),
    each written with that one exponential (5 array operations: this runs on every routed request).
    """
    e = np.exp(-np.abs(z))
    return np.asarray(np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e)), dtype=np.float64)


def two_columns(q: np.ndarray) -> np.ndarray:
    """``[1 - q, q]`` as an (n, 2) float64 array: a binary head's class probabilities."""
    out = np.empty((len(q), 2))
    out[:, 1] = q
    np.subtract(1.0, q, out=out[:, 0])
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax."""
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _to_proba(logits: np.ndarray) -> np.ndarray:
    # One output column is a binary model (positive-class logit), as in scikit-learn.
    if logits.shape[1] == 1:
        return two_columns(sigmoid(logits[:, 0]))
    return softmax(logits)


def logreg_proba(x: np.ndarray, p: Mapping[str, np.ndarray]) -> np.ndarray:
    """Linear model: ``coef`` (n_out, n_features), ``intercept`` (n_out,)."""
    return _to_proba(x @ np.asarray(p["coef"], dtype=np.float64).T + p["intercept"])


def multilabel_proba(x: np.ndarray, p: Mapping[str, np.ndarray]) -> np.ndarray:
    """One independent sigmoid per label: ``coef`` (n_labels, n_features), ``intercept`` (n_labels,)."""
    return sigmoid(x @ np.asarray(p["coef"], dtype=np.float64).T + p["intercept"])


_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda z: np.maximum(z, 0.0),
    "tanh": np.tanh,
    "logistic": sigmoid,
    "identity": lambda z: z,
}


def mlp_proba(x: np.ndarray, p: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> np.ndarray:
    """Multi-layer perceptron: ``W0..Wn``/``b0..bn`` with ``config["activation"]`` between layers."""
    act = _ACTIVATIONS[config["activation"]]
    n_layers = int(config["n_layers"])
    h = x
    for i in range(n_layers):
        h = h @ np.asarray(p[f"W{i}"], dtype=np.float64) + p[f"b{i}"]
        if i < n_layers - 1:
            h = act(h)
    return _to_proba(h)


def knn_proba(x: np.ndarray, p: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> np.ndarray:
    """Cosine kNN over stored training vectors ``X`` with labels ``y``; Laplace-smoothed class shares."""
    ref = p["X"].astype(np.float32)
    y = p["y"].astype(np.int64)
    n_classes = int(config["n_classes"])
    k = min(int(config["k"]), len(ref))
    q = x.astype(np.float32)
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    sims = q @ ref.T
    idx = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    counts = np.zeros((len(q), n_classes))
    for c in range(n_classes):
        counts[:, c] = (y[idx] == c).sum(axis=1)
    alpha = float(config.get("alpha", 1.0))
    return (counts + alpha) / (k + alpha * n_classes)


def grouped_score(
    x_raw: np.ndarray, z: np.ndarray, p: Mapping[str, np.ndarray], config: Mapping[str, Any]
) -> np.ndarray:
    """Group prior + per-family linear experts (see ``evals/difficulty.py``): a real-valued score per row.

    A soft gate assigns each prompt to training groups (MMLU subjects, GSM8K, MT-bench categories) by
    cosine similarity to their centroids; the score is the gate-weighted group gain rate plus, per data
    family, the family's gate mass times its ridge expert's residual prediction.
    """
    dim = int(config["embedding_dim"])
    e = x_raw[:, :dim]
    e = e / np.maximum(np.sqrt(np.einsum("ij,ij->i", e, e))[:, None], 1e-12)
    logits = e @ np.asarray(p["centroids"], dtype=np.float64).T / float(config["tau"]) + p["log_prior"]
    gate = softmax(logits)
    experts = z @ np.asarray(p["expert_coef"], dtype=np.float64).T + p["expert_intercept"]
    # The gate's mass on each family: one product with the groups' family one-hot matrix (derived
    # once by Head; built here for callers that pass the stored arrays only).
    onehot = p.get("family_onehot")
    if onehot is None:
        onehot = family_onehot(p["family"], experts.shape[1])
    return np.asarray(gate @ p["rates"] + ((gate @ onehot) * experts).sum(axis=1))


def family_onehot(family: np.ndarray, n_families: int) -> np.ndarray:
    """(n_groups, n_families) float64 matrix with a 1 where a group belongs to a family."""
    return (np.asarray(family, dtype=np.int64)[:, None] == np.arange(n_families)).astype(np.float64)
