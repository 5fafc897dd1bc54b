"""The in-process store (``shared_state.kind: memory``): one per route, bounded by ``max_entries``.

Entries are kept least-recently-used first and expire ``ttl`` seconds after they were stored;
semantic buckets keep their newest ``bucket_size`` items and are bounded by ``max_entries`` too (least
recently looked up or written evicted). An entry that goes (evicted, expired, forgotten) takes its bucket
item with it: a bucket holds only live entries' items, so dead ones never take the place of live ones
among a scope's newest ``bucket_size``, nor keep an embedding the store no longer answers for.
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
        # key -> (expires at (monotonic), tenant digest, answer, the bucket holding its item or None)
        self._entries: OrderedDict[str, tuple[float, str, CachedAnswer, str | None]] = OrderedDict()
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
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return found[2]

    async def first_live(self, keys: CacheKeys, candidates: list[str]) -> tuple[int, CachedAnswer] | None:
        """The first of ``candidates`` (exact keys of semantic matches, best first) whose entry is live: its
        position and answer (None: none is). A candidate found expired leaves the bucket with its entry."""
        for position, key in enumerate(candidates):
            answer = await self.get(key)
            if answer is not None:
                return position, answer
        return None

    def put_now(self, keys: CacheKeys, answer: CachedAnswer, item: BucketItem | None, ttl: float) -> None:
        """Store ``answer`` under ``keys.exact`` (and ``item`` in its bucket), evicting the least recent.

        Idempotent per exact key: a live entry under that key is kept as it is (identical requests in flight
        together all missed; the first answer stored is the one replayed), and a bucket holds one item per
        key, so duplicates never push a scope's other answers out of its newest ``bucket_size``."""
        current = self._entries.get(keys.exact)
        if current is not None and current[0] > time.monotonic():
            return
        if current is not None:  # expired: its item goes with it
            self._drop(keys.exact)
        indexed = keys.bucket if item is not None else None
        self._entries[keys.exact] = (time.monotonic() + ttl, keys.tenant, answer, indexed)
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
        if item is not None and indexed is not None:
            bucket = self._buckets.get(indexed)
            if bucket is None:
                bucket = self._buckets[indexed] = deque(maxlen=self.bucket_size)
            bucket.appendleft(item)
            self._buckets.move_to_end(indexed)
            while len(self._buckets) > self.max_entries:
                self._buckets.popitem(last=False)

    def _drop(self, key: str) -> None:
        """Delete the entry under ``key`` and its item from its bucket (O(bucket_size))."""
        _, _, _, indexed = self._entries.pop(key)
        bucket = self._buckets.get(indexed) if indexed is not None else None
        if bucket is not None and any(item.key == key for item in bucket):
            kept = [item for item in bucket if item.key != key]
            bucket.clear()
            bucket.extend(kept)

    def forget_tenant(self, tenant: str) -> int:
        """Drop every entry of a tenant (by its digest), with its bucket item."""
        doomed = [key for key, (_, owner, _, _) in self._entries.items() if owner == tenant]
        for key in doomed:
            self._drop(key)
        return len(doomed)

    async def close(self) -> None:
        self._entries.clear()
        self._buckets.clear()
