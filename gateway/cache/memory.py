"""The in-process store (``shared_state.kind: memory``): one per route, bounded by ``max_entries``.

Entries are kept least-recently-used first and expire ``ttl`` seconds after they were stored;
semantic buckets keep their newest ``bucket_size`` items and are bounded by ``max_entries`` too (least
recently looked up or written evicted). A bucket item whose entry is gone is dropped when a lookup finds
it among its best matches (:meth:`MemoryStore.first_live`).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

from gateway.cache.entry import BucketItem, CachedAnswer
from gateway.cache.key import CacheKeys


class MemoryStore:
    """Cached answers of one route in this process."""

    def __init__(self, max_entries: int, bucket_size: int) -> None:
        self.max_entries = max_entries
        self.bucket_size = bucket_size
        # key -> (expires at (monotonic), tenant digest, answer)
        self._entries: OrderedDict[str, tuple[float, str, CachedAnswer]] = OrderedDict()
        self._buckets: OrderedDict[str, deque[BucketItem]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def lookup(self, keys: CacheKeys) -> tuple[CachedAnswer | None, list[BucketItem]]:
        """The exact entry (or None) and the items of the request's bucket (semantic mode)."""
        items: list[BucketItem] = []
        if keys.bucket is not None:
            bucket = self._buckets.get(keys.bucket)
            if bucket is not None:
                items = list(bucket)
                # A scope looked up is in use: its bucket is evicted least recently *used*, like its entries
                # (evicted by puts of other scopes only, it went while its entries were being hit).
                self._buckets.move_to_end(keys.bucket)
        return await self.get(keys.exact), items

    async def get(self, key: str) -> CachedAnswer | None:
        """The live entry stored under ``key``."""
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= time.monotonic():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return found[2]

    async def first_live(self, keys: CacheKeys, candidates: list[str]) -> tuple[int, CachedAnswer] | None:
        """The first of ``candidates`` (exact keys of semantic matches, best first) whose entry is live: its
        position and answer (None: none is). The candidates before it, whose entries are gone (evicted or
        expired), are dropped from the request's bucket, where they would keep shadowing live matches."""
        stale: set[str] = set()
        found: tuple[int, CachedAnswer] | None = None
        for position, key in enumerate(candidates):
            answer = await self.get(key)
            if answer is not None:
                found = (position, answer)
                break
            stale.add(key)
        bucket = self._buckets.get(keys.bucket) if keys.bucket is not None else None
        if stale and bucket is not None:
            kept = [item for item in bucket if item.key not in stale]
            bucket.clear()
            bucket.extend(kept)
        return found

    def put_now(self, keys: CacheKeys, answer: CachedAnswer, item: BucketItem | None, ttl: float) -> None:
        """Store ``answer`` under ``keys.exact`` (and ``item`` in its bucket), evicting the least recent.

        Idempotent per exact key: a live entry under that key is kept as it is (identical requests in flight
        together all missed; the first answer stored is the one replayed), and a bucket holds one item per
        key, so duplicates never push a scope's other answers out of its newest ``bucket_size``."""
        current = self._entries.get(keys.exact)
        if current is not None and current[0] > time.monotonic():
            return
        self._entries[keys.exact] = (time.monotonic() + ttl, keys.tenant, answer)
        self._entries.move_to_end(keys.exact)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        if item is not None and keys.bucket is not None:
            bucket = self._buckets.get(keys.bucket)
            if bucket is None:
                bucket = self._buckets[keys.bucket] = deque(maxlen=self.bucket_size)
            if any(old.key == item.key for old in bucket):  # left by an entry of this key that is gone
                kept = [old for old in bucket if old.key != item.key]
                bucket.clear()
                bucket.extend(kept)
            bucket.appendleft(item)
            self._buckets.move_to_end(keys.bucket)
            while len(self._buckets) > self.max_entries:
                self._buckets.popitem(last=False)

    def forget_tenant(self, tenant: str) -> int:
        """Drop every entry of a tenant (by its digest); their bucket items point nowhere then."""
        doomed = [key for key, (_, owner, _) in self._entries.items() if owner == tenant]
        for key in doomed:
            del self._entries[key]
        return len(doomed)

    async def close(self) -> None:
        self._entries.clear()
        self._buckets.clear()
