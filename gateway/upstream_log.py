"""Where an upstream failure's details go: the log, rate-limited, never the client.

A client sees the gateway's own words ("could not connect to the upstream"); the operator needs
the replica's address and the library's account of what broke. During an outage every request
fails the same way, so each (replica, kind of failure) is logged at most once per
:data:`LOG_INTERVAL` seconds, with the number of repeats that were not logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.upstream import UpstreamFailure

log = logging.getLogger("pointsman.upstream")

#: Seconds between two log lines for the same replica and kind of failure.
LOG_INTERVAL = 5.0


class UpstreamFailureLog:
    """Logs upstream failures with their detail, at most once per interval per (replica, kind)."""

    def __init__(self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def note(self, failure: UpstreamFailure, *, backend: str, replica: str, model: str, phase: str = "request") -> None:
        """Record one failed attempt (``phase``: ``request`` or ``stream``)."""
        key = (replica, failure.kind)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._last) > 4096:  # bounded: replicas are few, but never let this grow unchecked
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        repeats = self._suppressed.pop(key, 0)
        log.warning(
            "upstream %s failure on backend %s replica %s (model %s): %s%s%s",
            phase, backend, replica, model, failure.message,
            f" [{failure.detail}]" if failure.detail else "",
            f" (+{repeats} more like it since the last report)" if repeats else "",
        )


#: The process's failure log (shared by the forwarder and the stream pump).
failure_log = UpstreamFailureLog()
