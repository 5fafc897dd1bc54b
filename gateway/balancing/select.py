"""Replica selection policies: which replica of a backend serves a request.

The same code decides in the gateway (:meth:`gateway.pool.Backend.pick`) and in the replica simulator
(``bench/agent_replicas.py``): a policy sees the usable replicas through :class:`ReplicaLoad` (slot,
requests and tokens in flight, load reported by the engine) and the request through :class:`Affinity`.

* ``round_robin``: in turn (a baseline).
* ``least_outstanding``: the least-loaded replica, ties in turn.
* ``session_affinity``: a session's first turn goes to the least-loaded replica, later turns to the same
  one while it is usable (a bounded, aged table of session -> replica).
* ``cache_aware``: the replica most likely to hold the longest prefix of the conversation
  (:class:`~gateway.balancing.index.PrefixIndex`), unless its load exceeds the least-loaded replica's by
  more than ``balance_abs`` *and* by more than a factor ``balance_rel``; then the least-loaded one.
  When no replica holds a whole block of the prefix (a short chat fits in one partial block, which
  changes every turn), the replica that served the session last, under the same bounds; else the
  least-loaded one. Without bounds (``bounded=False``) it is pure prefix affinity — a baseline that
  shows what the bounds are for.

Load is requests in flight (``load: requests``) or estimated tokens in flight (``load: tokens``), plus
what the engines report beyond this gateway's own requests when engine metrics are polled.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from gateway.balancing.index import PrefixIndex
from gateway.balancing.prefix import BYTES_PER_TOKEN, PrefixBlocks

#: Default load bounds of ``cache_aware`` (requests in flight): measured in ``bench/agent_replicas.py``,
#: abs 16 keeps the goodput of tighter bounds with less than half their TTFT p99 at moderate load.
DEFAULT_BALANCE_ABS = 16.0
DEFAULT_BALANCE_REL = 1.5

PolicyName = Literal["round_robin", "least_outstanding", "session_affinity", "prefix_affinity", "cache_aware"]
LoadKind = Literal["requests", "tokens"]


class ReplicaLoad(Protocol):
    """What a policy reads of a replica."""

    slot: int  # position in the backend's replica list: its bit in the prefix index
    outstanding: int  # requests in flight from this gateway
    tokens_in_flight: int  # estimated prompt (uncached) + output tokens in flight from this gateway
    external_load: float  # requests the engine reports beyond this gateway's own (0 when not polled)


R = TypeVar("R", bound=ReplicaLoad)


@dataclass(slots=True)
class Affinity:
    """What a request brings to replica choice: its prefix blocks, session key hash, size estimates."""

    blocks: PrefixBlocks | None = None
    session: int | None = None  # a 64-bit hash of the (tenant-scoped) session key
    output_tokens: int = 256  # expected completion tokens (max_tokens, capped) for the token load
    prompt_bytes: int = 0  # the request body's size, for a prompt-token estimate without blocks

    def prompt_tokens(self) -> int:
        """Estimated prompt tokens."""
        if self.blocks is not None:
            return self.blocks.tokens()
        return self.prompt_bytes // BYTES_PER_TOKEN


@dataclass(slots=True)
class Choice:
    """A policy's pick and why (``reason``: load, prefix, imbalance, session, in_turn)."""

    replica: ReplicaLoad
    reason: str
    matched: int = -1  # position of the longest prefix block the chosen replica is believed to hold
    cached_tokens: int = 0  # estimated prompt tokens the chosen replica already holds
    load_tokens: int = 0  # tokens this request adds to the replica's tokens in flight

    def describe(self, policy: str) -> dict[str, object]:
        """The choice for a decision record (``decision.replica``)."""
        return {"policy": policy, "reason": self.reason, "cached_tokens_est": self.cached_tokens}


