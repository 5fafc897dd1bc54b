"""Trainable heads over text embeddings: calibrated classifiers stored as manifest + npz (never pickle).

Serving only needs :func:`load_head` and :func:`build_features`; fitting (scikit-learn) lives in
:mod:`classifiers.heads.fit`.
"""

from classifiers.heads.features import CHEAP_FEATURE_NAMES, build_features, cheap_features, feature_names
from classifiers.heads.head import KINDS, Head, apply_calibration, load_head

__all__ = [
    "CHEAP_FEATURE_NAMES",
    "KINDS",
    "Head",
    "apply_calibration",
    "build_features",
    "cheap_features",
    "feature_names",
    "load_head",
]
