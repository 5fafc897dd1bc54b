"""Shared machinery of the MiniLM runtimes that encode each text alone, several texts at once.

Both the ONNX Runtime and the TorchScript runtime run one forward pass per text (batch of one, no
padding, so a text's vector never depends on what it was batched with) and spread the texts of one
call over a small pool of worker threads. That only pays because both runtimes release the GIL for
the whole pass; the subclasses say how one pass runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from classifiers.encoders.base import l2_normalise
from classifiers.encoders.minilm import bundled_model_dir


def model_max_seq_length(model_dir: Path) -> int:
    """Word pieces sentence-transformers reads per text for the model in ``model_dir`` (256 for MiniLM)."""
    try:
        return int(json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, KeyError, ValueError):
        return 256


class PerTextEncoder:
    """Base of the per-text MiniLM runtimes: tokenises like sentence-transformers, runs texts on a pool.

    Args:
        workers: Texts encoded at once (worker threads, each running one pass).
        model_dir: Override the model directory (default: the bundled one).
        max_tokens: Word pieces read per text (default: the model's own limit, as sentence-transformers).

    Subclasses implement :meth:`_pass`; ``solo`` is true when the call holds a single text, so a
    runtime that can split one pass over several cores may do so.
    """

    dim: int = 384

    def __init__(self, workers: int, model_dir: Path | None, max_tokens: int | None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        from tokenizers import Tokenizer

        self.model_dir = model_dir if model_dir is not None else bundled_model_dir()
        self.workers = workers
        self.max_seq_length = max_tokens if max_tokens is not None else model_max_seq_length(self.model_dir)
        self._tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=self.max_seq_length)
        self._tokenizer.no_padding()
        self._pool: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="minilm") if workers > 1 else None
        )

    def _pass(self, ids: Sequence[int], solo: bool) -> np.ndarray:
        """One forward pass over one text's word pieces: its mean-pooled (not yet normalised) vector."""
        raise NotImplementedError

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` into ``(len(texts), 384)`` float32 unit vectors."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        token_ids = [enc.ids for enc in self._tokenizer.encode_batch(list(texts))]
        if len(texts) == 1:
            rows = [self._pass(token_ids[0], True)]
        elif self._pool is None:
            rows = [self._pass(ids, False) for ids in token_ids]
        else:
            # Longest first, so the last text to finish is a short one and the workers end together.
            order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
            passes = self._pool.map(lambda ids: self._pass(ids, False), [token_ids[i] for i in order])
            results = dict(zip(order, passes, strict=True))
            rows = [results[i] for i in range(len(token_ids))]
        return l2_normalise(np.stack(rows))

    def encode_one(self, text: str, solo: bool = False) -> np.ndarray:
        """Encode one text into a ``(384,)`` float32 unit vector: the same bits as its row of :meth:`encode`.

        Thread-safe; several calls run at once on the caller's threads (each pass releases the GIL).
        ``solo``: no other text is being encoded now, so a runtime that can split one pass over the
        cores may (the ONNX runtime's second session; the bits do not change).
        """
        ids = self._tokenizer.encode(text).ids
        return l2_normalise(self._pass(ids, solo)[None, :])[0]

    def close(self) -> None:
        """Stop the worker threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
