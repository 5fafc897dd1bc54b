"""Static (model2vec) embeddings distilled from the bundled MiniLM: a table lookup and a mean, no transformer."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.encoders.base import l2_normalise

# The committed artifact, produced by ``python -m classifiers.encoders.distill``.
DEFAULT_STATIC_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "encoders" / "minilm-static"


class StaticEncoder:
    """Encoder over a model2vec static-embedding artifact directory.

    The id is ``minilm-static-<dim>`` so heads trained on one distillation cannot silently be used with
    another of a different size. Tokens beyond ``max_tokens`` are ignored (a mean over 512 word pieces
    is already stable); a text with no known token encodes to the zero vector.
    """

    id: str
    dim: int
    #: ~0.2 ms a text: BatchingEncoder runs it inline on the event loop rather than hopping to a thread.
    cheap: bool = True

    def __init__(self, artifact_dir: Path | None = None, max_tokens: int = 512) -> None:
        from model2vec import StaticModel

        path = artifact_dir if artifact_dir is not None else DEFAULT_STATIC_DIR
        # Check first: given a missing local path, model2vec falls back to downloading from the Hub.
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"static encoder artifact incomplete: {path / name} is missing "
                    "(build it with `python -m classifiers.encoders.distill`)"
                )
        # Stored as int8/float16 to keep the artifact small; widened to float32 on load (numpy sums float16 slowly).
        self._model: Any = StaticModel.from_pretrained(
            path, normalize=True, quantize_to="float32", max_length=max_tokens, force_download=False
        )
        self._embedding: np.ndarray = np.asarray(self._model.embedding, dtype=np.float32)
        self._weights: np.ndarray | None = self._model.weights
        self._mapping: np.ndarray | None = self._model.token_mapping
        self.max_tokens = max_tokens
        self.dim = int(self._embedding.shape[1])
        self.id = f"minilm-static-{self.dim}"
        self.artifact_dir = path
        self.manifest: dict[str, Any] = {}
        manifest_path = path / "manifest.json"
        if manifest_path.is_file():
            self.manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        # The HF tokenizer toggles truncation state on every call: not safe to share across threads.
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` into ``(len(texts), dim)`` float32 unit vectors (mean of token vectors)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # A direct table lookup instead of StaticModel.encode: same arithmetic (mean of the rows, SIF
        # weights and vocabulary mapping if the artifact has them), but ~4x less per-call overhead
        # (progress bar, batching, truncation toggling), which dominates at one short text per call.
        with self._lock:
            token_ids = self._model.tokenize(list(texts))
        for row, ids in enumerate(token_ids):
            if not ids:
                continue  # no known token: no direction, stays zero
            index = np.asarray(ids[: self.max_tokens], dtype=np.intp)  # converted once, used twice
            rows = self._embedding[self._mapping[index] if self._mapping is not None else index]
            if self._weights is not None:
                rows = rows * self._weights[index][:, None]
            # np.mean's own arithmetic (pairwise sum, then one division) without its Python wrapper.
            out[row] = np.add.reduce(rows, axis=0) / len(index)
        return l2_normalise(out)
