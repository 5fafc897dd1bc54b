"""Deterministic train/validation/test split by prompt hash.

The split depends only on the prompt text and the seed, so the same prompt lands in the same split on
every machine and in every data set it appears in (no prompt can be in train and test at once).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal, TypeVar

Split = Literal["train", "val", "test"]
DEFAULT_SEED = 20240601
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)

T = TypeVar("T")


def prompt_unit(prompt: str, seed: int = DEFAULT_SEED) -> float:
    """A uniform number in [0, 1) derived from sha256(seed, prompt)."""
    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(prompt: str, seed: int = DEFAULT_SEED, fractions: tuple[float, float, float] = DEFAULT_FRACTIONS) -> Split:
    """Which split a prompt belongs to."""
    u = prompt_unit(prompt, seed)
    if u < fractions[0]:
        return "train"
    if u < fractions[0] + fractions[1]:
        return "val"
    return "test"


def fold_of(prompt: str, k: int, seed: int = DEFAULT_SEED) -> int:
    """Which of ``k`` cross-validation folds a prompt belongs to (independent of ``split_of``)."""
    return int(prompt_unit(prompt, seed + 1) * k)


def split_indices(prompts: Sequence[str], seed: int = DEFAULT_SEED) -> dict[Split, list[int]]:
    """Indices of ``prompts`` per split."""
    out: dict[Split, list[int]] = {"train": [], "val": [], "test": []}
    for i, p in enumerate(prompts):
        out[split_of(p, seed)].append(i)
    return out