class ReplicaPolicy:
    """Base: least-loaded among ``candidates`` (ties in turn); subclasses add affinity."""

    name: str = "least_outstanding"
    needs_blocks = False
    needs_session = False

    def __init__(self, load: LoadKind = "requests") -> None:
        self.load_kind = load
        self._turn = itertools.count()

    def load(self, replica: ReplicaLoad) -> float:
        """The replica's load as this policy compares it."""
        if self.load_kind == "tokens":
            return replica.tokens_in_flight + replica.external_load * 512
        return replica.outstanding + replica.external_load

    def choose(self, candidates: Sequence[R], affinity: Affinity) -> Choice:
        """Pick one of ``candidates`` (non-empty, all usable)."""
        return self._finish(self.least_loaded(candidates), "load", -1, affinity)

    def served(self, choice: Choice, affinity: Affinity) -> None:
        """Remember where the request went (an affinity policy's table); called once per chosen attempt."""

    def forget(self, slot: int) -> None:
        """The replica at ``slot`` lost its state (unhealthy, ejected): drop its affinity."""

    def remembered(self) -> int:
        """Entries of the policy's affinity table (prefix blocks or sessions; 0 without one)."""
        return 0

    def hint_key(self, choice: Choice, affinity: Affinity) -> int | None:
        """What peer gateways should learn about this placement (a session or prefix key), if anything."""
        return None

    def apply_hint(self, key: int, slot: int) -> None:
        """A peer gateway placed ``key`` (see :meth:`hint_key`) on the replica at ``slot``."""

    def least_loaded(self, candidates: Sequence[R]) -> R:
        if len(candidates) == 1:
            return candidates[0]
        load = self.load
        least = min(load(r) for r in candidates)
        tied = [r for r in candidates if load(r) == least]
        return tied[next(self._turn) % len(tied)] if len(tied) > 1 else tied[0]

    def _finish(self, replica: ReplicaLoad, reason: str, matched: int, affinity: Affinity) -> Choice:
        blocks = affinity.blocks
        cached = blocks.tokens(matched) if blocks is not None and matched >= 0 else 0
        return Choice(
            replica, reason, matched, cached, max(affinity.prompt_tokens() - cached, 0) + affinity.output_tokens
        )


class RoundRobin(ReplicaPolicy):
    """Each request to the next replica in turn, whatever the load (a baseline)."""

    name = "round_robin"

    def choose(self, candidates: Sequence[R], affinity: Affinity) -> Choice:
        ordered = sorted(candidates, key=lambda r: r.slot) if len(candidates) > 1 else candidates
        return self._finish(ordered[next(self._turn) % len(ordered)], "in_turn", -1, affinity)


class LeastOutstanding(ReplicaPolicy):
    """The least-loaded replica (requests or tokens in flight), ties in turn."""

    name = "least_outstanding"


