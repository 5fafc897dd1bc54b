"""Routing data sets as arrays: records, embeddings (through the serving text form), features and splits."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.heads.features import build_features
from evals.data import load_routellm, load_routerbench, split_of
from evals.data.records import MultiModelRecord, PairRecord
from evals.embeddings import embed_prompts, prompt_text


def records_hash(prompts: Sequence[str], labels: Sequence[object]) -> str:
    """sha256 over (prompt, label) pairs: names the exact training data in a manifest."""
    h = hashlib.sha256()
    for p, y in zip(prompts, labels, strict=True):
        h.update(hashlib.sha256(p.encode()).digest())
        h.update(repr(y).encode())
    return h.hexdigest()


@dataclass
class PairData:
    """RouteLLM records with their embeddings, features and split labels (row-aligned)."""

    records: list[PairRecord]
    embeddings: np.ndarray
    features: np.ndarray  # embeddings + cheap text statistics
    split: np.ndarray  # "train" | "val" | "test"
    dataset: np.ndarray
    strong: np.ndarray
    weak: np.ndarray
    needed: np.ndarray  # 0/1 difficulty label
    encoder_id: str

    def mask(self, split: str | None = None, dataset: str | Sequence[str] | None = None) -> np.ndarray:
        """Boolean row mask for a split and/or data set(s)."""
        m = np.ones(len(self.records), dtype=bool)
        if split is not None:
            m &= self.split == split
        if dataset is not None:
            names = [dataset] if isinstance(dataset, str) else list(dataset)
            m &= np.isin(self.dataset, names)
        return m


def load_pair_data(data_dir: Path, encoder: object, seed: int, progress: bool = True) -> PairData:
    """Load MMLU, GSM8K and MT-bench, embed every prompt with ``encoder`` and split by prompt hash."""
    records = load_routellm(data_dir)
    prompts = [r.prompt for r in records]
    emb = embed_prompts(encoder, prompts, progress=progress)  # type: ignore[arg-type]
    texts = [prompt_text(p) for p in prompts]
    return PairData(
        records=records,
        embeddings=emb,
        features=build_features(emb, texts),
        split=np.array([split_of(p, seed) for p in prompts]),
        dataset=np.array([r.dataset for r in records]),
        strong=np.array([r.strong_quality for r in records]),
        weak=np.array([r.weak_quality for r in records]),
        needed=np.array([int(r.strong_needed) for r in records]),
        encoder_id=encoder.id,  # type: ignore[attr-defined]
    )


@dataclass
class MultiData:
    """RouterBench-train records with embeddings and splits; quality/cost as (n, n_models) arrays."""

    records: list[MultiModelRecord]
    models: list[str]
    embeddings: np.ndarray
    quality: np.ndarray  # NaN where missing
    cost: np.ndarray
    split: np.ndarray
    encoder_id: str
    features: np.ndarray  # embeddings + cheap text statistics (what serving's heads score)
    task: np.ndarray  # "arc-challenge" | "mbpp" | "winogrande"

    def mask(self, split: str | None = None) -> np.ndarray:
        """Boolean row mask for a split (all rows when None)."""
        if split is None:
            return np.ones(len(self.records), dtype=bool)
        return np.asarray(self.split == split)


def load_multi_data(data_dir: Path, encoder: object, seed: int, progress: bool = True) -> MultiData:
    """Load RouterBench-train, embed and split by prompt hash.

    For benchmarks and for quality heads users train for themselves (``pointsman train --quality``):
    the data has no declared licence, so nothing built from it may be shipped.
    """
    records = load_routerbench(data_dir)
    models = sorted(records[0].quality)
    prompts = [r.prompt for r in records]
    emb = embed_prompts(encoder, prompts, progress=progress)  # type: ignore[arg-type]
    return MultiData(
        records=records,
        models=models,
        embeddings=emb,
        quality=np.array([[r.quality[m] for m in models] for r in records]),
        cost=np.array([[r.cost[m] for m in models] for r in records]),
        split=np.array([split_of(r.prompt, seed) for r in records]),
        encoder_id=encoder.id,  # type: ignore[attr-defined]
        features=build_features(emb, [prompt_text(p) for p in prompts]),
        task=np.array([r.task for r in records]),
    )
