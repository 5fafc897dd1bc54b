"""The Starlette application: thin module-level routes over :class:`gateway.service.ProxyService`.

Proxy endpoints are plain Starlette routes (no dependency injection or response models) because
they are the hot path; validation is what ``gateway.protocol`` needs and nothing more. Everything a
route needs lives on ``app.state``, built in the lifespan (no network client exists at import).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from classifiers.registry import resolve_routers_dir
from gateway.balancing.hints import share_hints
from gateway.config import Config
from gateway.contain import ContainUnexpectedErrors
from gateway.dashboard import DASHBOARD_ROUTES
from gateway.errors import (
    MethodNotAllowedError,
    PointsmanError,
    RouteNotFoundError,
    ServiceUnavailableError,
)
from gateway.feedback import FeedbackService
from gateway.health import HealthChecker
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from gateway.protocol import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.quota import build_quotas
from gateway.responses import error_response, gateway_headers, json_response
from gateway.routing import RoutingBrain, historic_knob_scores
from gateway.service import ProxyService
from gateway.tracing import build_tracer
from gateway.upstream import UpstreamClient
from policies.echo import client_echo
from store import DecisionRecorder, FeedbackWriter, open_store

log = logging.getLogger("pointsman.app")


def create_app(config: Config, *, span_exporter: Any = None) -> Starlette:
    """Build the gateway app for ``config``. Network clients and tasks start in the lifespan.

    ``span_exporter`` (an OpenTelemetry span exporter, e.g. an in-memory one in tests) receives the
    spans instead of ``tracing.exporter`` when ``tracing.enabled``.
    """
    tracer = build_tracer(config.tracing, span_exporter)  # None when tracing is off

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = UpstreamClient()
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
        )
        await recorder.start()
        metrics.watch_attributes(recorder, {
            "pointsman_decision_log_pending": ("pending", "Decision records waiting to be written."),
            "pointsman_decision_log_written": ("written", "Decision records written since start."),
            "pointsman_decision_log_dropped": ("dropped", "Decision records dropped (queue overflow)."),
        })
        windows = RoutingBrain.knob_windows_of(config)
        history = await recorder.store.recent(limit=max(windows.values())) if windows else []
        version = resolve_routers_dir(config.classifiers.routers_dir).version  # the one about to serve
        brain = RoutingBrain(config, historic_knob_scores(reversed(history), windows, version), watch=True)
        await brain.start()
        if brain.scan_pool is not None:
            metrics.watch_attributes(brain.scan_pool, {
                "pointsman_scan_pending": ("pending", "Long-request text scans waiting or running in workers."),
                "pointsman_scan_completed": ("completed", "Long-request text scans done in worker processes."),
                "pointsman_scan_refused": ("refused", "Long-request text scans refused (queue full: 503)."),
                "pointsman_scan_timeouts": ("timeouts", "Long-request text scans stopped at classifiers.scan_timeout."),
            })
        service = ProxyService(config, pool, client, metrics, recorder, brain.policies, brain.scan_pool,
                               router=brain.router, tracer=tracer)
        await service.workflows.start()  # answer-confidence heads, when a cascade scores with one
        quotas = build_quotas(config, brain.shared_state, {n: t.model for n, t in pool.models.items()}, metrics)
        if quotas is not None:  # rate limits and spend budgets (in memory, or shared through Redis)
            service.use_quotas(quotas)
        experiments = None
        if config.experiments:
            # Imported only here: the runtime's statistics need scipy, which a gateway without
            # experiments never loads.
            from gateway.experiments import ExperimentRuntime

            experiments = ExperimentRuntime(config, brain.arms, service.forwarder, pool, recorder, metrics,
                                            brain.router)
            await experiments.start()  # registers every experiment; reads the stops other replicas stored
            service.use_experiments(experiments)
        metrics.watch_router(brain.router)
        followups = service.followups
        followups.set_encoder(lambda: brain.encoder)  # for conversation capture (loaded by brain.start)
        service.cache.set_encoder(lambda: brain.encoder)  # for semantic cache lookups
        await service.cache.start()  # connects to Redis when the cache lives there (fails open)
        metrics.registry.register(followups.compare.collector())
        metrics.watch_attributes(followups.implicit, {
            f"pointsman_implicit_feedback_{name}": (f"count_{name}", f"Implicit '{name}' feedback rows recorded.")
            for name in ("reask", "regenerate", "finish_length", "upstream_error")
        })
        health = HealthChecker(pool, client)
        health.start()
        hints = None
        if brain.shared_state is not None:  # replicas' session/prefix placements shared with peer gateways
            hints = share_hints(pool.backends, brain.shared_state.client, config.shared_state.key_prefix)
            if hints is not None:
                hints.start()
        app.state.service = service
        feedback_writer = FeedbackWriter(
            recorder.store, config.feedback.batch_size, write_timeout=config.feedback.write_timeout
        )
        await feedback_writer.start()
        app.state.feedback = FeedbackService(config, service, recorder.store, feedback_writer, metrics)
        app.state.started_at = time.time()
        # Everything allocated so far (imports, config, pools) lives for the whole process. Moving it
        # out of the collector's view stops full collections from re-scanning it under load: they
        # caused 25-50 ms stalls every ~0.4 s at c=16 (bench/README.md), i.e. the p99.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            service.draining = True
            await service.followups.close()  # running comparisons are cancelled (their upstream calls too)
            await service.cache.close()  # cache writes in flight finish (briefly), Redis is closed
            if experiments is not None:
                await experiments.close()  # shadows in flight are cancelled, guardrail tasks stopped
            await health.stop()
            if hints is not None:
                await hints.close()
            await client.close()
            if quotas is not None:
                await quotas.close()  # settlements in flight are written (briefly) before Redis closes
            await brain.close()
            await feedback_writer.stop()  # feedback still waiting is written (or answered 503)
            await recorder.stop()  # flush everything already answered before the process exits
            if tracer is not None:
                tracer.shutdown()  # export the spans still buffered

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        middleware=[Middleware(ContainUnexpectedErrors)],
        exception_handlers={StarletteHTTPException: _http_error},
    )
    # "/v1/chat/completions/" is an unknown path (an OpenAI-shaped 404), not a redirect that a POST
    # client would follow with a GET.
    app.router.redirect_slashes = False
    return app


def _service(request: Request) -> ProxyService:
    service: ProxyService = request.app.state.service
    return service


async def chat_completions(request: Request) -> Response:
    return await _service(request).handle(request, CHAT)


async def completions(request: Request) -> Response:
    return await _service(request).handle(request, COMPLETIONS)


async def embeddings(request: Request) -> Response:
    return await _service(request).handle(request, EMBEDDINGS)


async def feedback(request: Request) -> Response:
    """``POST /v1/feedback``: an outcome for a request id, answered once durably stored."""
    handler: FeedbackService = request.app.state.feedback
    return await handler.handle(request)


async def route(request: Request) -> Response:
    """``POST /v1/route``: the routing decision for a chat request, no backend called."""
    return await _service(request).explain(request)


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: every configured model (owned by its backend), every route and every
    workflow (``cascade/<name>`` …)."""
    service = _service(request)
    try:
        service.authenticate(request)
    except PointsmanError as error:
        return error_response(error)
    created = int(request.app.state.started_at)
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": target.backend.name}
        for name, target in service.pool.models.items()
    ]
    data += [
        {"id": name, "object": "model", "created": created, "owned_by": "pointsman-route"}
        for name in service.policies
    ]
    data += [
        {"id": workflow.model_name, "object": "model", "created": created, "owned_by": "pointsman-workflow"}
        for workflow in service.workflows.workflows.values()
    ]
    return json_response({"object": "list", "data": data})


