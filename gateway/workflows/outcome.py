"""How a workflow run ended, and what is kept of it: the decision record's tree, the sub-call rows,
the totals and the metrics.

The same description serves the decision record (``DecisionRecord.workflow``) and the response's
``pointsman`` extension field: which step answered, whether a cascade escalated, which cap was
reached, every sub-call with its tokens, cost, latency and confidence, and the totals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.forward import Completed
from gateway.metrics import Metrics
from gateway.trace import RequestTrace
from gateway.workflows.runtime import Answer, Run, Streamed, SubCall
from store.records import SubCallRecord


@dataclass(slots=True)
class Final:
    """The end of a run: the answer (buffered), the final stage's stream (opened), or an upstream
    answer passed on as-is (``passthrough``: a 4xx every path ended in). ``escalated`` is set for
    cascades; ``degraded`` says which failure the run fell back from; ``extra`` goes into the
    description (ratings, judge scores)."""

    answer: Answer | None = None
    stream: Streamed | None = None
    passthrough: Completed | None = None
    escalated: bool | None = None
    degraded: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def answering(self) -> Answer | Streamed | None:
        return self.answer if self.answer is not None else self.stream


@dataclass(frozen=True, slots=True)
class Totals:
    """Usage and cost summed over a run's sub-calls (``complete``: every sent call reported usage)."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    complete: bool

    @classmethod
    def of(cls, calls: list[SubCall]) -> Totals:
        sent = [c for c in calls if c.started is not None]
        return cls(
            prompt_tokens=sum(c.prompt_tokens or 0 for c in sent),
            completion_tokens=sum(c.completion_tokens or 0 for c in sent),
            cost_usd=sum(c.cost_usd or 0.0 for c in sent),
            complete=all(c.prompt_tokens is not None for c in sent if c.outcome in ("ok", "streaming")),
        )

    def usage(self) -> dict[str, int]:
        """The OpenAI ``usage`` object of the whole workflow."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def describe(run: Run, final: Final | None) -> dict[str, Any]:
    """The run as the response's ``pointsman`` extension shows it (the record adds kind and name)."""
    workflow = run.workflow
    totals = Totals.of(run.calls)
    out: dict[str, Any] = {"workflow": workflow.model_name}
    answering = final.answering if final is not None else None
    if answering is not None:
        out["answered_by"] = {"position": answering.position, "step": answering.label,
                              "model": answering.call.answered or answering.call.model, "index": answering.call.index}
    if final is not None and final.escalated is not None:
        out["escalated"] = final.escalated
    if run.capped is not None:
        out["capped"] = run.capped.cap
        out["cap_detail"] = run.capped.detail
    if final is not None and final.degraded:
        out["degraded"] = final.degraded
    out["steps"] = [call.summary() for call in run.calls]
    out["cost_usd"] = round(totals.cost_usd, 9)
    out["usage_complete"] = totals.complete
    if final is not None:
        out.update(final.extra)
    return out


def finish(run: Run, final: Final | None, trace: RequestTrace, metrics: Metrics, *, outcome: str) -> None:
    """Write the run into ``trace`` (tree, sub-call rows, answering model, totals) and count it.

    ``outcome`` is the run's: answered, capped, degraded, failed or cancelled. Called once per run:
    at its end, or when its final stream ends.
    """
    workflow = run.workflow
    totals = Totals.of(run.calls)
    tree = {"kind": workflow.kind, "name": workflow.name, **describe(run, final)}
    if run.ask.stream:
        # What buffering cost the first token: the time until the final answer could start.
        tree["buffered_ms"] = round(_first_byte_ms(run, final), 3)
    trace.workflow = tree
    answering = final.answering if final is not None else None
    if answering is not None:
        trace.model = answering.call.answered or answering.call.model
        trace.backend = answering.call.backend
    else:
        trace.model, trace.backend = workflow.model_name, None
    trace.prompt_tokens, trace.completion_tokens = totals.prompt_tokens, totals.completion_tokens
    trace.cost_usd = totals.cost_usd
    trace.attempts = sum(call.attempts for call in run.calls)
    now = time.time()
    trace.subcalls = [
        SubCallRecord(
            request_id=trace.request_id, index=c.index, workflow=workflow.name, step=c.step,
            model=c.answered or c.model, backend=c.backend, status=c.status, prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens, cost_usd=c.cost_usd, latency_ms=c.latency_ms,
            confidence=c.confidence, outcome="cancelled" if c.outcome in ("pending", "streaming") else c.outcome,
            error=c.error, created_at=now, tenant=trace.tenant,
        )
        for c in run.calls
    ]
    _count(run, trace, metrics, outcome)


def _first_byte_ms(run: Run, final: Final | None) -> float:
    stream = final.stream if final is not None else None
    if stream is not None and stream.call.started is not None:
        return (stream.call.started - run.started) * 1000.0
    return (time.perf_counter() - run.started) * 1000.0


def _count(run: Run, trace: RequestTrace, metrics: Metrics, outcome: str) -> None:
    name = run.workflow.name
    route = trace.route or "direct"
    metrics.workflow_runs.labels(name, outcome).inc()
    for call in run.calls:
        model = call.answered or call.model
        metrics.workflow_steps.labels(name, call.step, model, call.outcome).inc()
        backend = call.backend or ""
        if call.prompt_tokens:
            metrics.tokens.labels(route, model, backend, "prompt").inc(call.prompt_tokens)
        if call.completion_tokens:
            metrics.tokens.labels(route, model, backend, "completion").inc(call.completion_tokens)
        if call.cost_usd:
            metrics.cost.labels(route, model, backend).inc(call.cost_usd)
    for stage in run.escalations:
        metrics.workflow_escalations.labels(name, stage).inc()
    if run.capped is not None:
        metrics.workflow_caps.labels(name, run.capped.cap).inc()


def run_outcome(run: Run, final: Final) -> str:
    """answered, capped or degraded (how a run that produced an answer ended)."""
    if run.capped is not None:
        return "capped"
    return "degraded" if final.degraded else "answered"
