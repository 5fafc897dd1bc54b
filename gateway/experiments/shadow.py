"""Shadow arms: what another policy would have decided for a served request, logged beside it.

After a request of an experiment is served (its last byte sent, so the client never waits for it),
each shadow arm that samples the request (``share``, by a hash of the request id) decides on the
same request context with its own policy, in a background task. The decision is written as its own
decision record, ``<served id>:shadow:<arm>``, with ``shadow_of`` the served request's id and
outcome ``shadow``; the store's experiment totals leave such rows out.

A shadow arm calls a backend only with ``call_backend: true``: the already redacted body (redacted
again for the PII kinds the shadow's own decision redacts), not streamed, to the model its decision
chose (a workflow decision is recorded, not run), with the arm's ``max_concurrency`` calls in flight
at most and ``budget_usd_per_hour`` over any rolling hour (estimated from the configured prices
before the call, settled from its usage); what is over a bound is skipped and counted. The call's
status, tokens, cost and latency go into the shadow's record. :meth:`ShadowRunner.close` cancels
whatever runs (the gateway calls it on shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from classifiers.offload import with_model_first
from classifiers.signals.pii.redact import redact_body
from gateway.compare import RollingSpend, transcript
from gateway.errors import PointsmanError
from gateway.forward import Completed, Forwarder
from gateway.pool import BackendPool
from gateway.protocol import CHAT
from gateway.trace import RequestTrace
from gateway.usage import cost_usd
from policies import PolicyError, RequestContext
from policies.brain import ActiveRouter
from policies.experiments.arms import ArmPolicy
from policies.experiments.config import ArmConfig
from policies.explore import sampled
from store.recorder import DecisionRecorder
from store.records import DecisionRecord

log = logging.getLogger("pointsman.experiments")

OUTCOMES = (
    "decided", "blocked", "called", "call_error", "skipped_concurrency", "skipped_budget", "skipped_workflow",
    "failed", "cancelled",
)
_DEFAULT_COMPLETION_TOKENS = 256  # a call's completion estimate when the served answer had no usage


@dataclass
class ShadowArm:
    """One shadow arm's settings, policy, bounds and counters."""

    experiment: str
    config: ArmConfig
    policy: ArmPolicy
    spend: RollingSpend
    in_flight: int = 0
    counts: Counter[str] = field(default_factory=Counter)


