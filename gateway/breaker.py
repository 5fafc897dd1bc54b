"""Circuit breaker for one upstream replica.

Closed: requests flow; consecutive failures are counted. At ``failure_threshold`` it opens: the
replica gets no traffic for ``cooldown`` seconds. Then it half-opens: exactly one probe request is
let through; success closes it, failure re-opens it for another cooldown.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class BreakerState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Consecutive-failure breaker with cooldown and a single half-open probe."""

    def __init__(
        self, failure_threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.cooldown:
            return BreakerState.HALF_OPEN
        return self._state

    def available(self) -> bool:
        """Whether a request may be sent now (does not reserve the half-open probe)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        return state is BreakerState.HALF_OPEN and not self._probe_in_flight

    def acquire(self) -> bool:
        """Reserve the right to send one request; in half-open state only one probe at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probe_in_flight:
            self._state = BreakerState.HALF_OPEN
            self._probe_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probe_in_flight = False

    def record_failure(self) -> None:
        self._probe_in_flight = False
        if self._state is BreakerState.HALF_OPEN:
            self._trip()
            return
        self._failures += 1
        if self._failures >= self.failure_threshold:
            self._trip()

    def release(self) -> None:
        """A request that neither succeeded nor failed (e.g. the client left) frees the probe slot."""
        self._probe_in_flight = False

    def _trip(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._failures = 0
