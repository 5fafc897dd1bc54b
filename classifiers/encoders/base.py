"""The encoder interface every text encoder implements, and a shared normalisation helper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into fixed-size, L2-normalised float32 vectors.

    Attributes:
        id: Stable identifier of the encoder and its weights (e.g. ``"minilm-l6-v2"``,
            ``"minilm-static-256"``). Trained heads record it in their manifest so that an artifact is
            never scored with vectors from a different encoder.
        dim: Length of every vector.

    ``encode`` is synchronous and CPU-bound. It must be safe to call from one worker thread (the
    :class:`classifiers.batching.BatchingEncoder` calls it from a single dedicated thread); callers on
    an event loop go through that wrapper rather than calling it directly.
    """

    id: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` into a float32 array of shape ``(len(texts), dim)`` with unit-norm rows."""
        ...


@runtime_checkable
class ConcurrentEncoder(Encoder, Protocol):
    """An encoder that encodes each text alone and can run ``workers`` texts at once, from any thread.

    The MiniLM runtimes that run one forward pass per text (ONNX Runtime, TorchScript) implement it, so
    :class:`classifiers.batching.BatchingEncoder` can hand each text to a worker the moment one is free
    and answer its caller the moment its own pass ends, instead of waiting for a whole batch.

    Attributes:
        workers: How many ``encode_one`` calls may usefully run at once (one per worker thread).
    """

    workers: int

    def encode_one(self, text: str, solo: bool = False) -> np.ndarray:
        """Encode one text into a float32 unit vector of shape ``(dim,)``, equal bit for bit to its row of
        ``encode``. Safe to call from several threads at once. ``solo``: no other text is being encoded
        now, so the pass may spread over every core."""
        ...


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Return ``vectors`` as C-contiguous float32 with unit-norm rows; all-zero rows stay zero.

    Encoders call this on their output so the contract holds whatever dtype the backend produced
    (model2vec keeps float16 tables, sentence-transformers may already normalise).
    """
    out = np.array(vectors, dtype=np.float32, order="C")  # a copy: never normalise the caller's array in place
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {out.shape}")
    # np.linalg.norm's own arithmetic (sqrt of the pairwise sum of squares) without its Python wrapper.
    norms = np.sqrt(np.add.reduce(out * out, axis=1, keepdims=True))
    # A text with no known tokens has no direction: keep it at zero instead of dividing by zero.
    np.divide(out, norms, out=out, where=norms > 0)
    return out
