"""One running experiment as the request path sees it: which arm a request's key gets, and with
which probability.

Fixed weights are a hash and a bisect (:class:`~policies.experiments.assign.ArmTable`), nothing
else: no store, no lock, no clock beyond the start/end check. Adaptive allocation looks a key up in
a bounded in-memory cache and, for a key this replica has not seen, asks the store once
(``put_assignment``: the first replica to assign a key wins, every other one gets that arm).

A stopped arm (a guardrail tripped, on any replica) keeps its keys, but they are served by the
control from then on. With fixed weights the logged ``arm_propensity`` stays exact: the probability
that a key is served by the control is then the control's share plus every stopped arm's. With
adaptive allocation a rerouted key's propensity is not known (the other arms' probabilities at its
assignment were not kept), so it is logged as None.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.base import Policy
from policies.experiments.arms import ArmPolicy
from policies.experiments.assign import ArmTable, AssignmentKey, assignment_key
from policies.experiments.config import ExperimentConfig

log = logging.getLogger("pointsman.experiments")

#: Seconds a store round trip of adaptive assignment may take before the request goes on without it.
STORE_TIMEOUT = 0.5

#: Where a key can come from: the configured kind, or a ``missing_key`` fallback.
KEY_SOURCES = ("api_key", "user", "session", "conversation", "request")

PutAssignment = Callable[[str, str, str, float | None, float], Awaitable[tuple[str, float | None]]]
GetAssignment = Callable[[str, str], Awaitable[tuple[str, float | None] | None]]


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where one request of an experiment goes.

    ``arm`` serves it (the control when ``assigned``, the key's own arm, is stopped); ``propensity`` is
    the probability that a key is served by ``arm`` under the assignment in force (None when unknown);
    ``how`` is ``hash`` (fixed weights), ``adaptive`` (a stored Thompson assignment), ``new`` (one this
    request made), ``unstored`` (the store could not be asked: assigned for this request only) or
    ``would`` (``/v1/route``: what a new key would get; nothing stored).
    """

    experiment: str
    arm: str
    assigned: str
    propensity: float | None
    key: str
    how: str
    policy: Policy
    router_version: str | None = None
    # The randomisation unit: a prefix of the key's hash (never the key), so the report can count keys,
    # not requests, in its sample-ratio check. None when each request is its own unit.
    unit: str | None = None

    def for_unit(self, unit: str | None) -> Assignment:
        """This assignment for one key (the fixed-weight ones are shared across keys)."""
        if unit == self.unit:
            return self
        return Assignment(self.experiment, self.arm, self.assigned, self.propensity, self.key, self.how,
                          self.policy, self.router_version, unit)

    @property
    def header(self) -> bytes:
        """The ``x-pointsman-arm`` header value: ``<experiment>/<arm>``."""
        return f"{self.experiment}/{self.arm}".encode()

    def describe(self) -> dict[str, Any]:
        """What the decision record and ``/v1/route`` say about the assignment."""
        described: dict[str, Any] = {
            "name": self.experiment, "arm": self.arm, "propensity": self.propensity, "key": self.key, "how": self.how,
        }
        if self.assigned != self.arm:
            described["assigned"] = self.assigned
            described["stopped"] = True
        if self.router_version is not None:
            described["router_version"] = self.router_version
        if self.unit is not None:
            described["unit"] = self.unit
        return described


