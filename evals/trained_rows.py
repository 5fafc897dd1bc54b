"""Which requests a registry version was trained on, so the promotion gate can leave them out.

``pointsman train`` writes ``trained_rows.npy`` into the version: the sorted, distinct 64-bit hashes of
the key of every request it trained on (the fold key, :func:`evals.retrain.row_key`: the conversation
text, else the request id, else the stored embedding), the warm-start prior's prompts included. No text
is stored, only hashes. The text is normalised before hashing (Unicode NFKC, casefolded, runs of
whitespace made one space), so a prompt asked again with other capitals or spacing counts as seen;
records written before this (``hash`` says which) keep their exact hashes and are matched exactly.
``pointsman promote`` hashes its held-out requests the same way and leaves out those the candidate or
the active version was trained on: a gate must not grade a router on its own training rows, and should
not grade the incumbent on its own either. Membership is by row rather than by source, so new traffic
logged after training counts as held out even from the same store.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from classifiers.registry import ResolvedRouters
    from evals.retrain import KeyedRequest

TRAINED_ROWS_FILE = "trained_rows.npy"
#: Beside the shipped heads' ``trained_rows.npy`` (they have no ``version.json`` to say it): its ``hash``.
TRAINED_ROWS_INFO = "trained_rows.json"
#: The key hash records written before text was normalised (still read, matched exactly).
HASH_EXACT = "blake2b-64 of the fold key (the conversation text, else the request id, else the stored embedding)"
HASH = (
    "blake2b-64 of the normalised fold key (the conversation text in NFKC, casefolded, whitespace collapsed; "
    "else the request id, else the stored embedding)"
)


@dataclass(frozen=True)
class TrainedRows:
    """The record of the requests a router was trained on: their key hashes, and how keys were hashed."""

    hashes: np.ndarray
    normalised: bool = True

    def __len__(self) -> int:
        return len(self.hashes)

    def contains(self, rows: Sequence[KeyedRequest]) -> np.ndarray:
        """For each of ``rows``, whether the router was trained on it (hashed the way the record was)."""
        return self.contains_hashes(key_hashes(rows, normalised=self.normalised))

    def contains_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """:meth:`contains` for rows already hashed (:func:`key_hashes` with this record's ``normalised``)."""
        return np.isin(hashes, self.hashes)


def hash_key(key: str) -> int:
    """The 64-bit hash of one fold key."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def normalise_text(text: str) -> str:
    """The text two requests share when they differ only in Unicode form, capitals or spacing."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def key_hashes(rows: Iterable[KeyedRequest], *, normalised: bool = True) -> np.ndarray:
    """The 64-bit hash of each row's key (labelled rows or logged outcomes), in row order; the text
    normalised (:func:`normalise_text`) unless ``normalised`` is False (records from before)."""
    from evals.retrain import row_key

    def key(r: KeyedRequest) -> str:
        k = row_key(r)
        return normalise_text(k) if normalised and r.has_text else k

    return np.array([hash_key(key(r)) for r in rows], dtype=np.uint64)


def write_trained_rows(directory: Path, rows: Iterable[KeyedRequest]) -> dict[str, Any]:
    """Write the distinct hashes of ``rows`` into ``directory``; returns what ``version.json`` records."""
    hashes = np.unique(key_hashes(rows))
    np.save(directory / TRAINED_ROWS_FILE, hashes, allow_pickle=False)
    return {"file": TRAINED_ROWS_FILE, "count": len(hashes), "hash": HASH}


def write_bundled_trained_rows(directory: Path, data_dir: Path) -> dict[str, Any]:
    """Write the record of what the shipped heads learnt from into their directory: the RouteLLM
    prompts of the train and validation splits (fitted on train, calibrated and selected on validation;
    the test split stays held out), keyed as ``--data bundled`` loads them."""
    from evals.data import DEFAULT_SEED, split_of
    from evals.labelled import load_routellm_rows

    rows = [r for r in load_routellm_rows(data_dir) if split_of(_prompt(r), DEFAULT_SEED) != "test"]
    info = write_trained_rows(directory, rows)
    (directory / TRAINED_ROWS_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def _prompt(row: Any) -> str:
    (message,) = row.messages  # load_routellm_rows: one user message per prompt
    return str(message["content"])


def load_trained_rows(version_dir: Path, recorded: Any) -> TrainedRows | None:
    """The hashes a version recorded, or ``None`` when it recorded none (older versions).

    A recorded but unreadable file is an error (``OSError``/``ValueError``): the gate must not silently
    treat a version as trained on nothing.
    """
    if not isinstance(recorded, dict) or "file" not in recorded:
        return None
    hashes = np.load(version_dir / str(recorded["file"]), allow_pickle=False)
    if hashes.dtype != np.uint64 or hashes.ndim != 1:
        raise ValueError(f"{version_dir / str(recorded['file'])}: not a 1-d uint64 array")
    return TrainedRows(hashes, normalised=recorded.get("hash") == HASH)


def trained_mask(rows: Sequence[KeyedRequest], trained: TrainedRows | None) -> np.ndarray:
    """For each of ``rows``, whether it is among the ``trained`` rows (all False for ``None``)."""
    if trained is None:
        return np.zeros(len(rows), dtype=bool)
    return trained.contains(rows)


def router_training_rows(routers_dir: str | Path | None) -> tuple[str, TrainedRows] | None:
    """The version id and training-row hashes of the router ``routers_dir`` serves (a registry's active
    version, a version directory, or the shipped heads' directory with its ``trained_rows.npy``), or None
    when it recorded none (older versions)."""
    from classifiers.registry import resolve_routers_dir

    return resolved_training_rows(resolve_routers_dir(routers_dir))


def resolved_training_rows(resolved: ResolvedRouters) -> tuple[str, TrainedRows] | None:
    """:func:`router_training_rows` of an already resolved router (the one a gate compared against)."""
    from classifiers.registry import VERSION_FILE

    try:
        raw = json.loads((resolved.directory / VERSION_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        # No registry version: the shipped heads (or a directory rebuilt like them) keep the file alone.
        if not (resolved.directory / TRAINED_ROWS_FILE).is_file():
            return None
        recorded: dict[str, Any] = {"file": TRAINED_ROWS_FILE, "hash": HASH_EXACT}
        info = resolved.directory / TRAINED_ROWS_INFO
        if info.is_file():
            recorded["hash"] = json.loads(info.read_text(encoding="utf-8")).get("hash", HASH_EXACT)
        raw = {"version": resolved.version, "trained_rows": recorded}
    if not isinstance(raw, dict):
        return None
    hashes = load_trained_rows(resolved.directory, raw.get("trained_rows"))
    if hashes is None:
        return None
    return str(raw.get("version") or resolved.version), hashes
