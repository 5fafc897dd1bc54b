"""One workflow run: its sub-calls, made through the gateway's forwarder, within its budget.

Every sub-call goes through :meth:`gateway.forward.Forwarder.forward` exactly like a client's
request (replica choice, retries, breaker, the model's fallbacks), after reserving its share of the
run's budget (:mod:`.caps`), a place in the run's fan-out and a slot among the process's
``workflow_limits.max_concurrent_subcalls``. Each is recorded as a :class:`SubCall` whatever happens
to it. The run keeps its best answer so far, which a cap or a failure falls back to.

Cancellation (the client went away, the run's wall-time cap) reaches every in-flight sub-call: they
run in the request's task or in ``asyncio.TaskGroup`` children of it (:meth:`Run.settle`), and the
forwarder drops an upstream connection whose call is cancelled, so the upstream stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from classifiers.offload import with_model_first
from gateway.completion_bounds import with_max_tokens
from gateway.errors import PointsmanError, RateLimitError, ServiceUnavailableError, UpstreamError
from gateway.forward import Completed, OpenedStream
from gateway.pool import ModelTarget
from gateway.protocol import CHAT
from gateway.trace import RequestTrace
from gateway.usage import SSEUsageScanner, cost_usd
from gateway.workflows.bodies import ClientAsk, estimate_prompt_tokens
from gateway.workflows.caps import Budget, CapReached, Reservation
from gateway.workflows.confidence import first_choice, message_text
from policies.workflows import AnyWorkflow

if TYPE_CHECKING:
    from gateway.workflows.runner import WorkflowRunner

T = TypeVar("T")


@dataclass(slots=True)
class SubCall:
    """One model call of a workflow run, as it went (becomes a ``subcalls`` row)."""

    index: int
    step: str
    model: str  # the model asked; ``answered`` is the one that answered (a fallback, maybe)
    answered: str | None = None
    backend: str | None = None
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    confidence: float | None = None
    outcome: str = "pending"  # ok | error | timeout | cancelled | capped | streaming
    error: str | None = None
    attempts: int = 0
    started: float | None = None  # perf_counter once it holds its slots

    def summary(self) -> dict[str, Any]:
        """The compact form shown in the decision record's tree and the response's extension."""
        out: dict[str, Any] = {"index": self.index, "step": self.step, "model": self.answered or self.model,
                               "outcome": self.outcome}
        for key in ("status", "prompt_tokens", "completion_tokens", "cost_usd", "latency_ms", "confidence", "error"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 6) if isinstance(value, float) else value
        return out


@dataclass(slots=True)
class Answer:
    """A sub-call's complete answer: the chat completion, and where it stands in the workflow
    (``position`` and ``label``: the stage, candidate or step it answers as)."""

    call: SubCall
    completion: dict[str, Any]
    target: ModelTarget
    position: int
    label: str

    @property
    def text(self) -> str:
        return message_text(self.completion)


@dataclass(slots=True)
class Streamed:
    """The final stage's upstream stream, opened (its first chunk arrived), not yet relayed."""

    call: SubCall
    opened: OpenedStream
    reservation: Reservation
    position: int
    label: str


