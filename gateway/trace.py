"""Per-request bookkeeping shared by the handler, the forwarder and the stream pump."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from store.records import DecisionRecord


@dataclass(slots=True)
class RequestTrace:
    """Timing and the decision record of one request while it is being served.

    ``upstream_seconds`` accumulates time spent waiting on upstreams (and retry back-off), so the
    gateway's own overhead is ``elapsed - upstream_seconds``.
    """

    record: DecisionRecord
    started: float = field(default_factory=time.perf_counter)
    upstream_seconds: float = 0.0
    headers_sent_at: float | None = None
    quota: Any = None  # the rate-limit / budget reservation (gateway.quota.Hold) to settle when finished
    span: Any = None  # the request's OpenTelemetry span (gateway.tracing), ended when finished; None untraced
    session_id: str | None = None  # the client's x-pointsman-session-id (replica session affinity)

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    def overhead_ms(self) -> float:
        end = self.headers_sent_at if self.headers_sent_at is not None else time.perf_counter()
        return max((end - self.started - self.upstream_seconds) * 1000.0, 0.0)
