"""Text encoders: the bundled all-MiniLM-L6-v2 (default) and a static model2vec distillation of it (fast).

Use :func:`load_encoder` with a config name; both return an :class:`Encoder`.
"""

from __future__ import annotations

from classifiers.encoders.base import Encoder, l2_normalise

ENCODER_NAMES: tuple[str, ...] = ("minilm", "static")

__all__ = ["ENCODER_NAMES", "Encoder", "l2_normalise", "load_encoder"]


def load_encoder(name: str, *, threads: int | None = None, dtype: str = "float32") -> Encoder:
    """Build the encoder called ``name``.

    Args:
        name: ``"minilm"`` (sentence-transformers on the bundled model, CPU, offline) or ``"static"``
            (model2vec static embeddings from ``classifiers/artifacts/encoders/minilm-static/``).
        threads: torch intra-op threads for ``"minilm"`` (default 1); ignored by ``"static"``.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"auto"`` weights for ``"minilm"``; ignored by ``"static"``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
        FileNotFoundError: the bundled model or the static artifact is missing.
    """
    # Imports are deferred so choosing "static" never pays for importing torch.
    if name == "minilm":
        from classifiers.encoders.minilm import DEFAULT_THREADS, MiniLMEncoder

        return MiniLMEncoder(threads=threads if threads is not None else DEFAULT_THREADS, dtype=dtype)
    if name == "static":
        from classifiers.encoders.static import StaticEncoder

        return StaticEncoder()
    raise ValueError(f"unknown encoder {name!r}; expected one of {', '.join(ENCODER_NAMES)}")