class SubCallFailed(Exception):
    """A sub-call gave no answer: an upstream failure, a timeout, or a non-200 upstream answer
    (``completed``: passed on as-is when nothing better exists, like any upstream 4xx)."""

    def __init__(self, call: SubCall, message: str, completed: Completed | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.message = message
        self.completed = completed


def no_answer_error(message: str, failed: Iterable[SubCall]) -> PointsmanError:
    """The error of a run that has no answer because the sub-calls ``failed``: 502, unless every one
    of them ended where a single call answers 503 (no healthy replica) or 429 (replicas at their
    concurrency limit, an upstream's rate limit). Then the client gets that status, as for a single
    call: it says "come back later", not "an upstream failed"."""
    statuses = {call.status for call in failed}
    if statuses and statuses <= {503, 429}:
        if 503 in statuses:
            return ServiceUnavailableError(message)
        return RateLimitError(message, headers={"Retry-After": "1"})
    return UpstreamError(message)


class Run:
    """One run of ``workflow`` for one request (``body``: the request as it would be forwarded)."""

    def __init__(
        self, runner: WorkflowRunner, workflow: AnyWorkflow, body: dict[str, Any], trace: RequestTrace, ask: ClientAsk
    ) -> None:
        self.runner = runner
        self.workflow = workflow
        self.body = body
        self.trace = trace
        self.ask = ask
        self.budget = Budget(workflow.caps)
        self.fanout = asyncio.Semaphore(workflow.caps.max_fanout)
        self.calls: list[SubCall] = []
        self.best: Answer | None = None
        self.capped: CapReached | None = None
        self.escalations: list[str] = []  # stages a cascade escalated to
        self.started = time.perf_counter()
        self._busy = 0
        self._busy_since = 0.0

    # --- bookkeeping ------------------------------------------------------------------------------

    def note_cap(self, cap: CapReached) -> None:
        """Remember the first cap the run reached (it ends with its best answer so far)."""
        if self.capped is None:
            self.capped = cap

    def offer(self, answer: Answer) -> None:
        """A completed answer: it becomes the best so far (the kinds decide what "best" means by
        when they offer)."""
        self.best = answer

    # --- sub-calls ----------------------------------------------------------------------------------

    async def call(
        self,
        step: str,
        model: str,
        request: dict[str, Any],
        *,
        position: int,
        label: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-candidate deadline, recorded as the call's outcome
    ) -> Answer:
        """One buffered sub-call of ``model``; raises :class:`CapReached` (not made) or
        :class:`SubCallFailed` (no answer). ``timeout`` bounds it (then it is cancelled upstream)."""
        call, reservation, request = self._begin(step, model, request)
        result: Completed | OpenedStream | None = None
        try:
            async with self._slots(call):
                deadline = asyncio.timeout(timeout)  # None: no deadline of its own
                try:
                    async with deadline:
                        result = await self._forward(call, request, stream=False)
                except TimeoutError as exc:
                    if not deadline.expired():
                        raise
                    call.outcome, call.error = "timeout", f"no answer within {timeout:g}s"
                    raise SubCallFailed(call, f"{step} ({model}): no answer within {timeout:g}s") from exc
            assert isinstance(result, Completed)  # stream=False
            return self._answer(call, result, position, label or step)
        except PointsmanError as error:
            call.outcome, call.status, call.error = "error", error.status, error.message
            raise SubCallFailed(call, f"{step} ({model}): {error.message}") from error
        except asyncio.CancelledError:
            call.outcome = "cancelled"
            raise
        finally:
            self._settle(call, reservation)

    async def open_stream(
        self, step: str, model: str, request: dict[str, Any], *, position: int, label: str | None = None
    ) -> Streamed:
        """The final stage, streamed: opened here (retries and fallbacks happen before its first
        chunk), relayed and settled by the caller (:meth:`finish_stream`)."""
        call, reservation, request = self._begin(step, model, request)
        try:
            async with self._slots(call):
                result = await self._forward(call, request, stream=True)
        except PointsmanError as error:
            call.outcome, call.status, call.error = "error", error.status, error.message
            self._settle(call, reservation)
            raise SubCallFailed(call, f"{step} ({model}): {error.message}") from error
        except BaseException as exc:
            call.outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
            self._settle(call, reservation)
            raise
        if isinstance(result, Completed):  # a non-200 answer the forwarder passes on (an upstream 4xx)
            call.status = result.status
            self._settle(call, reservation)
            raise self._refused(call, result)
        call.status, call.outcome = 200, "streaming"
        return Streamed(call, result, reservation, position, label or step)

    def finish_stream(self, streamed: Streamed, scanner: SSEUsageScanner, outcome: str) -> None:
        """The relayed stream ended (``outcome`` as the decision record says): settle its sub-call."""
        call = streamed.call
        call.outcome = {"ok": "ok", "client_disconnected": "cancelled"}.get(outcome, "error")
        call.prompt_tokens, call.completion_tokens = scanner.prompt_tokens, scanner.completion_tokens
        call.cost_usd = cost_usd(streamed.opened.target.model, call.prompt_tokens, call.completion_tokens)
        if call.started is not None:
            call.latency_ms = (time.perf_counter() - call.started) * 1000.0
        self._settle(call, streamed.reservation)

    async def settle(self, calls: Sequence[Awaitable[T]]) -> list[T | CapReached | SubCallFailed]:
        """Run ``calls`` concurrently (each sub-call still waits for its fan-out place); each one's
        result, or the cap or failure that stopped it. Cancellation cancels them all."""
        results: list[Any] = [None] * len(calls)

        async def one(i: int, awaitable: Awaitable[T]) -> None:
            try:
                results[i] = await awaitable
            except (CapReached, SubCallFailed) as exc:  # a cap was noted where it was reached
                results[i] = exc

        async with asyncio.TaskGroup() as group:
            for i, awaitable in enumerate(calls):
                group.create_task(one(i, awaitable))
        return results

    # --- internals -----------------------------------------------------------------------------------

    def _begin(self, step: str, model: str, request: dict[str, Any]) -> tuple[SubCall, Reservation, dict[str, Any]]:
        """Record the sub-call, reserve its budget and bound its ``max_tokens`` accordingly."""
        call = SubCall(index=len(self.calls), step=step, model=model)
        self.calls.append(call)
        target = self.runner.pool.get(model)
        if target is None:  # validated at start-up: every workflow model is configured
            call.outcome = "error"
            raise SubCallFailed(call, f"{step}: model {model!r} is not configured")
        request = {**request, "model": model}
        requested = request.get("max_completion_tokens", request.get("max_tokens"))
        requested = requested if isinstance(requested, int) and not isinstance(requested, bool) else None
        choices = request.get("n")  # an agreement stage's samples in one call: each writes up to the bound
        choices = choices if isinstance(choices, int) and not isinstance(choices, bool) and choices > 1 else 1
        try:
            reservation, bound = self.budget.reserve(
                target.model, estimate_prompt_tokens(request), requested, choices=choices
            )
        except CapReached as cap:
            call.outcome, call.error = "capped", str(cap)
            self.note_cap(cap)
            raise
        return call, reservation, with_max_tokens(request, bound)

    @contextlib.asynccontextmanager
    async def _slots(self, call: SubCall) -> AsyncIterator[None]:
        """A place in this run's fan-out, then one of the process's sub-call slots. The time any
        sub-call of the run is outstanding counts as upstream time (not gateway overhead)."""
        if self._busy == 0:
            self._busy_since = time.perf_counter()
        self._busy += 1
        try:
            async with self.fanout, self.runner.slot():
                call.started = time.perf_counter()
                yield
        finally:
            if call.started is not None:
                call.latency_ms = (time.perf_counter() - call.started) * 1000.0
            self._busy -= 1
            if self._busy == 0:
                self.trace.upstream_seconds += time.perf_counter() - self._busy_since

    async def _forward(self, call: SubCall, request: dict[str, Any], *, stream: bool) -> Completed | OpenedStream:
        parent = self.trace
        sub = RequestTrace(  # the sub-call's own running state: its attempts, the model that answered
            request_id=f"{parent.request_id}:{call.index}", endpoint=CHAT.name, created_at=parent.created_at,
            route=parent.route, requested_model=call.model, tenant=parent.tenant,
        )
        forwarder = self.runner.forwarder
        tracer = forwarder.tracer
        span = None
        if tracer is not None and tracer.active():  # a pointsman.workflow.step span around its attempts
            span = tracer.start("pointsman.workflow.step", {
                "pointsman.workflow": self.workflow.name, "pointsman.step": call.step,
                "pointsman.model": call.model, "pointsman.index": call.index, "pointsman.stream": stream,
            })
        try:
            with contextlib.nullcontext() if span is None or tracer is None else tracer.current(span):
                result = await forwarder.forward(
                    path=CHAT.path, body=request, raw_body=with_model_first(request),
                    candidates=self.runner.candidates(call.model), stream=stream, trace=sub,
                )
            if span is not None:
                span.set_attribute("pointsman.status", 200 if isinstance(result, OpenedStream) else result.status)
            return result
        except BaseException as exc:
            if span is not None and tracer is not None:
                span.record_exception(exc)
                tracer.error(span, type(exc).__name__)
            raise
        finally:
            call.attempts, call.answered, call.backend = sub.attempts, sub.model, sub.backend
            if span is not None:
                span.set_attributes({"pointsman.attempts": sub.attempts, "pointsman.answered": sub.model or "",
                                     "pointsman.backend": sub.backend or ""})
                span.end()

    def _answer(self, call: SubCall, result: Completed, position: int, label: str) -> Answer:
        call.status = result.status
        call.prompt_tokens, call.completion_tokens = result.prompt_tokens, result.completion_tokens
        call.cost_usd = cost_usd(result.target.model, result.prompt_tokens, result.completion_tokens)
        if result.status != 200:
            raise self._refused(call, result)
        completion = orjson.loads(result.body)  # the forwarder checked it is a JSON object
        if first_choice(completion) is None:
            call.outcome, call.error = "error", "no choices in the answer"
            raise SubCallFailed(call, f"{call.step} ({call.model}): the upstream answer has no choices")
        call.outcome = "ok"
        return Answer(call, completion, result.target, position, label)

    def _refused(self, call: SubCall, result: Completed) -> SubCallFailed:
        call.outcome, call.error = "error", f"upstream answered HTTP {result.status}"
        return SubCallFailed(call, f"{call.step} ({call.model}): the upstream answered HTTP {result.status}", result)

    def _settle(self, call: SubCall, reservation: Reservation) -> None:
        """Charge the budget what the call used: its usage, else (sent but unreported) its estimate."""
        if call.prompt_tokens is not None or call.completion_tokens is not None:
            tokens = (call.prompt_tokens or 0) + (call.completion_tokens or 0)
            self.budget.settle(reservation, tokens, call.cost_usd or 0.0)
        elif call.started is not None:
            self.budget.settle(reservation, reservation.tokens, reservation.cost_usd)
        else:
            self.budget.release(reservation)

