"""One request's running state, shared by the handler, the forwarder, the stream pump, the cache and
workflows; the decision record is built from it once, when the request is finished.

Keeping the two apart means the stored row is never a half-filled object passed around and changed
as the request runs (nor after it was queued for the store), and the model calls the gateway makes
on its own account (a workflow's sub-calls, comparisons, shadow arms) forward with a trace of their
own instead of a made-up record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from store.records import ConversationRecord, DecisionRecord, SubCallRecord


@dataclass(slots=True)
class RequestTrace:
    """What is known about one request while it is being served.

    The fields named as :class:`~store.records.DecisionRecord`'s mean what they mean there; they are
    filled in as the request goes (who asked, what was decided, which upstream answered and how).
    ``upstream_seconds`` accumulates time spent waiting on upstreams (and retry back-off) and
    ``client_seconds`` time spent receiving the client's body, so the gateway's own overhead is
    ``elapsed - upstream_seconds - client_seconds``.
    """

    request_id: str
    endpoint: str
    created_at: float = field(default_factory=time.time)  # unix seconds when the request arrived
    # Who asked and what was asked.
    tenant: str | None = None
    session_id: str | None = None  # the client's x-pointsman-session-id (replica session affinity)
    requested_model: str | None = None
    route: str | None = None
    stream: bool = False
    # What was decided.
    signals: dict[str, Any] = field(default_factory=dict)
    decision: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    propensity: float | None = None
    router_version: str | None = None
    experiment: str | None = None
    experiment_arm: str | None = None
    arm_propensity: float | None = None
    shadow_of: str | None = None  # a shadow arm's decision: the served request it shadows
    compared: bool = False
    conversation: ConversationRecord | None = None
    # How it went.
    model: str | None = None
    backend: str | None = None
    replica: str | None = None
    status: int = 0
    outcome: str = "ok"
    error_type: str | None = None
    error_message: str | None = None
    attempts: int = 0
    ttft_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    workflow: dict[str, Any] | None = None
    subcalls: Sequence[SubCallRecord] = ()
    # Timing and what is settled or ended when the request is finished.
    started: float = field(default_factory=time.perf_counter)
    upstream_seconds: float = 0.0
    client_seconds: float = 0.0
    headers_sent_at: float | None = None
    quota: Any = None  # the rate-limit / budget reservation (gateway.quota.Hold) to settle when finished
    span: Any = None  # the request's OpenTelemetry span (gateway.tracing), ended when finished; None untraced
    trace_id: str | None = None  # the span's trace, as the record stores it

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    def overhead_ms(self) -> float:
        end = self.headers_sent_at if self.headers_sent_at is not None else time.perf_counter()
        return max((end - self.started - self.upstream_seconds - self.client_seconds) * 1000.0, 0.0)

    def served_propensity(self) -> float | None:
        """The decision's propensity when the model that answered is the one it was about (the plan's
        first candidate); None when a fallback answered instead: the policy's probability of the planned
        model is not that of the fallback, and an inverse-propensity estimate would weigh the fallback's
        outcome by it."""
        planned = self.decision.get("candidates")
        if planned and self.model is not None and self.model != planned[0]:
            return None
        return self.propensity

    def record(self) -> DecisionRecord:
        """The decision record of the request as it stands, its latency and overhead measured now."""
        return DecisionRecord(
            request_id=self.request_id, created_at=self.created_at, endpoint=self.endpoint, route=self.route,
            requested_model=self.requested_model, tenant=self.tenant, stream=self.stream,
            signals=self.signals, decision=self.decision, reason=self.reason,
            model=self.model, backend=self.backend, replica=self.replica, status=self.status,
            outcome=self.outcome, error_type=self.error_type, error_message=self.error_message,
            attempts=self.attempts, latency_ms=self.elapsed_ms(), ttft_ms=self.ttft_ms,
            # A shadow has no client waiting on it: no overhead of the gateway's to report.
            overhead_ms=None if self.shadow_of is not None else self.overhead_ms(), prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, cost_usd=self.cost_usd,
            experiment_arm=self.experiment_arm, router_version=self.router_version, propensity=self.served_propensity(),
            workflow=self.workflow, experiment=self.experiment, arm_propensity=self.arm_propensity,
            compared=self.compared, trace_id=self.trace_id, conversation=self.conversation,
            subcalls=self.subcalls, shadow_of=self.shadow_of,
        )
