"""Text encoders: the bundled all-MiniLM-L6-v2 (default) and a static model2vec distillation of it (fast).

Use :func:`load_encoder` with a config name; both return an :class:`Encoder`.
"""

from __future__ import annotations

import os

from classifiers.encoders.base import Encoder, l2_normalise

ENCODER_NAMES: tuple[str, ...] = ("minilm", "static")

__all__ = [
    "ENCODER_NAMES",
    "MINILM_RUNTIMES",
    "Encoder",
    "default_workers",
    "l2_normalise",
    "load_encoder",
    "resolve_runtime",
]


MINILM_RUNTIMES: tuple[str, ...] = ("auto", "onnx", "torchscript", "torch")


def resolve_runtime(runtime: str) -> str:
    """``"auto"`` -> ``"torchscript"`` on CPUs that compute bfloat16 natively (AMX-BF16 or AVX512-BF16;
    bf16 there measured ~2x ONNX Runtime's float32 decisions/s on an AMX Xeon, 1.2-1.5x on an AVX512-BF16
    EPYC), else ``"onnx"``; other names pass through."""
    from classifiers.encoders.minilm import cpu_has_native_bf16

    if runtime == "auto":
        return "torchscript" if cpu_has_native_bf16() else "onnx"
    return runtime


def default_workers() -> int:
    """Parallel per-text MiniLM passes by default: one per core, at most 4 (measured on 2 cores)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def load_encoder(
    name: str, *, threads: int | None = None, dtype: str = "float32", runtime: str = "onnx"
) -> Encoder:
    """Build the encoder called ``name``.

    Args:
        name: ``"minilm"`` (sentence-transformers on the bundled model, CPU, offline) or ``"static"``
            (model2vec static embeddings from ``classifiers/artifacts/encoders/minilm-static/``).
        threads: For ``"minilm"``: parallel single-threaded passes on ``onnx`` and ``torchscript``
            (default: one per core, at most 4), or torch intra-op threads with ``runtime="torch"``
            (default 1). Ignored by ``"static"``.
        dtype: For ``"minilm"``: ``"float32"``, ``"bfloat16"`` (torchscript and torch only) or
            ``"auto"``: bfloat16 on torchscript where the CPU computes it natively, float32 otherwise
            (on torch too: its batched bf16 vectors move with their batch-mates). Ignored by ``"static"``.
        runtime: ``"onnx"`` (default: float32, GIL-free, every core, per-text exact), ``"torchscript"``
            (BERT written out as a TorchScript module: per-text, GIL-free, bfloat16 on CPUs with native
            bf16), ``"torch"``
            (sentence-transformers itself: the reference the others are checked against) or ``"auto"``
            (torchscript where the CPU has AMX-BF16 or AVX512-BF16, else onnx: :func:`resolve_runtime`).

    Raises:
        ValueError: unknown name (the message lists the known ones).
        FileNotFoundError: the bundled model or the static artifact is missing.
    """
    # Imports are deferred so choosing "static" never pays for importing torch.
    if name == "minilm":
        if runtime not in MINILM_RUNTIMES:
            raise ValueError(f"unknown MiniLM runtime {runtime!r}; expected one of {', '.join(MINILM_RUNTIMES)}")
        runtime = resolve_runtime(runtime)
        workers = threads if threads is not None else default_workers()
        if runtime == "onnx":
            if dtype == "bfloat16":
                raise ValueError(
                    "dtype 'bfloat16' needs runtime 'torchscript' or 'torch'; ONNX Runtime runs MiniLM in float32"
                )
            from classifiers.encoders.minilm_onnx import OnnxMiniLMEncoder

            return OnnxMiniLMEncoder(workers=workers)
        if runtime == "torchscript":
            from classifiers.encoders.minilm_script import ScriptedMiniLMEncoder

            return ScriptedMiniLMEncoder(workers=workers, dtype=dtype)
        from classifiers.encoders.minilm import DEFAULT_THREADS, MiniLMEncoder

        return MiniLMEncoder(
            threads=threads if threads is not None else DEFAULT_THREADS,
            dtype="float32" if dtype == "auto" else dtype,
        )
    if name == "static":
        from classifiers.encoders.static import StaticEncoder

        return StaticEncoder()
    raise ValueError(f"unknown encoder {name!r}; expected one of {', '.join(ENCODER_NAMES)}")
