"""What a running gateway owns, started in dependency order and closed in a fixed, explained order.

:func:`start_runtime` builds the network clients, stores, routing brain, service and background tasks
for a config (the app's lifespan calls it); :meth:`GatewayRuntime.close` stops them. A start that
fails part-way closes what it had already started before the error propagates, so a failed start
leaves no connection, task or flusher behind (tests and embedders that build apps in-process rely on
that; a gateway process exits anyway).
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from classifiers.registry import SHIPPED_ROUTERS_DIR, resolve_routers_dir
from gateway.balancing.hints import share_hints
from gateway.config import Config
from gateway.feedback import FeedbackService
from gateway.health import HealthChecker
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from gateway.quota import build_quotas
from gateway.routing import RoutingBrain, historic_knob_scores
from gateway.service import ProxyService
from gateway.upstream import UpstreamClient
from store import DecisionRecorder, FeedbackWriter, open_store

log = logging.getLogger("pointsman.runtime")


@dataclass
class GatewayRuntime:
    """The started parts of one gateway; each is None until started (and on a failed start, after it)."""

    config: Config
    tracer: Any = None  # the OpenTelemetry tracer (gateway.tracing); None when tracing is off
    client: UpstreamClient | None = None
    recorder: DecisionRecorder | None = None
    brain: RoutingBrain | None = None
    service: ProxyService | None = None
    quotas: Any = None  # gateway.quota's runtime, when limits or budgets are configured
    experiments: Any = None  # gateway.experiments.ExperimentRuntime, when experiments are configured
    health: HealthChecker | None = None
    hints: Any = None  # gateway.balancing.hints' sharer, when replicas share placements through Redis
    feedback_writer: FeedbackWriter | None = None
    feedback: FeedbackService | None = None
    started_at: float = field(default_factory=time.time)

    async def close(self) -> None:
        """Stop everything that was started. The order matters where one part uses another:

        comparisons, the response cache and experiment shadows call upstreams, so they stop before
        the upstream client; quota settlements still in flight are written before the brain closes
        the shared Redis; feedback still waiting is written, then the decision log is flushed last,
        so nothing already answered is lost; spans still buffered are exported at the very end.
        """
        if self.service is not None:
            self.service.draining = True
            await self.service.followups.close()  # running comparisons are cancelled (their upstream calls too)
            await self.service.cache.close()  # cache writes in flight finish (briefly), Redis is closed
        if self.experiments is not None:
            await self.experiments.close()  # shadows in flight are cancelled, guardrail tasks stopped
        if self.health is not None:
            await self.health.stop()
        if self.hints is not None:
            await self.hints.close()
        if self.client is not None:
            await self.client.close()
        if self.quotas is not None:
            await self.quotas.close()  # settlements in flight are written (briefly) before Redis closes
        if self.brain is not None:
            await self.brain.close()
        if self.feedback_writer is not None:
            await self.feedback_writer.stop()  # feedback still waiting is written (or answered 503)
        if self.recorder is not None:
            await self.recorder.stop()  # flush everything already answered before the process exits
        if self.tracer is not None:
            self.tracer.shutdown()  # export the spans still buffered
        for name in _PARTS:  # closed: a second close() is a no-op
            setattr(self, name, None)


_PARTS = ("tracer", "client", "recorder", "brain", "service", "quotas", "experiments", "health", "hints",
          "feedback_writer", "feedback")


async def start_runtime(config: Config, tracer: Any = None) -> GatewayRuntime:
    """Start every part of a gateway for ``config``; on failure, close what started, then raise."""
    runtime = GatewayRuntime(config, tracer)
    try:
        await _start(runtime)
    except BaseException:
        log.error("gateway start failed: closing what had started")
        await runtime.close()
        raise
    # Everything allocated so far (imports, config, pools) lives for the whole process. Moving it
    # out of the collector's view stops full collections from re-scanning it under load: they
    # caused 25-50 ms stalls every ~0.4 s at c=16 (bench/README.md), i.e. the p99.
    gc.collect()
    gc.freeze()
    return runtime


async def _start(rt: GatewayRuntime) -> None:
    config = rt.config
    rt.client = client = UpstreamClient(config.server.max_response_bytes)
    await client.start()
    pool = BackendPool(config.backends, config.breaker)
    metrics = Metrics()
    metrics.watch_pool(pool)
    store_config = config.store
    recorder = DecisionRecorder(
        open_store(store_config.kind, store_config.path, store_config.dsn),
        batch_size=store_config.batch_size,
        flush_interval=store_config.flush_interval,
        queue_limit=store_config.queue_limit,
        queue_bytes_limit=store_config.queue_bytes_limit,
    )
    await recorder.start()
    rt.recorder = recorder
    metrics.watch_attributes(recorder, {
        "pointsman_decision_log_pending": ("pending", "Decision records waiting to be written."),
    })
    metrics.watch_counts(recorder, {
        "pointsman_decision_log_written": ("written", "Decision records written since start."),
        "pointsman_decision_log_skipped": ("skipped", "Decision records not written: a forget's tombstone "
                                           "covers them, or they were stored already (a retried batch)."),
        "pointsman_decision_log_dropped": ("dropped", "Decision records dropped (queue overflow)."),
        "pointsman_decision_log_write_errors": ("write_errors", "Failed decision-log batch writes (retried)."),
    })
    windows = RoutingBrain.knob_windows_of(config)
    history = await recorder.store.recent(limit=max(windows.values())) if windows else []
    routers_dir = config.classifiers.routers_dir
    resolved = resolve_routers_dir(routers_dir)
    version = resolved.version  # the one about to serve
    if routers_dir and resolved.registry is None and resolved.directory == SHIPPED_ROUTERS_DIR:
        log.warning(
            "classifiers.routers_dir %s (%s: a relative path is read from the working directory) is missing or "
            "holds no trained heads: serving the shipped routers (%s) until heads or a registry appear there",
            routers_dir,
            _absolute(routers_dir),
            version,
        )
    rt.brain = brain = RoutingBrain(config, historic_knob_scores(reversed(history), windows, version), watch=True)
    await brain.start()
    if brain.scan_pool is not None:
        metrics.watch_attributes(brain.scan_pool, {
            "pointsman_scan_pending": ("pending", "Long-request text scans waiting or running in workers."),
        })
        metrics.watch_counts(brain.scan_pool, {
            "pointsman_scan_completed": ("completed", "Long-request text scans done in worker processes."),
            "pointsman_scan_refused": ("refused", "Long-request text scans refused (queue full: 503)."),
            "pointsman_scan_timeouts": ("timeouts", "Long-request text scans stopped at classifiers.scan_timeout."),
        })
    rt.service = service = ProxyService(config, pool, client, metrics, recorder, brain.policies, brain.scan_pool,
                                        router=brain.router, tracer=rt.tracer)
    await service.workflows.start()  # answer-confidence heads, when a cascade scores with one
    rt.quotas = build_quotas(config, brain.shared_state, {n: t.model for n, t in pool.models.items()}, metrics)
    if rt.quotas is not None:  # rate limits and spend budgets (in memory, or shared through Redis)
        service.use_quotas(rt.quotas)
    if config.experiments:
        # Imported only here: the runtime's statistics need scipy, which a gateway without
        # experiments never loads.
        from gateway.experiments import ExperimentRuntime

        experiments = ExperimentRuntime(config, brain.arms, service.forwarder, pool, recorder, metrics, brain.router)
        await experiments.start()  # registers every experiment; reads the stops other replicas stored
        rt.experiments = experiments
        service.use_experiments(experiments)
    metrics.watch_router(brain.router)
    followups = service.followups
    followups.set_encoder(lambda: brain.encoder)  # for conversation capture (loaded by brain.start)
    service.cache.set_encoder(lambda: brain.encoder)  # for semantic cache lookups
    await service.cache.start()  # connects to Redis when the cache lives there (fails open)
    metrics.registry.register(followups.compare.collector())
    metrics.watch_counts(followups.implicit, {
        f"pointsman_implicit_feedback_{name}": (f"count_{name}", f"Implicit '{name}' feedback rows recorded.")
        for name in ("reask", "regenerate", "finish_length", "upstream_error")
    })
    rt.health = HealthChecker(pool, client)
    rt.health.start()
    if brain.shared_state is not None:  # replicas' session/prefix placements shared with peer gateways
        rt.hints = share_hints(pool.backends, brain.shared_state.client, config.shared_state.key_prefix)
        if rt.hints is not None:
            rt.hints.start()
    feedback_writer = FeedbackWriter(recorder.store, config.feedback.batch_size,
                                     write_timeout=config.feedback.write_timeout)
    await feedback_writer.start()
    rt.feedback_writer = feedback_writer
    rt.feedback = FeedbackService(config, service, recorder.store, feedback_writer, metrics)
    rt.started_at = time.time()


def _absolute(path: str) -> str:
    """``path`` made absolute against the working directory (no file system access: for a log line)."""
    return str(Path(path).absolute())
