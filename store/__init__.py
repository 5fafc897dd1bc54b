"""Decision-log storage: every routing decision, written in batches off the request path.

store = open_store("sqlite", path="pointsman.db", dsn=None)
recorder = DecisionRecorder(store)
await recorder.start()          # opens the store, migrates, starts the writer task
recorder.record(DecisionRecord(...))   # from the request path: never blocks, never raises
await recorder.stop()           # on shutdown: writes everything queued, closes the store
"""

from __future__ import annotations

from typing import Literal

from store.base import DecisionStore
from store.null import NullDecisionStore
from store.postgres import PostgresDecisionStore
from store.recorder import DecisionRecorder
from store.records import COLUMNS, JSON_COLUMNS, DecisionRecord
from store.schema import SCHEMA_VERSION
from store.sqlite import SQLiteDecisionStore

__all__ = [
    "COLUMNS",
    "JSON_COLUMNS",
    "SCHEMA_VERSION",
    "DecisionRecord",
    "DecisionRecorder",
    "DecisionStore",
    "NullDecisionStore",
    "PostgresDecisionStore",
    "SQLiteDecisionStore",
    "open_store",
]

StoreKind = Literal["sqlite", "postgres", "none"]


def open_store(kind: StoreKind, path: str = "pointsman.db", dsn: str | None = None) -> DecisionStore:
    """Build the store ``kind`` names (not yet connected: ``await store.open()`` or
    ``DecisionRecorder.start()`` connects and migrates).

    ``path`` is the SQLite file; ``dsn`` the PostgreSQL URL, required for ``"postgres"``.
    ``"none"`` discards every record (for benchmarks).
    """
    if kind == "sqlite":
        return SQLiteDecisionStore(path)
    if kind == "postgres":
        if not dsn:
            raise ValueError("a postgres decision store needs a dsn")
        return PostgresDecisionStore(dsn)
    if kind == "none":
        return NullDecisionStore()
    raise ValueError(f"unknown decision store kind {kind!r}; expected sqlite, postgres or none")
