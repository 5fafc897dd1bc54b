"""Encoding benchmark prompts the way serving encodes requests, with an on-disk cache.

Prompts go through ``classifiers.conversation.conversation_text`` (the serving text form) and the
contract encoder ``classifiers.encoders.load_encoder``. The cache key is the encoder id plus a hash of
every encoded text, so a change to either the text form or the encoder invalidates it. The cache holds
plain ``.npy`` files (no pickle) in :func:`default_cache_dir`; one that cannot be written costs the cache,
never the command.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from evals.data.paths import REPO_ROOT

log = logging.getLogger("pointsman.train")


def default_cache_dir() -> Path:
    """Where encoded texts are cached: ``$POINTSMAN_CACHE_DIR/embeddings`` when set; in a source checkout
    ``<repo>/.cache/embeddings`` (gitignored); in an installed package the user's cache
    (``$XDG_CACHE_HOME/pointsman/embeddings``, else ``~/.cache/pointsman/embeddings``), never the package's own
    directory: that is site-packages, which its user may not write (the Docker image runs as uid 10001)."""
    from classifiers.encoders.minilm_onnx import CACHE_ENV, cache_root

    if os.environ.get(CACHE_ENV):
        return cache_root() / "embeddings"
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / ".cache" / "embeddings"
    return cache_root() / "embeddings"


CACHE_DIR = default_cache_dir()
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


def _key(fingerprint: str, digests: np.ndarray) -> str:
    """The cache key of a list of texts: the encoder fingerprint and every text's sha256, in order."""
    return hashlib.sha256(fingerprint.encode() + np.ascontiguousarray(digests).tobytes()).hexdigest()[:24]


def _text_digests(texts: Sequence[str]) -> np.ndarray:
    return np.fromiter((hashlib.sha256(t.encode()).digest() for t in texts), dtype="S32", count=len(texts))


def _fill_known(prefix: str, digests: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Copy into ``out`` the cached vector of every text (by digest) that a cached list of this encoder
    fingerprint holds (files ``<prefix>-*.npy`` + ``.keys.npy``); returns which rows were found.

    Only the rows asked for are read (the vector files are memory-mapped): loading every cached list whole,
    as a dict of per-text vectors, took GBs once a few large files had been trained on. A text cached in
    several lists takes its vector from the last list read, as that dict did.
    """
    found = np.zeros(len(digests), dtype=bool)
    if not len(digests):
        return found
    for keys_path in CACHE_DIR.glob(f"{prefix}-*.keys.npy"):
        vec_path = keys_path.with_name(keys_path.name.replace(".keys.npy", ".npy"))
        if not vec_path.exists():
            continue
        keys = np.load(keys_path, allow_pickle=False)
        vecs = np.load(vec_path, mmap_mode="r", allow_pickle=False)
        if len(keys) != len(vecs) or not len(keys):
            continue  # a list torn by an interrupted write: encode its texts again
        hit = np.isin(digests, keys)
        if not hit.any():
            continue
        order = np.argsort(keys, kind="stable")
        # The last occurrence of a digest in the file (a dict filled in file order kept that one).
        at = order[np.searchsorted(keys[order], digests[hit], side="right") - 1]
        out[hit] = vecs[at]
        found |= hit
    return found


def embed_texts(encoder: _Encoder, texts: Sequence[str], batch: int = 64, progress: bool = True) -> np.ndarray:
    """Encode ``texts`` (cached on disk by encoder fingerprint and content).

    A whole-list hit loads one file; otherwise texts already encoded for any other list with the same
    encoder fingerprint are reused and only the new ones go through the encoder.
    """
    fingerprint = _fingerprint(encoder)
    digests = _text_digests(texts)
    key = _key(fingerprint, digests)
    prefix = f"{encoder.id}-{fingerprint}"
    path = CACHE_DIR / f"{prefix}-{key}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    missing = np.flatnonzero(~_fill_known(prefix, digests, out)).tolist() if CACHE_DIR.is_dir() else list(
        range(len(texts)))
    if missing:
        from tqdm import tqdm

        # Encode longest-first in batches: similar lengths per batch waste less padding.
        order = sorted(missing, key=lambda i: -len(texts[i]))
        for start in tqdm(range(0, len(order), batch), desc=f"encode {encoder.id}", disable=not progress):
            idx = order[start : start + batch]
            out[idx] = encoder.encode([texts[i] for i in idx])
    try:
        _store(path, digests, out)
    except OSError as exc:  # a read-only or root-owned cache: encode again next time, but train now
        log.warning("cannot write the embedding cache %s (%s): texts are encoded again on every run; set %s to "
                    "a writable directory to keep them", CACHE_DIR, exc.strerror or exc, "POINTSMAN_CACHE_DIR")
    return out


def _store(path: Path, digests: np.ndarray, vectors: np.ndarray) -> None:
    """Write one cached list (its text digests, then its vectors under a temporary name renamed into place)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    ignore = CACHE_DIR.parent / ".gitignore"
    if CACHE_DIR.parent == REPO_ROOT / ".cache" and not ignore.exists():
        ignore.write_text("*\n")  # keep the cache out of git without touching the repo's .gitignore
    np.save(path.with_name(path.name.replace(".npy", ".keys.npy")), digests, allow_pickle=False)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors, allow_pickle=False)
    tmp.replace(path)


def embed_prompts(encoder: _Encoder, prompts: Sequence[str], progress: bool = True) -> np.ndarray:
    """Encode benchmark prompts through the serving text form."""
    return embed_texts(encoder, [prompt_text(p) for p in prompts], progress=progress)
