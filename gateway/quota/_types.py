"""What a quota store is asked and answers: token buckets (GCRA) and spend lines, as plain values.

A :class:`Bucket` is a GCRA limit of ``limit`` units per minute (requests or tokens) with a burst of a
whole minute's worth; a :class:`Spend` is one budget's period counter in nano-USD (integers: no float
drift however many settlements). One :meth:`QuotaStore.reserve` checks every bucket and spend line of
a request and takes them all or none; :meth:`QuotaStore.settle` corrects them by what the call used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

WINDOW_MS = 60_000.0  # limits are per minute; the burst (GCRA's tolerance) is one minute's worth
NANO = 1_000_000_000  # nano-USD per USD


class QuotaUnavailable(Exception):
    """The shared store (Redis) could not be asked; the caller applies ``shared_state.fail``."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """``cost`` units of a ``limit``-per-minute GCRA bucket stored under ``key``."""

    key: str
    limit: int
    cost: int
    unit: str  # "requests" or "tokens"
    scope: str  # what it limits, for messages: "API key 'team-a'", "route 'auto'"

    @property
    def interval_ms(self) -> float:
        """Milliseconds one unit occupies the bucket (GCRA's emission interval)."""
        return WINDOW_MS / self.limit


@dataclass(frozen=True, slots=True)
class Spend:
    """``cost_nano`` reserved against a budget of ``limit_nano`` in the period counter ``key``."""

    key: str
    limit_nano: int
    cost_nano: int
    ttl_s: int  # the counter outlives its period by a day, then expires
    period: str  # "day" or "month"
    ends_at: float  # epoch seconds when the period ends (Retry-After)
    scope: str


@dataclass(slots=True)
class Verdict:
    """A reservation's answer. When refused, ``refused`` indexes ``buckets + spends`` of the ask."""

    allowed: bool
    refused: int = -1
    retry_after_ms: float = 0.0
    spent_nano: int = 0  # the refused budget's spend so far (reserved included)
    # per bucket of the ask, when allowed: (units left, milliseconds until the bucket is full again)
    remaining: list[tuple[int, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Correction:
    """Settle a bucket by ``delta`` units (negative: give back part of the reservation)."""

    key: str
    interval_ms: float
    delta: int


class QuotaStore(Protocol):
    """Where buckets and spend counters live: this process (:class:`MemoryQuotaStore`) or Redis."""

    async def reserve(self, buckets: Sequence[Bucket], spends: Sequence[Spend]) -> Verdict:
        """Take every bucket's and spend line's cost, or none of them (refused), in one step.

        Raises:
            QuotaUnavailable: the store could not be asked.
        """
        ...

    async def settle(self, corrections: Sequence[Correction], spends: Sequence[tuple[str, int]]) -> None:
        """Correct buckets and spend counters (``(key, delta_nano)``) by what the call really used.

        Raises:
            QuotaUnavailable: the store could not be written.
        """
        ...

    async def close(self) -> None:
        """Release what the store holds (a Redis connection it opened)."""
        ...
