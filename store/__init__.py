"""Decision-log storage: every routing decision, written in batches off the request path, the
conversation kept for retraining, and feedback on each request.

store = open_store("sqlite", path="pointsman.db", dsn=None)   # or open_store_url("sqlite:///...")
recorder = DecisionRecorder(store)
await recorder.start()          # opens the store, migrates, starts the writer task
recorder.record(DecisionRecord(...))   # from the request path: never blocks, never raises
recorder.record_feedback(FeedbackRecord(...))   # fire-and-forget (judge, implicit signals)
writer = FeedbackWriter(store); await writer.start()
await writer.submit(FeedbackRecord(...))   # returns once committed; raises StoreUnavailable
await writer.stop(); await recorder.stop()   # on shutdown: writes everything queued, closes the store
"""

from __future__ import annotations

from typing import Literal

from store.base import DecisionStore
from store.errors import RequestForgotten, StoreError, StoreNotFound, StoreSchemaNewer, StoreUnavailable
from store.feedback_writer import FeedbackWriter
from store.null import NullDecisionStore
from store.postgres import PostgresDecisionStore
from store.recorder import DecisionRecorder
from store.records import (
    COLUMNS,
    FEEDBACK_SOURCES,
    JSON_COLUMNS,
    ArmOutcomes,
    ArmStop,
    ArmTotals,
    ConversationRecord,
    DecisionRecord,
    ExperimentRow,
    FeedbackRecord,
    LatencyBin,
    LoggedRequest,
    SubCallRecord,
    TrafficBucket,
    TrafficWindow,
)
from store.schema import SCHEMA_VERSION
from store.sqlite import SQLiteDecisionStore
from store.url import open_store_url

__all__ = [
    "COLUMNS",
    "FEEDBACK_SOURCES",
    "JSON_COLUMNS",
    "SCHEMA_VERSION",
    "ArmOutcomes",
    "ArmStop",
    "ArmTotals",
    "ConversationRecord",
    "DecisionRecord",
    "DecisionRecorder",
    "DecisionStore",
    "ExperimentRow",
    "FeedbackRecord",
    "FeedbackWriter",
    "LatencyBin",
    "LoggedRequest",
    "NullDecisionStore",
    "PostgresDecisionStore",
    "RequestForgotten",
    "SQLiteDecisionStore",
    "StoreError",
    "StoreNotFound",
    "StoreSchemaNewer",
    "StoreUnavailable",
    "SubCallRecord",
    "TrafficBucket",
    "TrafficWindow",
    "open_store",
    "open_store_url",
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
