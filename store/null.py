"""A decision store that keeps nothing, for benchmarks that must not measure disk I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from store.base import check_forget_args
from store.records import (
    ArmOutcomes,
    ArmStop,
    ArmTotals,
    DecisionRecord,
    ExperimentRow,
    FeedbackRecord,
    LoggedRequest,
    SubCallRecord,
    TrafficWindow,
)
from store.schema import FORGET_TABLES, SCHEMA_VERSION


class NullDecisionStore:
    """Accepts every batch and discards it; reads find nothing."""

    schema_version = SCHEMA_VERSION

    async def open(self) -> None:
        return None

    async def write_batch(self, records: Sequence[DecisionRecord]) -> int | None:
        return None

    async def write_feedback(self, items: Sequence[FeedbackRecord]) -> list[int]:
        return []

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
        self, *, route: str | None = None, since: float | None = None, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        return []

    async def count_without_feedback(self, *, route: str | None = None, since: float | None = None) -> int:
        return 0

    async def forget(self, *, tenant: str | None = None, request_id: str | None = None) -> dict[str, int]:
        check_forget_args(tenant, request_id)
        return dict.fromkeys(FORGET_TABLES, 0)

    async def purge_expired_text(self, now: float) -> int:
        return 0

    async def reclaim_deleted(self) -> tuple[str, ...]:
        return ()

    async def traffic(self, since: float, bucket_seconds: float) -> TrafficWindow:
        return TrafficWindow(since=since, bucket_seconds=bucket_seconds)

    async def register_experiment(self, name: str, route: str, spec: dict[str, Any]) -> None:
        return None

    async def fetch_experiment(self, name: str) -> ExperimentRow | None:
        return None

    async def list_experiments(self) -> list[ExperimentRow]:
        return []

    async def stop_arm(
        self, experiment: str, arm: str, reason: str, detail: dict[str, Any], replica: str | None, at: float
    ) -> bool:
        return False

    async def resume_arm(self, experiment: str, arm: str) -> bool:
        return False

    async def experiment_stops(self, experiment: str | None = None) -> list[ArmStop]:
        return []

    async def experiment_totals(self, experiment: str, since: float | None = None) -> dict[str, ArmTotals]:
        return {}

    async def experiment_outcomes(
        self, experiment: str, metric: str, since: float | None = None
    ) -> dict[str, ArmOutcomes]:
        return {}

    async def experiment_latencies(self, experiment: str, since: float) -> dict[str, list[float]]:
        return {}

    async def get_assignment(self, experiment: str, key_hash: str) -> tuple[str, float | None] | None:
        return None

    async def put_assignment(
        self, experiment: str, key_hash: str, arm: str, propensity: float | None, at: float
    ) -> tuple[str, float | None]:
        return arm, propensity  # nothing kept: the caller's in-memory assignment is all there is

    async def experiment_requests(
        self, experiment: str, since: float | None = None, *, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        return []
