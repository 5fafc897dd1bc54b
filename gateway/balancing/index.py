"""An approximate, bounded index of which replicas have seen which conversation prefixes.

One table for a backend: block hash (see :mod:`gateway.balancing.prefix`) -> a bit mask of the
replicas (by slot) that were sent a prompt through that block, and when the entry was last touched.
It is approximate by design: it knows what this gateway (and, through hints, its peers) sent, not what
each engine still holds. Three things keep it close to the engines:

* **Bounded, least-recently-used**: at most ``max_entries`` blocks; the least recently touched go
  first, as in the engines' own caches. Touching costs O(1) (an ``OrderedDict`` move).
* **Aged out**: an entry untouched for ``ttl`` seconds is ignored and then dropped, since an engine
  under load evicts a cold prefix long before a gateway-sized table would.
* **Forgotten on failure**: :meth:`forget` drops a replica's bit from every entry at once (lazily: a
  replica that went unhealthy, restarted or lost its cache never attracts its old sessions back).

A lookup walks a conversation's blocks from the longest prefix down and stops at the first block a
usable replica has seen: later turns of a session hit on their previous turn's last block after a few
steps. No lookup or update allocates anything that grows with the table.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence


class PrefixIndex:
    """Block hash -> replicas that saw it, bounded to ``max_entries`` and aged out after ``ttl`` seconds."""

    __slots__ = ("_clock", "_entries", "_forgotten", "max_entries", "ttl")

    def __init__(self, max_entries: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl = ttl
        self._entries: OrderedDict[int, list[float]] = OrderedDict()  # hash -> [mask, touched_at]
        self._forgotten: list[tuple[float, int]] = []  # (when, bit) of replicas whose entries are void
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, hashes: Sequence[int], usable: int) -> tuple[int, int]:
        """``(position, mask)`` of the longest block of ``hashes`` that a replica in ``usable`` has seen
        (mask: those replicas), or ``(-1, 0)``."""
        entries = self._entries
        oldest = self._clock() - self.ttl
        for position in range(len(hashes) - 1, -1, -1):
            entry = entries.get(hashes[position])
            if entry is None or entry[1] < oldest:
                continue
            mask = int(entry[0]) & usable
            if mask and self._forgotten:
                mask &= ~self._void_bits(entry[1])
            if mask:
                return position, mask
        return -1, 0

    def record(self, hashes: Sequence[int], bit: int, start: int = 0) -> None:
        """Note that the replica ``bit`` was sent the blocks ``hashes[start:]`` (touching them)."""
        entries = self._entries
        now = self._clock()
        forgotten = self._forgotten
        for position in range(start, len(hashes)):
            key = hashes[position]
            entry = entries.get(key)
            if entry is None:
                entries[key] = [bit, now]
            else:
                mask = int(entry[0])
                if forgotten:
                    mask &= ~self._void_bits(entry[1])
                entry[0], entry[1] = mask | bit, now
                entries.move_to_end(key)
        self._trim(now)

    def place(self, key: int, bit: int) -> None:
        """Note that ``key`` now belongs to replica ``bit`` alone (a session's last replica, touched)."""
        entries = self._entries
        now = self._clock()
        entry = entries.get(key)
        if entry is None:
            entries[key] = [bit, now]
        else:
            entry[0], entry[1] = bit, now
            entries.move_to_end(key)
        self._trim(now)

    def forget(self, bit: int) -> None:
        """Void replica ``bit``'s part of every entry touched until now (its cache is gone or unreachable)."""
        now = self._clock()
        self._forgotten = [(when, b) for when, b in self._forgotten if when >= now - self.ttl]
        self._forgotten.append((now, bit))

    def _void_bits(self, touched_at: float) -> int:
        void = 0
        for when, bit in self._forgotten:
            if when >= touched_at:
                void |= bit
        return void

    def _trim(self, now: float) -> None:
        entries = self._entries
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
        oldest = now - self.ttl
        # The front is the least recently touched: drop expired entries from there (amortised O(1)).
        while entries:
            key = next(iter(entries))
            if entries[key][1] >= oldest:
                break
            del entries[key]