class ShadowRunner:
    """Launches, bounds and cancels every experiment's shadow decisions (and their backend calls)."""

    def __init__(
        self,
        arms: Iterable[ShadowArm],
        forwarder: Forwarder,
        pool: BackendPool,
        recorder: DecisionRecorder,
        router: ActiveRouter | None = None,
    ) -> None:
        self._by_experiment: dict[str, list[ShadowArm]] = {}
        for arm in arms:
            self._by_experiment.setdefault(arm.experiment, []).append(arm)
        self._forwarder = forwarder
        self._pool = pool
        self._recorder = recorder
        self._router = router
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @staticmethod
    def arm(
        experiment: str, config: ArmConfig, policy: ArmPolicy, clock: Callable[[], float] = time.monotonic
    ) -> ShadowArm:
        """The runner's state for one shadow arm."""
        return ShadowArm(experiment, config, policy, RollingSpend(clock))

    def launch(self, record: DecisionRecord, ctx: RequestContext, forwarded: Mapping[str, Any] | None) -> None:
        """Start the shadow decisions of a served request of ``record.experiment`` (never raises)."""
        try:
            if self._closed or record.experiment is None or record.outcome == "client_disconnected":
                return
            for arm in self._by_experiment.get(record.experiment, ()):
                purpose = f"shadow:{arm.experiment}:{arm.config.name}"
                if arm.config.share < 1.0 and not sampled(record.request_id, arm.config.share, purpose):
                    continue
                task = asyncio.get_running_loop().create_task(
                    self._run(arm, record, ctx, forwarded), name=f"pointsman-shadow-{record.request_id}"
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception:  # a shadow must never fail the request that triggered it
            log.exception("could not start the shadow decisions of request %s", record.request_id)

    async def close(self) -> None:
        """Start no more shadows; cancel the running ones (their backend calls stop)."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(
        self, arm: ShadowArm, served: DecisionRecord, ctx: RequestContext, forwarded: Mapping[str, Any] | None
    ) -> None:
        name = arm.config.name
        # The shadow's running state; its record is built from it once, when it is done (as a served
        # request's is), so no half-filled row is passed around while the decision and the call run.
        shadow = RequestTrace(
            request_id=f"{served.request_id}:shadow:{name}", endpoint=served.endpoint, route=served.route,
            requested_model=served.requested_model, tenant=served.tenant, outcome="shadow",
            experiment=arm.experiment, experiment_arm=name, shadow_of=served.request_id,
            router_version=arm.policy.router_version,
        )
        try:
            try:
                plan = await self._decide(arm, shadow, ctx)
            except PolicyError as exc:
                arm.counts["blocked"] += 1
                shadow.decision = {"policy": arm.policy.policy.name, "blocked": exc.code}
                shadow.reason, shadow.status = exc.message, exc.status
                return
            arm.counts["decided"] += 1
            shadow.decision, shadow.reason, shadow.signals = plan.describe(), plan.reason, plan.signals
            shadow.model = plan.candidates[0]
            shadow.propensity = plan.details.get("propensity")
            if arm.config.call_backend and forwarded is not None:
                if plan.workflow is not None or served.endpoint != CHAT.name:
                    arm.counts["skipped_workflow"] += 1  # a workflow's sub-calls are not shadowed
                else:
                    await self._call(arm, shadow, served, forwarded, plan.candidates, plan.redact)
        except asyncio.CancelledError:
            arm.counts["cancelled"] += 1
            raise
        except Exception:
            arm.counts["failed"] += 1
            log.exception("shadow %s/%s of request %s failed", arm.experiment, name, served.request_id)
        finally:
            if not self._closed:
                self._recorder.record(shadow.record())

    async def _decide(self, arm: ShadowArm, shadow: RequestTrace, ctx: RequestContext) -> Any:
        policy = arm.policy.policy
        if self._router is None or arm.policy.router_version is not None:
            return await policy.decide(ctx)
        with self._router.pin() as version:  # the record says which router version decided
            shadow.router_version = version.version
            return await policy.decide(ctx)

    async def _call(
        self,
        arm: ShadowArm,
        shadow: RequestTrace,
        served: DecisionRecord,
        forwarded: Mapping[str, Any],
        candidates: tuple[str, ...],
        redact: tuple[str, ...] = (),
    ) -> None:
        settings = arm.config
        if arm.in_flight >= settings.max_concurrency:
            arm.counts["skipped_concurrency"] += 1
            shadow.error_type = "skipped_concurrency"
            return
        estimate = self._estimate(candidates[0], served, forwarded)
        budget = settings.budget_usd_per_hour
        if budget is not None and arm.spend.total() + estimate > budget:
            arm.counts["skipped_budget"] += 1
            shadow.error_type = "skipped_budget"
            return
        reservation = arm.spend.reserve(estimate)
        arm.in_flight += 1
        spent = 0.0
        try:
            body = {k: v for k, v in forwarded.items() if k not in ("stream", "stream_options", "n")}
            body = {**body, "model": candidates[0], "stream": False}
            if redact:
                # The shadow's own policy redacts (the served one may not have): what it removes never
                # leaves the gateway. In a thread: a long request's scan must not hold the event loop.
                body = await asyncio.to_thread(redact_body, body, redact)
            try:
                # The forwarder writes the model it tries, its replica and the attempts into the trace.
                result = await self._forwarder.forward(
                    path=CHAT.path, body=body, raw_body=with_model_first(body), candidates=candidates,
                    stream=False, trace=shadow,
                )
            except PointsmanError as error:
                arm.counts["call_error"] += 1
                shadow.status, shadow.error_type = error.status, error.error_type if error.code is None else error.code
                return
            assert isinstance(result, Completed)  # stream=False
            arm.counts["called"] += 1
            shadow.status = result.status
            shadow.model, shadow.backend = result.target.name, result.target.backend.name
            shadow.prompt_tokens, shadow.completion_tokens = result.prompt_tokens, result.completion_tokens
            shadow.cost_usd = cost_usd(result.target.model, result.prompt_tokens, result.completion_tokens)
            spent = shadow.cost_usd or 0.0
            if result.status >= 400:
                arm.counts["call_error"] += 1
                shadow.error_type = f"upstream_{result.status}"
        finally:
            arm.in_flight -= 1
            arm.spend.settle(reservation, spent)

    def _estimate(self, model: str, served: DecisionRecord, body: Mapping[str, Any]) -> float:
        """What the shadow call will cost: the served call's token counts at this model's prices.

        Counts of 0 are no counts: no model was called for the served request (the response cache
        answered it, with 0 tokens), and estimating the shadow's call at $0 would let it past any
        budget, a budget of $0 included."""
        target = self._pool.get(model)
        if target is None:
            return 0.0
        prompt = served.prompt_tokens or len(transcript(body)) // 4 + 1
        completion = served.completion_tokens
        if not completion:
            asked = body.get("max_tokens") or body.get("max_completion_tokens")
            completion = asked if isinstance(asked, int) and asked > 0 else _DEFAULT_COMPLETION_TOKENS
        return cost_usd(target.model, prompt, completion) or 0.0

    def collector(self) -> Collector:
        """Prometheus counters of every shadow arm (``pointsman_experiment_shadow_total``)."""
        return _ShadowCollector([arm for arms in self._by_experiment.values() for arm in arms])


class _ShadowCollector(Collector):
    def __init__(self, arms: list[ShadowArm]) -> None:
        self._arms = arms

    def collect(self) -> Iterable[Metric]:
        outcomes = CounterMetricFamily(
            "pointsman_experiment_shadow",
            "Shadow decisions by experiment, arm and outcome: decided, blocked, called (a backend call made), "
            "call_error, skipped (concurrency, budget, workflow), failed, cancelled at shutdown.",
            labels=("experiment", "arm", "outcome"),
        )
        spend = GaugeMetricFamily(
            "pointsman_experiment_shadow_spend_usd_last_hour",
            "Shadow backend spend committed over the last hour (estimates until calls finish).",
            labels=("experiment", "arm"),
        )
        for arm in self._arms:
            for outcome in OUTCOMES:
                outcomes.add_metric((arm.experiment, arm.config.name, outcome), arm.counts[outcome])
            spend.add_metric((arm.experiment, arm.config.name), arm.spend.total())
        yield from (outcomes, spend)
