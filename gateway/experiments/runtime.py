"""Experiments in one gateway process: the request path's assignment, shadows and the background tasks.

:class:`ExperimentRuntime` is what the proxy service holds. On the request path it answers one
question, :meth:`ExperimentRuntime.assign` (which arm of the route's running experiment serves this
request, and the policy that arm decides with); after a request it launches the shadow arms
(:meth:`ExperimentRuntime.served`). On start it registers every experiment in the store (the
normalised spec the report reads), reads the stops already stored, and starts the monitor (stops,
guardrails, adaptive allocation); on close it cancels shadows and tasks.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import Config
from gateway.experiments.assignment import Assignment, LiveExperiment
from gateway.experiments.monitor import ExperimentMonitor
from gateway.experiments.shadow import ShadowRunner
from gateway.forward import Forwarder
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from policies import RequestContext
from policies.brain import ActiveRouter
from policies.experiments.arms import ArmPolicy
from store.recorder import DecisionRecorder
from store.records import DecisionRecord

log = logging.getLogger("pointsman.experiments")


class ExperimentRuntime:
    """Every configured experiment of one gateway process."""

    def __init__(
        self,
        config: Config,
        arms: Mapping[str, Mapping[str, ArmPolicy]],
        forwarder: Forwarder,
        pool: BackendPool,
        recorder: DecisionRecorder,
        metrics: Metrics,
        router: ActiveRouter | None = None,
        *,
        replica: str | None = None,
    ) -> None:
        self.config = config
        self.experiments = {e.name: LiveExperiment(e, arms[e.name]) for e in config.experiments}
        # The route's experiments, in config order; their windows never overlap (validated).
        self._by_route: dict[str, list[LiveExperiment]] = {}
        for experiment in self.experiments.values():
            self._by_route.setdefault(experiment.route, []).append(experiment)
        self._store = recorder.store
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}"
        self.shadows = ShadowRunner(
            [ShadowRunner.arm(e.name, arm, arms[e.name][arm.name]) for e in config.experiments for arm in e.shadows],
            forwarder, pool, recorder, router,
        )
        self.monitor = ExperimentMonitor(self.experiments.values(), self._store, metrics.experiment_stops, self.replica)
        metrics.registry.register(self.shadows.collector())
        metrics.registry.register(_StoppedCollector(self.experiments.values()))

    def shadowed(self, experiment: str) -> bool:
        """Whether ``experiment`` has shadow arms (only then does a served request launch anything)."""
        return bool(self.experiments[experiment].shadows)

    @property
    def routes(self) -> frozenset[str]:
        """Routes that have an experiment (running or not)."""
        return frozenset(self._by_route)

    async def start(self) -> None:
        """Register every experiment, read the stops already stored, start the background tasks.

        The store being down does not stop the gateway: it is logged, and the monitor keeps asking.
        """
        for experiment in self.experiments.values():
            route = next((r for r in self.config.routes if r.name == experiment.route), None)
            try:
                await self._store.register_experiment(experiment.name, experiment.route, experiment.config.spec(route))
            except Exception as exc:
                log.error("experiment %s could not be registered in the store (%s: %s); the report will not "
                          "know its arms until a replica registers it", experiment.name, type(exc).__name__, exc)
        try:
            await self.monitor.poll_stops()
        except Exception as exc:
            log.warning("could not read the experiments' stopped arms (%s); polling goes on", type(exc).__name__)
        for experiment in self.experiments.values():
            log.info("experiment %s on route %s: arms %s (control %s)%s%s, key %s", experiment.name,
                     experiment.route, ", ".join(f"{a} {s:.3f}" for a, s in experiment.shares.items()),
                     experiment.control, f"; shadows {', '.join(experiment.shadows)}" if experiment.shadows else "",
                     f"; stopped {', '.join(sorted(experiment.stopped))}" if experiment.stopped else "",
                     experiment.config.key)
        self.monitor.start()

    async def close(self) -> None:
        """Cancel the shadows in flight and the background tasks (at shutdown)."""
        await self.shadows.close()
        await self.monitor.close()

    # --- the request path -------------------------------------------------------------------------------

    def running(self, route: str, now: float) -> LiveExperiment | None:
        """The route's experiment that runs at ``now``, if any."""
        for experiment in self._by_route.get(route, ()):
            if experiment.running(now):
                return experiment
        return None

    async def assign(
        self, route: str, ctx: RequestContext, *, dry_run: bool = False
    ) -> Assignment | None:
        """The arm serving this request of ``route`` (None: no experiment runs, or the request has no
        key and its experiment excludes such requests). ``dry_run`` (``/v1/route``) stores nothing."""
        experiment = self.running(route, time.time())
        if experiment is None:
            return None
        key = experiment.key(ctx.body, ctx.headers, ctx.request_id)
        if key is None:
            return None
        assignment = experiment.known(key)
        if assignment is None:
            if dry_run:
                assignment = await experiment.peek(key, self._store.get_assignment)
            else:
                assignment = await experiment.assign_new(key, self._store.put_assignment)
        # 64 bits of the key's hash identify the unit that was randomised (a request keyed by its own
        # id is its own unit): the report's sample-ratio check counts these, not requests.
        return assignment.for_unit(None if key.source == "request" else key.hash[:16])

    def served(self, ctx: RequestContext, record: DecisionRecord, forwarded: Mapping[str, Any] | None) -> None:
        """A request of an experiment is done (its last byte sent): start its shadow decisions."""
        self.shadows.launch(record, ctx, forwarded)

    async def after_response(
        self, ctx: RequestContext, record: DecisionRecord, forwarded: Mapping[str, Any] | None
    ) -> None:
        """:meth:`served` as a response's background task (a coroutine: Starlette runs plain functions in
        a worker thread, where no event loop runs)."""
        self.served(ctx, record, forwarded)


class _StoppedCollector(Collector):
    """``pointsman_experiment_arm_stopped{experiment,arm}``: 1 for a stopped arm, 0 for a serving one."""

    def __init__(self, experiments: Iterable[LiveExperiment]) -> None:
        self._experiments = list(experiments)

    def collect(self) -> Iterable[Metric]:
        stopped = GaugeMetricFamily(
            "pointsman_experiment_arm_stopped",
            "1 while an experiment's arm is stopped (its keys served by the control), as this replica knows it.",
            labels=("experiment", "arm"),
        )
        for experiment in self._experiments:
            for arm in experiment.served:
                stopped.add_metric((experiment.name, arm), 1.0 if arm in experiment.stopped else 0.0)
        yield stopped
