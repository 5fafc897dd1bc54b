"""Text encoders: the bundled all-MiniLM-L6-v2 (default) and a static model2vec distillation of it (fast).

Use :func:`load_encoder` with a config name; both return an :class:`Encoder`.
"""

from __future__ import annotations

import os

from classifiers.encoders.base import Encoder, l2_normalise

ENCODER_NAMES: tuple[str, ...] = ("minilm", "static")

__all__ = ["ENCODER_NAMES", "MINILM_RUNTIMES", "Encoder", "default_workers", "l2_normalise", "load_encoder"]


MINILM_RUNTIMES: tuple[str, ...] = ("onnx", "torch")


def default_workers() -> int:
    """Parallel MiniLM passes on ONNX Runtime by default: one per core, at most 4 (measured on 2 cores)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def load_encoder(
    name: str, *, threads: int | None = None, dtype: str = "float32", runtime: str = "onnx"
) -> Encoder:
    """Build the encoder called ``name``.

    Args:
        name: ``"minilm"`` (sentence-transformers on the bundled model, CPU, offline) or ``"static"``
            (model2vec static embeddings from ``classifiers/artifacts/encoders/minilm-static/``).
        threads: For ``"minilm"``: parallel single-threaded passes on ONNX Runtime (default: one per
            core, at most 4), or torch intra-op threads with ``runtime="torch"`` (default 1). Ignored by
            ``"static"``.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"auto"`` weights for ``"minilm"`` on torch; ONNX
            Runtime runs float32 only. Ignored by ``"static"``.
        runtime: ``"onnx"`` (default: GIL-free, uses every core, per-text exact) or ``"torch"``
            (sentence-transformers itself; the reference the ONNX export is checked against).

    Raises:
        ValueError: unknown name (the message lists the known ones).
        FileNotFoundError: the bundled model or the static artifact is missing.
    """
    # Imports are deferred so choosing "static" never pays for importing torch.
    if name == "minilm":
        if runtime not in MINILM_RUNTIMES:
            raise ValueError(f"unknown MiniLM runtime {runtime!r}; expected one of {', '.join(MINILM_RUNTIMES)}")
        if runtime == "onnx":
            if dtype != "float32":
                raise ValueError(f"dtype {dtype!r} needs runtime 'torch'; ONNX Runtime runs MiniLM in float32")
            from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder

            return OnnxMiniLMEncoder(workers=threads if threads is not None else default_workers())
        from classifiers.encoders.minilm import DEFAULT_THREADS, MiniLMEncoder

        return MiniLMEncoder(threads=threads if threads is not None else DEFAULT_THREADS, dtype=dtype)
    if name == "static":
        from classifiers.encoders.static import StaticEncoder

        return StaticEncoder()
    raise ValueError(f"unknown encoder {name!r}; expected one of {', '.join(ENCODER_NAMES)}")
