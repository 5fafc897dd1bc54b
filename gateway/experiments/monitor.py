"""The background side of experiments, in every gateway replica: guardrails, stops, adaptive allocation.

- **Stops** (every ``guardrails.poll_interval`` seconds, the shortest of the experiments'): read every
  stopped arm from the store, so a stop made by any replica (or an operator) routes that arm's keys to
  the control here too.
- **Guardrails** (per experiment, every ``guardrails.interval`` seconds): read the arms' totals from
  the store (every replica's traffic since the experiment's start) and the last ``window`` seconds of
  latencies, test every served arm against the control (:func:`policies.experiments.guardrails.check_arm`)
  and stop a breaching arm: ``store.stop_arm`` (the first replica to store it logs the stop and
  counts it in ``pointsman_experiment_arm_stops_total``), effective here at once.
- **Allocation** (adaptive experiments, every ``allocation.update_interval`` seconds): read the
  arms' outcome and cost sums over the experiment's served requests, aggregated by the store (no
  request is read), and recompute the probabilities new keys get.

A store that fails is logged (at most once a minute per task) and asked again next time; nothing
here touches the request path but the arms' stopped sets and allocation tables, swapped whole.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from prometheus_client import Counter

from gateway.experiments.assignment import LiveExperiment
from policies.experiments.allocation import ArmEvidence, ThompsonAllocator
from policies.experiments.guardrails import check_arm
from store.base import DecisionStore
from store.outcomes import served_feedback
from store.records import ArmOutcomes, ArmTotals, LoggedRequest

log = logging.getLogger("pointsman.experiments")

#: Feedback sources that say how the served answer did (as the offline estimators read them).


class ExperimentMonitor:
    """Runs the stop poller, one guardrail task and (adaptive) one allocation task per experiment."""

    def __init__(
        self,
        experiments: Iterable[LiveExperiment],
        store: DecisionStore,
        stops_counter: Counter,
        replica: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.experiments = {experiment.name: experiment for experiment in experiments}
        self._store = store
        self._stops = stops_counter
        self.replica = replica
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._failed_at: dict[str, float] = {}
        self.evidence: dict[str, dict[str, ArmEvidence]] = {}
        self._allocators = {
            name: ThompsonAllocator(
                experiment.served, experiment.control, lam=experiment.config.allocation.lambda_,
                draws=experiment.config.allocation.draws, min_propensity=experiment.config.allocation.min_propensity,
                salt=name,
            )
            for name, experiment in self.experiments.items() if experiment.adaptive
        }

    def start(self) -> None:
        """Start the background tasks (on the running loop)."""
        if not self.experiments:
            return
        loop = asyncio.get_running_loop()
        poll = min(e.config.guardrails.poll_interval for e in self.experiments.values())
        self._tasks.append(loop.create_task(self._every(poll, "stops", self.poll_stops), name="pointsman-arm-stops"))
        for name, experiment in self.experiments.items():
            guard = experiment.config.guardrails
            if guard.enabled and len(experiment.served) > 1:
                self._tasks.append(loop.create_task(
                    self._every(guard.interval, f"guardrails:{name}", functools.partial(self.check, experiment)),
                    name=f"pointsman-guardrails-{name}",
                ))
            if experiment.adaptive:
                self._tasks.append(loop.create_task(
                    self._every(experiment.config.allocation.update_interval, f"allocation:{name}",
                                functools.partial(self.reallocate, experiment), first=0.0),
                    name=f"pointsman-allocation-{name}",
                ))

    async def close(self) -> None:
        """Stop every task."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _every(
        self, interval: float, what: str, step: Callable[[], Awaitable[None]], first: float | None = None
    ) -> None:
        await asyncio.sleep(interval if first is None else first)
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                now = time.monotonic()
                if now - self._failed_at.get(what, -math.inf) > 60.0:
                    self._failed_at[what] = now
                    log.warning("experiments: %s failed (%s: %s); trying again in %gs", what,
                                type(exc).__name__, exc, interval)
            await asyncio.sleep(interval)

    # --- stops ------------------------------------------------------------------------------------------

    async def poll_stops(self) -> None:
        """Apply every stop the store holds (any replica's) to the experiments here."""
        stopped: dict[str, set[str]] = {name: set() for name in self.experiments}
        reasons: dict[tuple[str, str], str] = {}
        for stop in await self._store.experiment_stops():
            if stop.experiment in stopped:
                stopped[stop.experiment].add(stop.arm)
                reasons[(stop.experiment, stop.arm)] = stop.reason
        for name, arms in stopped.items():
            experiment = self.experiments[name]
            before = experiment.stopped
            if experiment.set_stopped(frozenset(arms)):
                for arm in sorted(experiment.stopped - before):
                    log.warning("experiment %s: arm %s is stopped (%s); its keys are served by the control arm %r",
                                name, arm, reasons.get((name, arm), "?"), experiment.control)
                for arm in sorted(before - experiment.stopped):
                    log.info("experiment %s: arm %s is serving again (its stop was removed)", name, arm)
                self._allocation_changed(experiment)

    # --- guardrails -------------------------------------------------------------------------------------

    async def check(self, experiment: LiveExperiment) -> None:
        """Test every served, running arm of ``experiment`` against the control; stop the breaching ones."""
        now = self._clock()
        config = experiment.config
        if not config.running(now):
            return
        candidates = [arm for arm in experiment.served if arm != experiment.control and arm not in experiment.stopped]
        if not candidates:
            return
        guard = config.guardrails
        totals = await self._store.experiment_totals(experiment.name, since=config.start_ts)
        latencies: dict[str, list[float]] = {}
        if guard.max_p95_ratio is not None:
            latencies = await self._store.experiment_latencies(experiment.name, since=now - guard.window)
        control = totals.get(experiment.control, ArmTotals(experiment.control))
        for arm in candidates:
            breach = check_arm(
                totals.get(arm, ArmTotals(arm)), control, guard,
                latencies.get(arm, ()), latencies.get(experiment.control, ()),
            )
            if breach is None:
                continue
            detail: dict[str, Any] = {**breach.detail, "control": experiment.control}
            stored = await self._store.stop_arm(experiment.name, arm, breach.guardrail, detail, self.replica, now)
            if stored:
                self._stops.labels(experiment.name, arm, breach.guardrail).inc()
                log.warning("experiment %s: guardrail %s stopped arm %s; its keys go to the control arm %r: %s",
                            experiment.name, breach.guardrail, arm, experiment.control, breach.describe())
            if experiment.set_stopped(experiment.stopped | {arm}):
                self._allocation_changed(experiment)

    # --- adaptive allocation ----------------------------------------------------------------------------

    async def reallocate(self, experiment: LiveExperiment) -> None:
        """Recompute the probabilities new keys of an adaptive experiment get, from the store."""
        config = experiment.config
        # Outcomes and costs are summed per arm by the store: no request crosses into the gateway (reading
        # the requests with feedback and freeing them held the event loop ~150 ms at 50,000 feedback rows,
        # and the gateway's memory grew with them).
        totals = await self._store.experiment_totals(experiment.name, since=config.start_ts)
        outcomes = await self._store.experiment_outcomes(experiment.name, config.allocation.metric,
                                                         since=config.start_ts)
        self.evidence[experiment.name] = aggregate_evidence(totals, outcomes)
        self._allocation_changed(experiment)

    def _allocation_changed(self, experiment: LiveExperiment) -> None:
        allocator = self._allocators.get(experiment.name)
        if allocator is None:
            return
        available = [arm for arm in experiment.served if arm not in experiment.stopped]
        propensities = allocator.propensities(self.evidence.get(experiment.name, {}), available)
        experiment.set_allocation(propensities)
        log.info("experiment %s: new keys are assigned %s", experiment.name,
                 ", ".join(f"{arm} {p:.3f}" for arm, p in propensities.items()))


