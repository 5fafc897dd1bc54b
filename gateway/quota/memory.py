"""Quotas kept in this process (``shared_state.kind: memory``): each replica counts on its own."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from gateway.quota._types import WINDOW_MS, Bucket, Correction, Spend, Verdict

_PRUNE_EVERY = 4096  # entries added between sweeps of expired buckets and counters


class MemoryQuotaStore:
    """GCRA buckets (``key -> theoretical arrival time``, ms) and spend counters with expiry, in dicts.

    Used from the event loop only: every method runs without awaiting, so a reservation is atomic.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._tats: dict[str, float] = {}
        self._spent: dict[str, tuple[int, float]] = {}  # key -> (nano-USD, expires at, epoch s)
        self._added = 0

    async def reserve(self, buckets: Sequence[Bucket], spends: Sequence[Spend]) -> Verdict:
        now_s = self._clock()
        now = now_s * 1000.0
        new_tats: list[float] = []
        for index, bucket in enumerate(buckets):
            tat = max(self._tats.get(bucket.key, now), now)
            new = tat + bucket.interval_ms * bucket.cost
            if new - now > WINDOW_MS:
                return Verdict(False, index, new - now - WINDOW_MS)
            new_tats.append(new)
        for index, spend in enumerate(spends):
            spent = self._spent_now(spend.key, now_s)
            if spent + spend.cost_nano > spend.limit_nano:
                return Verdict(False, len(buckets) + index, max(spend.ends_at - now_s, 0.0) * 1000.0, spent)
        remaining = []
        for bucket, new in zip(buckets, new_tats, strict=True):
            self._tats[bucket.key] = new
            remaining.append((math.floor((WINDOW_MS - (new - now)) / bucket.interval_ms), new - now))
        for spend in spends:
            self._spent[spend.key] = (self._spent_now(spend.key, now_s) + spend.cost_nano, now_s + spend.ttl_s)
        self._added += 1
        if self._added % _PRUNE_EVERY == 0:
            self._prune(now_s)
        return Verdict(True, remaining=remaining)

    async def settle(self, corrections: Sequence[Correction], spends: Sequence[tuple[str, int]]) -> None:
        now_s = self._clock()
        now = now_s * 1000.0
        for fix in corrections:
            tat = self._tats.get(fix.key)
            if fix.delta > 0:
                # A drained bucket may have been swept meanwhile: what the call used past its reservation
                # is still charged, from now (as the Redis store does with a bucket that expired).
                base = now if tat is None else max(tat, now)
            elif tat is None:
                continue  # swept away once drained: nothing left to give back
            else:
                base = tat
            self._tats[fix.key] = base + fix.interval_ms * fix.delta
        for key, delta in spends:
            entry = self._spent.get(key)
            if entry is not None and entry[1] > now_s:
                self._spent[key] = (max(entry[0] + delta, 0), entry[1])

    async def close(self) -> None:
        self._tats.clear()
        self._spent.clear()

    def _spent_now(self, key: str, now_s: float) -> int:
        entry = self._spent.get(key)
        return entry[0] if entry is not None and entry[1] > now_s else 0

    def _prune(self, now_s: float) -> None:
        now = now_s * 1000.0
        self._tats = {k: v for k, v in self._tats.items() if v > now}
        self._spent = {k: v for k, v in self._spent.items() if v[1] > now_s}