async def health(request: Request) -> Response:
    """``GET /health``: the process is up (liveness)."""
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    """``GET /ready``: 200 while some replica can take traffic and the gateway is not draining."""
    service = _service(request)
    if service.draining:
        return error_response(ServiceUnavailableError("draining"))
    usable = [r for r in service.pool.replicas() if r.healthy and r.breaker.available()]
    if not usable:
        return error_response(ServiceUnavailableError("no healthy upstream replica"))
    return json_response({"status": "ready", "healthy_replicas": len(usable)})


async def metrics(request: Request) -> Response:
    """``GET /metrics``: Prometheus text format."""
    response = Response(_service(request).metrics.render(), media_type="text/plain; version=0.0.4")
    response.raw_headers.extend(gateway_headers())
    return response


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/route", route, methods=["POST"]),
    Route("/v1/feedback", feedback, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    *DASHBOARD_ROUTES,
]


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (and other HTTP errors) in OpenAI's shape."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        message = f"method {client_echo(request.method)} is not allowed on {client_echo(request.url.path, 64)}"
        return error_response(MethodNotAllowedError(message))
    if exc.status_code == 404:
        message = f"no such endpoint: {client_echo(request.method)} {client_echo(request.url.path, 64)}"
        return error_response(RouteNotFoundError(message))
    return error_response(PointsmanError(str(exc.detail), status=exc.status_code))
