"""The gateway's workflow runner: one per process, shared by every request a workflow answers.

:meth:`WorkflowRunner.run` executes one workflow for one request within its caps and returns a
:class:`~gateway.workflows.respond.WorkflowDone`: a buffered answer, or the final stage's stream
opened for the service to relay. How a run ends:

- it answers: the kind's answer (a cascade stage, a fusion's fuser or best candidate, …);
- a cap is reached (steps, tokens, cost: a sub-call that would exceed it is not made; wall time: the
  run is cancelled at ``max_seconds``): the best answer so far, marked ``capped``;
- a sub-call fails where the kind cannot go on: the best answer so far, marked ``degraded``;
- nothing answered: an OpenAI-shaped error — a 4xx every path ended in is passed on as-is (the
  request is at fault), a cap is 400 ``workflow_cap_reached`` (504 ``workflow_timeout`` for
  ``max_seconds``), a failure 502 naming the failed sub-calls — or 503 (no healthy replica) / 429
  (replicas saturated, rate-limited) when every failed sub-call ended so, as for a single call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from gateway.config import Config
from gateway.errors import ConfigError, InvalidRequestError, WorkflowCapError
from gateway.forward import Forwarder
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from gateway.protocol import CHAT, Endpoint
from gateway.trace import RequestTrace
from gateway.workflows.bodies import ClientAsk
from gateway.workflows.caps import CapReached
from gateway.workflows.cascade import run_cascade
from gateway.workflows.confidence import HeadScorer
from gateway.workflows.fusion import run_fusion
from gateway.workflows.graph import run_graph
from gateway.workflows.outcome import Final, finish
from gateway.workflows.ratings import run_ratings
from gateway.workflows.respond import WorkflowDone
from gateway.workflows.runtime import Run, SubCallFailed, no_answer_error
from policies.workflows import AnyWorkflow, CascadeWorkflow, RatingsWorkflow
from store.recorder import DecisionRecorder

log = logging.getLogger("pointsman.workflows")

Kind = Callable[[Run], Awaitable[Final]]
KINDS: dict[str, Kind] = {"cascade": run_cascade, "fusion": run_fusion, "ratings": run_ratings, "graph": run_graph}


def preflight(config: Config) -> None:
    """Check, before the gateway starts, what its workflows need beyond the config's own validation
    (the answer-confidence artifacts of ``source: head`` cascades); ``ConfigError`` naming the key."""
    for name, (key, scorer) in head_scorers(config.workflows).items():
        try:
            scorer.check()
        except (ImportError, OSError) as exc:
            raise ConfigError(f"workflows.{name}.{key}: {exc}") from exc


def head_scorers(workflows: Iterable[AnyWorkflow]) -> dict[str, tuple[str, HeadScorer]]:
    """The answer-confidence head each workflow scores with, if any: workflow name -> (its config
    key, the scorer): a cascade with ``confidence.source: head``, a ratings workflow with ``head``."""
    heads: dict[str, tuple[str, HeadScorer]] = {}
    for workflow in workflows:
        if isinstance(workflow, CascadeWorkflow) and workflow.confidence.source == "head":
            heads[workflow.name] = ("confidence.artifact", HeadScorer(workflow.confidence.artifact))
        elif isinstance(workflow, RatingsWorkflow) and workflow.head is not None:
            heads[workflow.name] = ("head.artifact", HeadScorer(workflow.head.artifact))
    return heads


class WorkflowRunner:
    """Runs the configured workflows; holds what their runs share (the process-wide sub-call slots,
    answer-confidence heads, the forwarder, metrics and the recorder for ratings feedback)."""

    def __init__(
        self, config: Config, forwarder: Forwarder, pool: BackendPool, metrics: Metrics, recorder: DecisionRecorder
    ) -> None:
        self.workflows: dict[str, AnyWorkflow] = {workflow.name: workflow for workflow in config.workflows}
        self.forwarder = forwarder
        self.pool = pool
        self.metrics = metrics
        self.recorder = recorder
        self._slots = asyncio.Semaphore(config.workflow_limits.max_concurrent_subcalls)
        self._candidates = {
            name: tuple(dict.fromkeys((name, *target.model.fallbacks))) for name, target in pool.models.items()
        }
        self._head_keys = head_scorers(config.workflows)
        self.heads: dict[str, HeadScorer] = {name: scorer for name, (_key, scorer) in self._head_keys.items()}

    async def start(self) -> None:
        """Load the answer-confidence heads the cascades need (in threads: they load an encoder);
        :class:`~gateway.errors.ConfigError` naming the workflow when one cannot be loaded."""
        for name, (key, head) in self._head_keys.items():
            try:
                await asyncio.to_thread(head.load)
            except (ImportError, OSError, ValueError, KeyError) as exc:
                where = head.artifact or "the shipped artifact"
                raise ConfigError(
                    f"workflows.{name}.{key}: cannot load the answer-confidence head from {where}: {exc}"
                ) from exc
            log.info("workflow %s: answer-confidence head ready", name)

    def candidates(self, model: str) -> tuple[str, ...]:
        """``model`` then its configured fallbacks (what a sub-call of ``model`` may be answered by)."""
        return self._candidates.get(model, (model,))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the process's ``max_concurrent_subcalls`` slots (waiting for one when all are taken)."""
        gauge = self.metrics.workflow_subcalls
        gauge.labels("waiting").inc()
        try:
            await self._slots.acquire()
        finally:
            gauge.labels("waiting").dec()
        gauge.labels("in_flight").inc()
        try:
            yield
        finally:
            gauge.labels("in_flight").dec()
            self._slots.release()

    async def run(self, name: str, endpoint: Endpoint, body: Mapping[str, Any], trace: RequestTrace) -> WorkflowDone:
        """Run workflow ``name`` for a request whose forwarded body is ``body``; raises a
        :class:`~gateway.errors.PointsmanError` when it ends without an answer (the record says why)."""
        workflow = self.workflows[name]
        if endpoint is not CHAT:
            raise InvalidRequestError(f"{workflow.model_name} is a workflow: it serves /v1/chat/completions only",
                                      param="model")
        run = Run(self, workflow, dict(body), trace, ClientAsk.of(body))
        try:
            final = await self._execute(run)
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            finish(run, None, trace, self.metrics, outcome="cancelled" if cancelled else "failed")
            raise
        return WorkflowDone(run, final)

    async def _execute(self, run: Run) -> Final:
        workflow = run.workflow
        failure: SubCallFailed | None = None
        deadline = asyncio.timeout(workflow.caps.max_seconds)
        try:
            async with deadline:
                return await KINDS[workflow.kind](run)
        except TimeoutError:
            if not deadline.expired():
                raise
            run.note_cap(CapReached("max_seconds", f"no final answer within {workflow.caps.max_seconds:g}s"))
        except CapReached as cap:
            run.note_cap(cap)
        except SubCallFailed as exc:
            failure = exc
        return self._fallback(run, failure)

    def _fallback(self, run: Run, failure: SubCallFailed | None) -> Final:
        """The best answer so far, or the error that says why there is none."""
        name = run.workflow.model_name
        escalated = bool(run.escalations) if isinstance(run.workflow, CascadeWorkflow) else None
        if run.best is not None:
            degraded = None if run.capped is not None or failure is None else failure.message
            return Final(answer=run.best, escalated=escalated, degraded=degraded)
        if run.capped is not None:
            cap = run.capped
            if cap.cap == "max_seconds":
                raise WorkflowCapError(f"workflow {name} reached max_seconds before any answer: {cap.detail}",
                                       status=504, code="workflow_timeout")
            raise WorkflowCapError(f"workflow {name} reached {cap.cap} before any answer: {cap.detail}")
        if failure is not None and failure.completed is not None:
            return Final(passthrough=failure.completed, escalated=escalated, degraded=failure.message)
        failed = [c for c in run.calls if c.outcome != "ok"]
        failures = "; ".join(f"{c.step} ({c.model}): {c.error}" for c in failed) or (
            failure.message if failure is not None else "no sub-call answered")
        raise no_answer_error(f"workflow {name} produced no answer: {failures}", failed)
