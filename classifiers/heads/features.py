"""The feature vector a head scores: the text embedding plus a few cheap, documented text statistics.

The schema (names, in order) is stored in every head's manifest; serving builds the same vector with
:func:`build_features` from the same conversation text that was encoded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

# Name -> what it measures. Log scales keep long prompts from dominating after standardisation.
CHEAP_FEATURES: dict[str, str] = {
    "log_chars": "log(1 + characters)",
    "log_words": "log(1 + whitespace-separated words)",
    "log_lines": "log(1 + newlines)",
    "log_digits": "log(1 + digit characters)",
    "log_numbers": "log(1 + numbers, e.g. 3, 4.5, 1,000)",
    "math_symbols": "share of characters in +-*/=^<>%$",
    "non_ascii": "share of non-ASCII characters",
    "questions": "log(1 + question marks)",
}
CHEAP_FEATURE_NAMES: tuple[str, ...] = tuple(CHEAP_FEATURES)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_MATH = "+-*/=^<>%$"
_ASCII_DIGITS = "0123456789"
_ASCII_RUNS = re.compile(r"[\x00-\x7f]+")


def _count_each(text: str, chars: str) -> int:
    # One str.count per character runs in C at memchr speed; str.translate with a deletion table
    # falls back to a per-character Python-object loop as soon as the text holds one non-ASCII
    # character (51 vs 4 us for a 400-character prompt with a curly quote).
    return sum(text.count(c) for c in chars)


def _digit_count(text: str) -> int:
    """Characters for which ``str.isdigit()`` holds (0-9, plus superscripts and other scripts' digits)."""
    count = _count_each(text, _ASCII_DIGITS)  # for ASCII, isdigit() is exactly 0-9
    if not text.isascii():
        # Only the non-ASCII characters need the Unicode definition: usually a handful of them.
        count += sum(c.isdigit() for c in _ASCII_RUNS.sub("", text))
    return count


def cheap_features(text: str) -> list[float]:
    """The cheap statistics of one text, in ``CHEAP_FEATURE_NAMES`` order."""
    n = max(len(text), 1)
    return [
        math.log1p(len(text)),
        math.log1p(len(text.split())),
        math.log1p(text.count("\n")),
        math.log1p(_digit_count(text)),
        math.log1p(len(_NUMBER.findall(text))),
        _count_each(text, _MATH) / n,
        (len(text) - len(text.encode("ascii", "ignore"))) / n,  # characters above U+007F
        math.log1p(text.count("?")),
    ]


def feature_names(embedding_dim: int, cheap: bool) -> list[str]:
    """Column names of the feature matrix for the manifest's feature schema."""
    names = [f"emb_{i}" for i in range(embedding_dim)]
    return names + list(CHEAP_FEATURE_NAMES) if cheap else names


def build_features(embeddings: np.ndarray, texts: Sequence[str] | None = None) -> np.ndarray:
    """Concatenate embeddings with the cheap statistics of ``texts`` (omit ``texts`` for embeddings only)."""
    emb = np.asarray(embeddings, dtype=np.float32)
    if texts is None:
        return emb
    if len(texts) != len(emb):
        raise ValueError(f"{len(texts)} texts for {len(emb)} embeddings")
    extra = np.array([cheap_features(t) for t in texts], dtype=np.float32).reshape(len(texts), len(CHEAP_FEATURE_NAMES))
    return np.hstack([emb, extra])
