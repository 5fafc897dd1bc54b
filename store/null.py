"""A decision store that keeps nothing, for benchmarks that must not measure disk I/O."""

from __future__ import annotations

from collections.abc import Sequence

from store.records import DecisionRecord


class NullDecisionStore:
    """Accepts every batch and discards it; reads find nothing."""

    async def open(self) -> None:
        return None

    async def write_batch(self, records: Sequence[DecisionRecord]) -> None:
        return None

    async def close(self) -> None:
        return None

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        return None

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        return []

    async def count(self) -> int:
        return 0
