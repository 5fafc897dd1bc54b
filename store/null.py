"""A decision store that keeps nothing, for benchmarks that must not measure disk I/O."""

from __future__ import annotations

from collections.abc import Sequence

from store.base import check_forget_args
from store.records import DecisionRecord, FeedbackRecord, LoggedRequest, SubCallRecord
from store.schema import FORGET_TABLES


class NullDecisionStore:
    """Accepts every batch and discards it; reads find nothing."""

    async def open(self) -> None:
        return None

    async def write_batch(self, records: Sequence[DecisionRecord]) -> None:
        return None

    async def write_feedback(self, items: Sequence[FeedbackRecord]) -> None:
        return None

    async def close(self) -> None:
        return None

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        return None

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        return []

    async def count(self) -> int:
        return 0

    async def fetch_feedback(self, request_id: str) -> list[FeedbackRecord]:
        return []

    async def fetch_subcalls(self, request_id: str) -> list[SubCallRecord]:
        return []

    async def feedback_count(self) -> int:
        return 0

    async def logged_requests(
        self, *, route: str | None = None, since: float | None = None
    ) -> list[LoggedRequest]:
        return []

    async def forget(self, *, tenant: str | None = None, request_id: str | None = None) -> dict[str, int]:
        check_forget_args(tenant, request_id)
        return dict.fromkeys(FORGET_TABLES, 0)

    async def purge_expired_text(self, now: float) -> int:
        return 0
