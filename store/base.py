"""The decision-store interface every implementation (SQLite, PostgreSQL, null) provides."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from store.records import DecisionRecord


@runtime_checkable
class DecisionStore(Protocol):
    """Where decision records are persisted.

    Writers call :meth:`write_batch` from one background task (see ``DecisionRecorder``); the read
    methods serve evals and tests. ``open`` and ``close`` are idempotent. ``write_batch`` is
    idempotent per request id: a record whose ``request_id`` is already stored is ignored, so a
    batch retried after an ambiguous failure never duplicates rows.
    """

    async def open(self) -> None:
        """Connect and create or migrate the schema."""
        ...

    async def write_batch(self, records: Sequence[DecisionRecord]) -> None:
        """Persist ``records`` in one transaction: all of them, or none (and raise)."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        """The record with this request id, or None."""
        ...

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        """Up to ``limit`` records, newest ``created_at`` first."""
        ...

    async def count(self) -> int:
        """How many decision records are stored."""
        ...