class LiveExperiment:
    """A configured experiment, its arms' policies, which arms are stopped and (adaptive) its allocation."""

    def __init__(self, config: ExperimentConfig, arms: Mapping[str, ArmPolicy]) -> None:
        self.config = config
        self.name = config.name
        self.route = config.route
        self.arms = dict(arms)
        self.control = config.control.name
        self.shares = config.shares()
        self.served = tuple(self.shares)  # control first
        self.shadows = tuple(arm.name for arm in config.shadows)
        self.table = ArmTable(self.shares)
        self.adaptive = config.allocation.kind == "thompson"
        # Adaptive: the probabilities new keys get (uniform until the first update) and the cache of
        # assignments this replica knows (key hash -> (arm, propensity)), least recently used first out.
        self.allocation = ArmTable({arm: 1.0 for arm in self.served})
        self._cache: OrderedDict[str, tuple[str, float | None]] = OrderedDict()
        self._max_keys = config.allocation.max_keys
        self.stopped: frozenset[str] = frozenset()
        # (assigned arm, key source) -> the fixed-weight Assignment: built once per stop change, so the
        # request path is a hash, a bisect and a dict lookup.
        self._fixed: dict[tuple[str, str], Assignment] = {}
        self._reroute()
        # The window as plain floats: the request path checks it on every request.
        self._paused = config.paused
        self._start = -math.inf if config.start_ts is None else config.start_ts
        self._end = math.inf if config.end_ts is None else config.end_ts
        self._warned_at = 0.0

    # --- state other tasks update --------------------------------------------------------------------

    def set_stopped(self, arms: frozenset[str]) -> bool:
        """Mark ``arms`` stopped (the control and unknown names are ignored); True when that changed."""
        arms = frozenset(arm for arm in arms if arm in self.shares and arm != self.control)
        if arms == self.stopped:
            return False
        self.stopped = arms
        self._reroute()
        return True

    def set_allocation(self, propensities: Mapping[str, float]) -> None:
        """The probabilities new keys get from now on (adaptive allocation)."""
        self.allocation = ArmTable(propensities)

    def _reroute(self) -> None:
        """Per assigned arm and key source: the fixed-weight assignment (the serving arm, its propensity)."""
        moved = sum(self.shares[arm] for arm in self.stopped)
        fixed: dict[tuple[str, str], Assignment] = {}
        for assigned in self.served:
            if assigned in self.stopped or assigned == self.control:
                arm, propensity = self.control, self.shares[self.control] + moved
            else:
                arm, propensity = assigned, self.shares[assigned]
            for source in KEY_SOURCES:
                fixed[(assigned, source)] = self._assignment(arm, assigned, propensity, source, "hash")
        self._fixed = fixed

    # --- the request path ----------------------------------------------------------------------------

    def running(self, now: float) -> bool:
        """Whether the experiment assigns requests now (not paused, inside [start, end))."""
        return not self._paused and self._start <= now < self._end

    def key(self, body: Mapping[str, Any], headers: Mapping[str, str], request_id: str) -> AssignmentKey | None:
        """The request's hashed assignment key (None: the request stays out of the experiment)."""
        config = self.config
        return assignment_key(self.name, config.key, config.missing_key, body, headers, request_id)

    def known(self, key: AssignmentKey) -> Assignment | None:
        """The assignment of ``key`` without any I/O: always, with fixed weights; from the cache, adaptive."""
        if not self.adaptive:
            return self._fixed[(self.table.pick(key.fraction), key.source)]
        cached = self._cache.get(key.hash)
        if cached is None:
            return None
        self._cache.move_to_end(key.hash)
        return self._adaptive(cached, key.source, "adaptive")

    async def assign_new(self, key: AssignmentKey, put: PutAssignment, *, now: float | None = None) -> Assignment:
        """Assign a key this replica has not seen (adaptive): by the current allocation, stored so every
        replica keeps it (``put`` returns the arm the store holds, maybe another replica's)."""
        table = self.allocation
        arm = table.pick(key.fraction)
        propensity = table.shares[arm]
        try:
            stored = await asyncio.wait_for(
                put(self.name, key.hash, arm, propensity, time.time() if now is None else now), STORE_TIMEOUT
            )
        except Exception as exc:  # the request goes on; the key is assigned again next time
            self._warn(exc)
            return self._adaptive((arm, propensity), key.source, "unstored")
        self._remember(key.hash, stored)
        return self._adaptive(stored, key.source, "new" if stored[0] == arm else "adaptive")

    async def peek(self, key: AssignmentKey, get: GetAssignment) -> Assignment:
        """``/v1/route``: the key's assignment, looking in the store but storing nothing."""
        known = self.known(key)
        if known is not None:
            return known
        try:
            stored = await asyncio.wait_for(get(self.name, key.hash), STORE_TIMEOUT)
        except Exception as exc:
            self._warn(exc)
            stored = None
        if stored is not None:
            self._remember(key.hash, stored)
            return self._adaptive(stored, key.source, "adaptive")
        arm = self.allocation.pick(key.fraction)
        return self._adaptive((arm, self.allocation.shares[arm]), key.source, "would")

    def _remember(self, key_hash: str, stored: tuple[str, float | None]) -> None:
        self._cache[key_hash] = stored
        self._cache.move_to_end(key_hash)
        while len(self._cache) > self._max_keys:
            self._cache.popitem(last=False)

    def _adaptive(self, stored: tuple[str, float | None], source: str, how: str) -> Assignment:
        assigned, propensity = stored
        if assigned in self.stopped or assigned not in self.shares:
            # Stopped (or removed from the config since): the control serves; its probability for this
            # key is not known.
            return self._assignment(self.control, assigned, None, source, how)
        return self._assignment(assigned, assigned, propensity, source, how)

    def _assignment(self, arm: str, assigned: str, propensity: float | None, source: str, how: str) -> Assignment:
        policy = self.arms[arm]
        return Assignment(self.name, arm, assigned, propensity, source, how, policy.policy, policy.router_version)

    def _warn(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at > 10.0:  # at most one line per 10 s per experiment
            self._warned_at = now
            log.warning("experiment %s: the assignment store could not be asked (%s); assigning without it",
                        self.name, type(exc).__name__)
