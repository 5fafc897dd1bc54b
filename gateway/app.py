"""The FastAPI application: thin routes over :class:`gateway.service.ProxyService`.

Proxy endpoints are plain Starlette routes (no dependency injection or response models) because
they are the hot path; validation is what ``gateway.protocol`` needs and nothing more.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.config import Config
from gateway.errors import (
    MethodNotAllowedError,
    PointsmanError,
    RouteNotFoundError,
    ServiceUnavailableError,
)
from gateway.health import HealthChecker
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from gateway.protocol import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.routing import RoutingBrain, historic_knob_scores
from gateway.service import ProxyService, error_response, new_request_id
from gateway.upstream import UpstreamClient
from store import DecisionRecorder, open_store

log = logging.getLogger("pointsman.app")


def create_app(config: Config) -> FastAPI:
    """Build the gateway app for ``config``. Network clients and tasks start in the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
        metrics.watch("pointsman_decision_log_pending", "Decision records waiting to be written.",
                      lambda: float(recorder.pending))
        metrics.watch("pointsman_decision_log_written", "Decision records written since start.",
                      lambda: float(recorder.written))
        metrics.watch("pointsman_decision_log_dropped", "Decision records dropped (queue overflow).",
                      lambda: float(recorder.dropped))
        windows = RoutingBrain.knob_windows_of(config)
        history = await recorder.store.recent(limit=max(windows.values())) if windows else []
        brain = RoutingBrain(config, historic_knob_scores(reversed(history), windows))
        await brain.start()
        service = ProxyService(config, pool, client, metrics, recorder, brain.policies)
        health = HealthChecker(pool, client)
        health.start()
        app.state.service = service
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
            await health.stop()
            await client.close()
            await brain.close()
            await recorder.stop()  # flush everything already answered before the process exits

    app = FastAPI(title="Pointsman", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None)

    async def chat_completions(request: Request) -> Response:
        return await _service(request).handle(request, CHAT)

    async def completions(request: Request) -> Response:
        return await _service(request).handle(request, COMPLETIONS)

    async def embeddings(request: Request) -> Response:
        return await _service(request).handle(request, EMBEDDINGS)

    async def route(request: Request) -> Response:
        return await _service(request).explain(request)

    async def list_models(request: Request) -> Response:
        service = _service(request)
        try:
            service.authenticate(request)
        except PointsmanError as error:
            return error_response(error, _gateway_headers())
        created = int(request.app.state.started_at)
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": target.backend.name}
            for name, target in service.pool.models.items()
        ]
        data += [
            {"id": name, "object": "model", "created": created, "owned_by": "pointsman-route"}
            for name in service.policies
        ]
        response = _json({"object": "list", "data": data})
        response.raw_headers.extend(_gateway_headers())
        return response

    async def health(request: Request) -> Response:
        return _json({"status": "ok"})

    async def ready(request: Request) -> Response:
        service = _service(request)
        if service.draining:
            return error_response(ServiceUnavailableError("draining"))
        usable = [r for r in service.pool.replicas() if r.healthy and r.breaker.available()]
        if not usable:
            return error_response(ServiceUnavailableError("no healthy upstream replica"))
        return _json({"status": "ready", "healthy_replicas": len(usable)})

    async def metrics(request: Request) -> Response:
        return Response(_service(request).metrics.render(), media_type="text/plain; version=0.0.4")

    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_route("/v1/models", list_models, methods=["GET"])
    app.add_route("/v1/route", route, methods=["POST"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/ready", ready, methods=["GET"])
    app.add_route("/metrics", metrics, methods=["GET"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
            return error_response(MethodNotAllowedError(message), _gateway_headers())
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
            return error_response(RouteNotFoundError(message), _gateway_headers())
        error = PointsmanError(str(exc.detail))
        error.status = exc.status_code
        return error_response(error, _gateway_headers())

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        # A bug: log it with its traceback (never the request body) and answer in OpenAI's shape.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(PointsmanError("internal gateway error", code="internal_error"), _gateway_headers())

    return app


def _service(request: Request) -> ProxyService:
    service: ProxyService = request.app.state.service
    return service


def _gateway_headers() -> list[tuple[bytes, bytes]]:
    """The x-pointsman-* headers for responses that involve no model (listing, unknown paths)."""
    return [
        (b"x-pointsman-request-id", new_request_id().encode()),
        (b"x-pointsman-model", b""),
        (b"x-pointsman-backend", b""),
        (b"x-pointsman-route", b""),
        (b"x-pointsman-overhead-ms", b"0.000"),
    ]


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")
