"""A trained head: preprocessing, a numpy forward pass, probability calibration, and safe artifact IO.

Artifact layout (a directory):
- ``manifest.json``: kind, labels, encoder id, feature schema, calibration, training data, metrics, ...
- ``weights.npz``: every array (loaded with ``allow_pickle=False``; no pickle anywhere).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.heads._numpy import (
    family_onehot,
    grouped_score,
    knn_proba,
    logreg_proba,
    mlp_proba,
    multilabel_proba,
    sigmoid,
    softmax,
    two_columns,
)

FORMAT_VERSION = 1
KINDS: tuple[str, ...] = ("logreg", "mlp", "knn", "grouped", "multilabel")


@dataclass
class Head:
    """A classifier over feature vectors with calibrated ``predict_proba``.

    Attributes:
        kind: ``"logreg"``, ``"mlp"``, ``"knn"``, ``"grouped"`` (binary difficulty only) or
            ``"multilabel"`` (one independent logistic regression per label, e.g. the per-model
            quality head: column ``i`` is P(label ``i`` holds), and rows do not sum to 1).
        labels: Class names; column ``i`` of ``predict_proba`` is ``labels[i]``.
        params: Model arrays plus ``mean``/``scale`` for standardisation.
        config: Hyperparameters the forward pass needs (activation, layer count, k ...).
        calibration: ``{"method": "platt", "a", "b"}`` (binary: ``sigmoid(a * logit(p) + b)``),
            ``{"method": "temperature", "t"}`` (multiclass: ``softmax(log(p) / t)``),
            ``{"method": "platt_per_label", "a": [...], "b": [...]}`` (multilabel: Platt per column)
            or ``{"method": "none"}``.
        manifest: Everything else recorded with the artifact (encoder id, feature schema, data, metrics).
    """

    kind: str
    labels: tuple[str, ...]
    params: dict[str, np.ndarray]
    config: dict[str, Any]
    calibration: dict[str, Any] = field(default_factory=lambda: {"method": "none"})
    manifest: dict[str, Any] = field(default_factory=dict)

    _scoring: tuple[tuple[tuple[str, int], ...], dict[str, np.ndarray]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown head kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    def _scoring_params(self) -> dict[str, np.ndarray]:
        """``params`` with float arrays as float64, converted once instead of on every call.

        The numbers are those the per-call conversion gave (numpy upcasts float32 operands of a
        float64 product the same way); rebuilt whenever an array in ``params`` is replaced.
        """
        if self.kind == "knn":  # scores against float32 reference vectors: nothing to convert
            return self.params
        ids = tuple((name, id(array)) for name, array in self.params.items())
        if self._scoring is None or self._scoring[0] != ids:
            converted = {
                name: array.astype(np.float64) if array.dtype.kind == "f" else array
                for name, array in self.params.items()
            }
            if self.kind == "grouped":  # derived once: which family each group belongs to
                converted["family_onehot"] = family_onehot(converted["family"], converted["expert_coef"].shape[0])
            self._scoring = (ids, converted)
        return self._scoring[1]

    @property
    def n_features(self) -> int:
        """Length of the feature vectors this head expects."""
        return int(self.params["mean"].shape[0])

    def raw_proba(self, x: np.ndarray) -> np.ndarray:
        """Uncalibrated class (or, for ``multilabel``, per-label) probabilities, shape ``(n, len(labels))``."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        if x.shape[1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {x.shape[1]}")
        params = self._scoring_params()
        z = (x - params["mean"]) / params["scale"]
        if self.kind == "logreg":
            return logreg_proba(z, params)
        if self.kind == "mlp":
            return mlp_proba(z, params, self.config)
        if self.kind == "multilabel":
            return multilabel_proba(z, params)
        if self.kind == "grouped":
            # A score, not a probability: squashed here, made a probability by Platt calibration.
            return two_columns(sigmoid(grouped_score(x, z, params, self.config)))
        return knn_proba(z, params, self.config)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Calibrated probabilities, shape ``(n, len(labels))``; rows sum to 1 except for ``multilabel``."""
        return apply_calibration(self.raw_proba(x), self.calibration)

    def save(self, directory: str | Path) -> Path:
        """Write ``manifest.json`` + ``weights.npz`` into ``directory`` (created if needed)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        arrays = {k: np.ascontiguousarray(v) for k, v in self.params.items()}
        _write_npz(out / "weights.npz", arrays)
        digest = hashlib.sha256((out / "weights.npz").read_bytes()).hexdigest()
        manifest = {
            **self.manifest,
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "labels": list(self.labels),
            "config": self.config,
            "calibration": self.calibration,
            "weights": {"file": "weights.npz", "sha256": digest, "arrays": sorted(arrays)},
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return out


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write a compressed ``.npz`` byte-for-byte reproducibly (fixed member timestamps, sorted names).

    ``np.savez`` stamps members with the current time, so identical weights would hash differently.
    """
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            buf = io.BytesIO()
            np.lib.format.write_array(buf, arrays[name], allow_pickle=False)
            zf.writestr(info, buf.getvalue())


def apply_calibration(proba: np.ndarray, calibration: Mapping[str, Any]) -> np.ndarray:
    """Map raw probabilities through a fitted calibrator (see :class:`Head`)."""
    method = calibration.get("method", "none")
    eps = 1e-7
    if method == "none":
        return proba
    if method == "platt":
        # np.minimum/np.maximum: np.clip's values at a third of its per-call cost on one row.
        p = np.minimum(np.maximum(proba[:, 1], eps), 1 - eps)
        return two_columns(sigmoid(float(calibration["a"]) * np.log(p / (1 - p)) + float(calibration["b"])))
    if method == "temperature":
        return softmax(np.log(np.clip(proba, eps, 1.0)) / float(calibration["t"]))
    if method == "platt_per_label":
        a = np.asarray(calibration["a"], dtype=np.float64)
        b = np.asarray(calibration["b"], dtype=np.float64)
        if a.shape != (proba.shape[1],) or b.shape != a.shape:
            raise ValueError(f"platt_per_label calibration has {a.shape} parameters for {proba.shape[1]} labels")
        p = np.clip(proba, eps, 1 - eps)
        return sigmoid(a * np.log(p / (1 - p)) + b)
    raise ValueError(f"unknown calibration method {method!r}")


def load_head(directory: str | Path) -> Head:
    """Load a head written by :meth:`Head.save`, checking the weights' hash against the manifest.

    Raises:
        FileNotFoundError: the directory lacks ``manifest.json`` or the weights file.
        ValueError: unsupported format, unknown kind, or weights that do not match the manifest's hash.
    """
    root = Path(directory)
    manifest = json.loads((root / "manifest.json").read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{root}: unsupported head format {manifest.get('format_version')!r}")
    weights = root / manifest["weights"]["file"]
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != manifest["weights"]["sha256"]:
        raise ValueError(f"{weights}: sha256 {digest} does not match the manifest")
    with np.load(weights, allow_pickle=False) as npz:
        params = {k: npz[k] for k in npz.files}
    rest = {
        k: v
        for k, v in manifest.items()
        if k not in ("format_version", "kind", "labels", "config", "calibration", "weights")
    }
    return Head(
        kind=manifest["kind"],
        labels=tuple(manifest["labels"]),
        params=params,
        config=manifest["config"],
        calibration=manifest["calibration"],
        manifest=rest,
    )