class SessionAffinity(ReplicaPolicy):
    """A session's first turn to the least-loaded replica, later turns to the same one while usable.

    The table is a :class:`~gateway.balancing.index.PrefixIndex` keyed by session (bounded, aged out,
    a lost replica's sessions voided at once), each session owned by the one replica it went to last.
    """

    name = "session_affinity"
    needs_session = True

    def __init__(
        self, load: LoadKind = "requests", *, max_sessions: int = 100_000, ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(load)
        self.index = PrefixIndex(max_sessions, ttl, clock)

    def choose(self, candidates: Sequence[R], affinity: Affinity) -> Choice:
        if affinity.session is not None:
            _, mask = self.index.longest((affinity.session,), _slot_mask(candidates))
            if mask:
                home = next(r for r in candidates if mask >> r.slot & 1)
                return self._finish(home, "session", -1, affinity)
        return self._finish(self.least_loaded(candidates), "load", -1, affinity)

    def served(self, choice: Choice, affinity: Affinity) -> None:
        if affinity.session is not None:
            self.index.place(affinity.session, 1 << choice.replica.slot)

    def hint_key(self, choice: Choice, affinity: Affinity) -> int | None:
        return affinity.session

    def remembered(self) -> int:
        return len(self.index)

    def apply_hint(self, key: int, slot: int) -> None:
        self.index.place(key, 1 << slot)

    def forget(self, slot: int) -> None:
        self.index.forget(1 << slot)


class CacheAware(ReplicaPolicy):
    """The replica holding the longest prefix, unless it is overloaded against the least-loaded one."""

    name = "cache_aware"
    needs_blocks = True
    needs_session = True

    def __init__(
        self, load: LoadKind = "requests", *, balance_abs: float = DEFAULT_BALANCE_ABS,
        balance_rel: float = DEFAULT_BALANCE_REL, bounded: bool = True, max_entries: int = 262_144, ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(load)
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.bounded = bounded
        self.index = PrefixIndex(max_entries, ttl, clock)
        if not bounded:
            self.name = "prefix_affinity"

    def choose(self, candidates: Sequence[R], affinity: Affinity) -> Choice:
        blocks = affinity.blocks
        usable = _slot_mask(candidates)
        position, mask, reason = -1, 0, "prefix"
        if blocks is not None and blocks.hashes:
            position, mask = self.index.longest(blocks.hashes, usable)
        if position < 0 and affinity.session is not None:
            # The session key lives in the same index as a one-block "prefix" of its own (see served).
            _, mask = self.index.longest((affinity.session,), usable)
            reason = "session"
        if not mask:
            return self._finish(self.least_loaded(candidates), "load", -1, affinity)
        holders = [r for r in candidates if mask >> r.slot & 1]
        best = self.least_loaded(holders)
        if self.bounded and len(holders) < len(candidates):
            load = self.load
            least = min(load(r) for r in candidates)
            mine = load(best)
            if mine > least + self.balance_abs and mine > least * self.balance_rel:
                return self._finish(self.least_loaded(candidates), "imbalance", -1, affinity)
        return self._finish(best, reason, position, affinity)

    def served(self, choice: Choice, affinity: Affinity) -> None:
        slot_bit = 1 << choice.replica.slot
        if affinity.session is not None:
            # Where the session went last (one entry, overwritten): the fallback when no block matches.
            self.index.place(affinity.session, slot_bit)
        blocks = affinity.blocks
        if blocks is None or not blocks.hashes:
            return
        # Blocks up to the match were recorded for this replica when it first saw them: touch the
        # matched one (it stays recent) and add the rest.
        self.index.record(blocks.hashes, slot_bit, max(choice.matched, 0))

    def hint_key(self, choice: Choice, affinity: Affinity) -> int | None:
        # The last full block: the request's final, partial block is not in its next turn. A
        # conversation shorter than one block: its session, which peers keep like a block.
        blocks = affinity.blocks
        if blocks is not None and blocks.last_full() >= 0:
            return blocks.hashes[blocks.last_full()]
        return affinity.session

    def apply_hint(self, key: int, slot: int) -> None:
        self.index.record((key,), 1 << slot)

    def remembered(self) -> int:
        return len(self.index)

    def forget(self, slot: int) -> None:
        self.index.forget(1 << slot)


def _slot_mask(candidates: Sequence[ReplicaLoad]) -> int:
    """The candidates' slots as a bit mask (the prefix index's unit)."""
    mask = 0
    for replica in candidates:
        mask |= 1 << replica.slot
    return mask


def make_policy(
    name: PolicyName, *, load: LoadKind = "requests", balance_abs: float = DEFAULT_BALANCE_ABS,
    balance_rel: float = DEFAULT_BALANCE_REL, max_entries: int = 262_144, ttl: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
) -> ReplicaPolicy:
    """A policy by name (``prefix_affinity`` is ``cache_aware`` without load bounds)."""
    if name == "round_robin":
        return RoundRobin(load)
    if name == "least_outstanding":
        return LeastOutstanding(load)
    if name == "session_affinity":
        return SessionAffinity(load, max_sessions=max_entries, ttl=ttl, clock=clock)
    return CacheAware(
        load, balance_abs=balance_abs, balance_rel=balance_rel, bounded=name == "cache_aware",
        max_entries=max_entries, ttl=ttl, clock=clock,
    )