def aggregate_evidence(
    totals: Mapping[str, ArmTotals], outcomes: Mapping[str, ArmOutcomes]
) -> dict[str, ArmEvidence]:
    """Per arm: the evidence of the store's aggregates (``experiment_totals``' costs,
    ``experiment_outcomes``' outcomes over the same served requests); the same as :func:`arm_evidence`
    of every served request's row (up to the order floating-point sums are added in)."""
    empty_totals, empty_outcomes = ArmTotals(""), ArmOutcomes("")
    evidence: dict[str, ArmEvidence] = {}
    for arm in [*totals, *(arm for arm in outcomes if arm not in totals)]:
        total, outcome = totals.get(arm, empty_totals), outcomes.get(arm, empty_outcomes)
        evidence[arm] = ArmEvidence(float(outcome.outcomes), float(outcome.quality_sum), int(total.cost_requests),
                                    float(total.cost_sum), float(total.cost_sq_sum))
    return evidence


def arm_evidence(
    rows: Iterable[LoggedRequest], metric: str, totals: Mapping[str, ArmTotals] | None = None
) -> dict[str, ArmEvidence]:
    """The row-based reading of :func:`aggregate_evidence` (what a reallocation computed before the
    store aggregated it; kept as its reference).

    Per arm: the outcomes and costs of the served requests in ``rows`` (shadow rows and client
    disconnects left out). A request's outcome is the mean of its explicit ``metric`` feedback about the
    served answer (``user``, ``rule``, ``import``), else the judge's score of the served model, else 0
    when the gateway recorded an implicit signal on it (a re-ask, a regeneration ...), else none.

    With ``totals`` (the store's per-arm sums over the same served requests), the costs are the store's
    and ``rows`` need only hold the requests that have feedback."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        record = row.record
        arm = record.experiment_arm
        if arm is None or record.shadow_of is not None or record.outcome == "client_disconnected":
            continue
        acc = sums.setdefault(arm, [0.0, 0.0, 0.0, 0.0, 0.0])
        outcome = request_outcome(row, metric)
        if outcome is not None:
            acc[0] += 1.0
            acc[1] += min(max(outcome, 0.0), 1.0)
        if totals is None and record.cost_usd is not None:
            acc[2] += 1.0
            acc[3] += record.cost_usd
            acc[4] += record.cost_usd * record.cost_usd
    for arm, total in (totals or {}).items():
        acc = sums.setdefault(arm, [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[2:] = [float(total.cost_requests), total.cost_sum, total.cost_sq_sum]
    return {arm: ArmEvidence(a[0], a[1], int(a[2]), a[3], a[4]) for arm, a in sums.items()}


def request_outcome(row: LoggedRequest, metric: str) -> float | None:
    """The outcome of a served answer under ``metric`` (see :func:`arm_evidence` and
    :mod:`store.outcomes`), or None."""
    outcome = served_feedback(row.feedback, row.record.model, metric).outcome(metric, use_judge=True)
    return None if outcome is None else outcome[0]
