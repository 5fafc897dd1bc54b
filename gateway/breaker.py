"""Per-replica circuit breaker, done as outlier detection (after Envoy's).

A replica is *ejected* (the breaker opens: it gets no traffic) for one of two reasons, which answer
different questions:

- **transport** — is the replica reachable? Connect errors, timeouts, resets and malformed bodies
  are counted consecutively; ``failure_threshold`` in a row eject it (an outage is an outage, even
  for a backend's only replica). Any HTTP answer resets the count.
- **error_rate** — does the replica fail nearly everything? An HTTP 5xx answer may be the request's
  fault (content that crashes the model), so 5xx answers are never counted in a row: failed
  outcomes (5xx answers and transport failures) are judged by their share of all outcomes in the
  last ``window`` seconds, once at least ``min_requests`` outcomes were seen (retries are outcomes
  too); at ``failure_rate`` or above the replica is ejected — but only if another
  replica of its backend is still serving (``may_eject_for_errors``): the last one is never ejected
  for 5xx answers alone (Envoy's max-ejection / panic idea), so a few bad requests cannot take a
  backend away from every other client.

An ejected replica comes back in one of two ways:

- a passing active health check (:meth:`CircuitBreaker.return_to_service`) closes the breaker at once;
- otherwise after ``cooldown`` seconds it half-opens: one probe request is let through; a good answer
  (for a stream: its first chunk) closes the breaker, a transport failure re-opens it for another
  cooldown, and a 5xx answer re-opens it only if another replica is serving (it closes it otherwise,
  as above).

While open, the outcomes of requests sent before the ejection are ignored: a late success of one of
them says nothing about the replica now. The window keeps ``_BUCKETS`` counters (fixed memory,
O(1) per outcome), so it spans the last ``window`` seconds to within one tenth of it.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("pointsman.breaker")

_BUCKETS = 10


class BreakerState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Outcome(enum.Enum):
    """What one attempt on a replica said about the replica."""

    ANSWER = "answer"  # an HTTP answer below 500 (2xx, 4xx, 429): the replica works
    ERROR_ANSWER = "error_answer"  # an HTTP 5xx answer: this request failed; the replica is up
    TRANSPORT = "transport"  # no usable answer: connect error, timeout, reset, malformed body


class _Window:
    """Outcomes and failures over roughly the last ``seconds``, in ``_BUCKETS`` time slices."""

    def __init__(self, seconds: float) -> None:
        self._width = seconds / _BUCKETS
        self._slice = [-1] * _BUCKETS  # which time slice each bucket currently counts
        self._total = [0] * _BUCKETS
        self._failed = [0] * _BUCKETS

    def add(self, now: float, failed: bool) -> None:
        current = int(now // self._width)
        i = current % _BUCKETS
        if self._slice[i] != current:
            self._slice[i], self._total[i], self._failed[i] = current, 0, 0
        self._total[i] += 1
        self._failed[i] += failed

    def counts(self, now: float) -> tuple[int, int]:
        """(outcomes, failures) in the window ending now."""
        oldest = int(now // self._width) - _BUCKETS + 1
        live = [i for i in range(_BUCKETS) if self._slice[i] >= oldest]
        return sum(self._total[i] for i in live), sum(self._failed[i] for i in live)

    def clear(self) -> None:
        self._slice = [-1] * _BUCKETS


class CircuitBreaker:
    """Outlier detection for one replica: consecutive transport failures or a windowed 5xx rate eject it."""

    def __init__(
        self,
        failure_threshold: int = 5,
        cooldown: float = 15.0,
        *,
        window: float = 30.0,
        min_requests: int = 20,
        failure_rate: float = 0.9,
        may_eject_for_errors: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.min_requests = min_requests
        self.failure_rate = failure_rate
        self.may_eject_for_errors = may_eject_for_errors
        # Told when the breaker ejects its replica (the pool drops the replica's affinity then).
        self.on_trip: Callable[[], None] | None = None
        self.name = name
        self.ejections: Counter[str] = Counter()  # by reason: "transport", "error_rate"
        self._clock = clock
        self._window = _Window(window)
        self._state = BreakerState.CLOSED
        self._consecutive = 0
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

    def window_counts(self) -> tuple[int, int]:
        """(outcomes, failures) in the current window."""
        return self._window.counts(self._clock())

    def record(self, outcome: Outcome) -> None:
        """Account for the outcome of one request sent through :meth:`acquire`."""
        state = self.state
        if state is BreakerState.OPEN:
            return  # a request sent before the ejection: no news about the replica now
        if state is BreakerState.HALF_OPEN:
            self._probe_in_flight = False
            if outcome is Outcome.TRANSPORT:
                self._trip("transport")
            elif outcome is Outcome.ERROR_ANSWER and self.may_eject_for_errors():
                self._trip("error_rate")
            else:
                self._close()
            return
        failed = outcome is not Outcome.ANSWER
        now = self._clock()
        self._window.add(now, failed)
        if outcome is Outcome.TRANSPORT:
            self._consecutive += 1
            if self._consecutive >= self.failure_threshold:
                self._trip("transport")
                return
        else:
            self._consecutive = 0
        if failed:
            total, failures = self._window.counts(now)
            if (
                total >= self.min_requests
                and failures >= self.failure_rate * total
                and self.may_eject_for_errors()
            ):
                self._trip("error_rate")

    def stream_began(self) -> None:
        """A streamed answer's first chunk is in: if the breaker is half-open, that is its probe's answer,
        and it closes now rather than when the stream ends (minutes later for a long generation, every
        other request refused meanwhile). How the stream ends is recorded as any outcome."""
        if self._state is BreakerState.HALF_OPEN and self._probe_in_flight:
            self._close()

    def record_success(self) -> None:
        """An HTTP answer below 500."""
        self.record(Outcome.ANSWER)

    def release(self) -> None:
        """A request that neither succeeded nor failed (e.g. the client left) frees the probe slot."""
        self._probe_in_flight = False

    def return_to_service(self) -> None:
        """A passing active health check: an ejected replica gets traffic again at once."""
        if self._state is BreakerState.CLOSED:
            return
        self._close()
        log.info("replica %s passed a health check: back in service", self.name)

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._probe_in_flight = False

    def _trip(self, reason: str) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._consecutive = 0
        self._probe_in_flight = False
        self._window.clear()
        self.ejections[reason] += 1
        log.warning("replica %s ejected (%s) for %gs", self.name, reason, self.cooldown)
        if self.on_trip is not None:
            self.on_trip()
