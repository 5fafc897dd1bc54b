"""Encoding benchmark prompts the way serving encodes requests, with an on-disk cache.

Prompts go through ``classifiers.conversation.conversation_text`` (the serving text form) and the
contract encoder ``classifiers.encoders.load_encoder``. The cache key is the encoder id plus a hash of
every encoded text, so a change to either the text form or the encoder invalidates it. The cache lives
in ``<repo>/.cache/embeddings/`` (gitignored) as plain ``.npy`` files (no pickle).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from evals.data.paths import REPO_ROOT

CACHE_DIR = REPO_ROOT / ".cache" / "embeddings"
_MAX_CHARS = 2000


class _Encoder(Protocol):
    id: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def prompt_text(prompt: str) -> str:
    """The text serving would encode for a one-message user request holding ``prompt``."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]}
    try:
        from classifiers.conversation import conversation_text
    except ImportError:  # the contract module is not there yet: the same bounded single-turn form
        return prompt[:_MAX_CHARS]
    return conversation_text(body, max_chars=_MAX_CHARS)


def get_encoder(name: str, *, runtime: str = "onnx", dtype: str = "float32") -> _Encoder:
    """The contract encoder ``name`` ("minilm" | "static").

    Training uses the defaults, MiniLM in float32 on ONNX Runtime (the same vectors as
    sentence-transformers on any CPU), so ``pointsman train`` is reproducible across machines; a
    benchmark may ask for the runtime the gateway serves with (``runtime="auto"``, ``dtype="auto"``).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from classifiers.encoders import load_encoder

    return load_encoder(name, runtime=runtime, dtype=dtype)


_PROBE = "Pointsman encoder fingerprint: how many r's are in strawberry? 12 + 30 = 42."


def _fingerprint(encoder: _Encoder) -> str:
    # The id names the encoder family; the probe vector catches re-distilled weights under the same id.
    probe = np.round(np.asarray(encoder.encode([_PROBE]), dtype=np.float32), 4)
    return hashlib.sha256(encoder.id.encode() + probe.tobytes()).hexdigest()[:12]


def _key(encoder: _Encoder, texts: Sequence[str]) -> str:
    h = hashlib.sha256(_fingerprint(encoder).encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:24]


def _text_digests(texts: Sequence[str]) -> np.ndarray:
    return np.array([hashlib.sha256(t.encode()).digest() for t in texts], dtype="S32")


def _known_vectors(prefix: str) -> dict[bytes, np.ndarray]:
    """Every cached vector of this encoder fingerprint, by text digest (files ``<prefix>-*.npy`` + ``.keys.npy``)."""
    known: dict[bytes, np.ndarray] = {}
    for keys_path in CACHE_DIR.glob(f"{prefix}-*.keys.npy"):
        vec_path = keys_path.with_name(keys_path.name.replace(".keys.npy", ".npy"))
        if vec_path.exists():
            keys, vecs = np.load(keys_path, allow_pickle=False), np.load(vec_path, allow_pickle=False)
            known.update(zip(keys.tolist(), vecs, strict=True))
    return known


def embed_texts(encoder: _Encoder, texts: Sequence[str], batch: int = 64, progress: bool = True) -> np.ndarray:
    """Encode ``texts`` (cached on disk by encoder fingerprint and content).

    A whole-list hit loads one file; otherwise texts already encoded for any other list with the same
    encoder fingerprint are reused and only the new ones go through the encoder.
    """
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    ignore = CACHE_DIR.parent / ".gitignore"
    if not ignore.exists():  # keep the cache out of git without touching the repo's .gitignore
        ignore.write_text("*\n")
    key = _key(encoder, texts)
    prefix = f"{encoder.id}-{_fingerprint(encoder)}"
    path = CACHE_DIR / f"{prefix}-{key}.npy"
    if path.exists():
        return np.load(path, allow_pickle=False)
    digests = _text_digests(texts)
    known = _known_vectors(prefix)
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    missing = []
    for i, dg in enumerate(digests.tolist()):
        vec = known.get(dg)
        if vec is None:
            missing.append(i)
        else:
            out[i] = vec
    if missing:
        from tqdm import tqdm

        # Encode longest-first in batches: similar lengths per batch waste less padding.
        order = sorted(missing, key=lambda i: -len(texts[i]))
        for start in tqdm(range(0, len(order), batch), desc=f"encode {encoder.id}", disable=not progress):
            idx = order[start : start + batch]
            out[idx] = encoder.encode([texts[i] for i in idx])
    np.save(path.with_name(path.name.replace(".npy", ".keys.npy")), digests, allow_pickle=False)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, out, allow_pickle=False)
    tmp.replace(path)
    return out


def embed_prompts(encoder: _Encoder, prompts: Sequence[str], progress: bool = True) -> np.ndarray:
    """Encode benchmark prompts through the serving text form."""
    return embed_texts(encoder, [prompt_text(p) for p in prompts], progress=progress)
