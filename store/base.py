"""The decision-store interface every implementation (SQLite, PostgreSQL, null) provides."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class DecisionStore(Protocol):
    """Where decision records, their conversations, their workflows' sub-calls and feedback on them
    are persisted.

    Writers call :meth:`write_batch` from one background task (see ``DecisionRecorder``); the read
    methods serve evals and tests. ``open`` and ``close`` are idempotent. ``write_batch`` is
    idempotent per request id: a record whose ``request_id`` is already stored is ignored, so a
    batch retried after an ambiguous failure never duplicates rows. ``write_feedback`` is idempotent
    per (request_id, metric, source, model): a repeat replaces the row, never adds one.
    """

    #: The newest migration step the database records, known once :meth:`open` ran: above
    #: :data:`store.schema.SCHEMA_VERSION` when a newer release migrated it.
    schema_version: int

    async def open(self) -> None:
        """Connect and create or migrate the schema."""
        ...

    async def write_batch(self, records: Sequence[DecisionRecord]) -> int | None:
        """Persist ``records`` (and the conversation and sub-calls each carries) in one
        transaction: all of them, or none (and raise). A record a tombstone covers is left out, as is one
        whose request id is stored already (a retried batch). Returns how many were left out (None: not
        known)."""
        ...

    async def write_feedback(self, items: Sequence[FeedbackRecord]) -> Sequence[int] | None:
        """Upsert ``items`` in one transaction, durably committed when this returns; raises (and
        writes nothing) on failure. Returns the indexes of the items a tombstone covered (see
        :meth:`forget`), which were not written; None or empty when every item was."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        """The record with this request id, or None (its ``conversation`` is not loaded)."""
        ...

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        """Up to ``limit`` records, newest ``created_at`` first."""
        ...

    async def count(self) -> int:
        """How many decision records are stored."""
        ...

    async def fetch_feedback(self, request_id: str) -> list[FeedbackRecord]:
        """Every piece of feedback on ``request_id``, ordered by (metric, source, model)."""
        ...

    async def fetch_subcalls(self, request_id: str) -> list[SubCallRecord]:
        """The sub-calls a workflow made for ``request_id``, in the order they started."""
        ...

    async def feedback_count(self) -> int:
        """How many feedback rows are stored."""
        ...

    async def logged_requests(
        self, *, route: str | None = None, since: float | None = None, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        """Decisions (on ``route``, created at or after ``since``), oldest first, each joined with
        its conversation and its feedback; read as one consistent snapshot. With ``with_feedback``, only
        decisions that have feedback: what training reads, a small share of a busy store's decisions."""
        ...

    async def count_without_feedback(self, *, route: str | None = None, since: float | None = None) -> int:
        """How many decisions (on ``route``, created at or after ``since``) have no feedback at all."""
        ...

    async def forget(self, *, tenant: str | None = None, request_id: str | None = None) -> dict[str, int]:
        """Delete everything stored about a tenant or about one request (decisions, feedback,
        conversations, sub-calls); returns rows deleted per table (:data:`store.schema.FORGET_TABLES`).
        Writes a tombstone in the (first) deleting transaction: from then on the writers skip rows of the
        request (and its shadows), or of the tenant's requests issued up to the forget, so what a running
        gateway still holds (queued records, remembered ids) is not written again; later traffic is kept.
        Exactly one of ``tenant`` and ``request_id`` is given. A request's rows go in one transaction; a
        tenant's may go in several (SQLite), each deleting whole requests, so an interrupted forget
        leaves no row without its decision and running it again finishes it."""
        ...

    async def purge_expired_text(self, now: float) -> int:
        """Delete the text of conversations whose retention ended at or before ``now`` (the
        embedding stays); returns how many conversations lost their text."""
        ...

    async def reclaim_deleted(self) -> tuple[str, ...]:
        """After :meth:`forget` or :meth:`purge_expired_text` committed: remove what they deleted from the
        tables' pages where the database keeps it until a maintenance step (PostgreSQL keeps deleted row
        versions until VACUUM). Returns the tables this step ran on; () where :meth:`forget` already did
        what is needed (SQLite) or nothing is kept."""
        ...

    async def traffic(self, since: float, bucket_seconds: float) -> TrafficWindow:
        """Served decisions created at or after ``since`` (shadow rows left out), aggregated per
        ``bucket_seconds``-wide slice: per (slice, route, model) counts, errors, cost, tokens,
        latency and cache hits, and per slice a latency histogram; one consistent snapshot."""
        ...

    # --- experiments (A/B arms, shadow decisions, guardrail stops; every replica reads the same rows)

    async def register_experiment(self, name: str, route: str, spec: dict[str, Any]) -> None:
        """Register (or replace) an experiment: its route and normalised spec (arms, weights,
        control, shadows, assignment key, start/end, paused), for the report to read."""
        ...

    async def fetch_experiment(self, name: str) -> ExperimentRow | None:
        """The registered experiment of that name, or None."""
        ...

    async def list_experiments(self) -> list[ExperimentRow]:
        """Every registered experiment, by name."""
        ...

    async def stop_arm(
        self, experiment: str, arm: str, reason: str, detail: dict[str, Any], replica: str | None, at: float
    ) -> bool:
        """Stop an arm (its traffic goes to control on every replica); True if this call stored the
        stop, False if the arm was already stopped (its first stop is kept)."""
        ...

    async def resume_arm(self, experiment: str, arm: str) -> bool:
        """Remove an arm's stop; True if it was stopped."""
        ...

    async def experiment_stops(self, experiment: str | None = None) -> list[ArmStop]:
        """Stopped arms (of one experiment, or of all), oldest stop first."""
        ...

    async def experiment_totals(self, experiment: str, since: float | None = None) -> dict[str, ArmTotals]:
        """Per arm: served requests, errors and cost sums of ``experiment`` (created at or after
        ``since``), over every replica's rows; shadow rows and client disconnects left out."""
        ...

    async def experiment_outcomes(
        self, experiment: str, metric: str, since: float | None = None
    ) -> dict[str, ArmOutcomes]:
        """Per arm: the served requests of ``experiment`` (created at or after ``since``, shadow rows and
        client disconnects left out) whose feedback gives an outcome under ``metric``, and the sum of
        those outcomes clamped to [0, 1], computed in the store (no request crosses into Python); a
        request's outcome is :func:`store.outcomes.served_feedback`'s with the judge. Arms without
        feedback are absent."""
        ...

    async def experiment_latencies(self, experiment: str, since: float) -> dict[str, list[float]]:
        """Per arm: latency_ms of the served requests created at or after ``since``."""
        ...

    async def get_assignment(self, experiment: str, key_hash: str) -> tuple[str, float | None] | None:
        """A key's sticky (arm, propensity), or None when it was never assigned."""
        ...

    async def put_assignment(
        self, experiment: str, key_hash: str, arm: str, propensity: float | None, at: float
    ) -> tuple[str, float | None]:
        """Assign a key to ``arm`` unless it already is (the first writer wins across replicas);
        returns the (arm, propensity) now stored."""
        ...

    async def experiment_requests(
        self, experiment: str, since: float | None = None, *, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        """Every decision row of ``experiment`` (served and shadow), oldest first, each with its
        feedback (conversations are not loaded); with ``with_feedback``, only the rows that have some.
        Each row's signals, reason and error message are read empty (:data:`store.schema.EXPERIMENT_UNREAD`):
        no experiment read uses them and they are most of a row."""
        ...


def check_forget_args(tenant: str | None, request_id: str | None) -> tuple[bool, str]:
    """(by_tenant, value) for :meth:`DecisionStore.forget`; refuses none or both of them."""
    if (tenant is None) == (request_id is None):
        raise ValueError("forget needs exactly one of tenant= or request_id=")
    if tenant is not None:
        return True, tenant
    assert request_id is not None
    return False, request_id
