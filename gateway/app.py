"""The Starlette application: thin module-level routes over :class:`gateway.service.ProxyService`.

Proxy endpoints are plain Starlette routes (no dependency injection or response models) because
they are the hot path; validation is what ``gateway.protocol`` needs and nothing more. Everything a
route needs lives on ``app.state``, built in the lifespan by :func:`gateway.runtime.start_runtime`
(no network client exists at import).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config import LOCAL_BACKEND, Config
from gateway.contain import ContainUnexpectedErrors
from gateway.dashboard import DASHBOARD_ROUTES
from gateway.errors import (
    MethodNotAllowedError,
    ModelNotFoundError,
    PointsmanError,
    RouteNotFoundError,
    ServiceUnavailableError,
)
from gateway.feedback import FeedbackService
from gateway.protocol import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.responses import error_response, gateway_headers, json_response
from gateway.runtime import start_runtime
from gateway.service import ProxyService
from gateway.streaming import ProxyStream
from gateway.tracing import build_tracer
from policies.echo import client_echo

log = logging.getLogger("pointsman.app")


def create_app(config: Config, *, span_exporter: Any = None) -> Starlette:
    """Build the gateway app for ``config``. Network clients and tasks start in the lifespan.

    ``span_exporter`` (an OpenTelemetry span exporter, e.g. an in-memory one in tests) receives the
    spans instead of ``tracing.exporter`` when ``tracing.enabled``.
    """
    tracer = build_tracer(config.tracing, span_exporter)  # None when tracing is off

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime = await start_runtime(config, tracer)
        app.state.service = runtime.service
        app.state.feedback = runtime.feedback
        app.state.started_at = runtime.started_at
        try:
            yield
        finally:
            await runtime.close()

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


async def chat_completions(request: Request) -> Response | ProxyStream:
    return await _service(request).handle(request, CHAT)


async def completions(request: Request) -> Response | ProxyStream:
    return await _service(request).handle(request, COMPLETIONS)


async def embeddings(request: Request) -> Response | ProxyStream:
    return await _service(request).handle(request, EMBEDDINGS)


async def feedback(request: Request) -> Response:
    """``POST /v1/feedback``: an outcome for a request id, answered once durably stored."""
    handler: FeedbackService = request.app.state.feedback
    return await handler.handle(request)


async def route(request: Request) -> Response:
    """``POST /v1/route``: the routing decision for a chat request, no backend called."""
    return await _service(request).explain(request)


def _models(request: Request) -> list[dict[str, Any]]:
    """Every model a client may name: configured models (owned by their backend), routes and workflows."""
    service = _service(request)
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
    return data


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: every configured model (owned by its backend), every route and every
    workflow (``cascade/<name>`` …)."""
    try:
        _service(request).authenticate(request)
    except PointsmanError as error:
        return error_response(error)
    return json_response({"object": "list", "data": _models(request)})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{model}`` (the SDK's ``models.retrieve``): one entry of the list, or a 404."""
    try:
        _service(request).authenticate(request)
        name = request.path_params["model"]
        for entry in _models(request):
            if entry["id"] == name:
                return json_response(entry)
        raise ModelNotFoundError(
            f"The model {client_echo(name)} does not exist; GET /v1/models lists models and routes", param="model"
        )
    except PointsmanError as error:
        return error_response(error)


async def health(request: Request) -> Response:
    """``GET /health``: the process is up (liveness)."""
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    """``GET /ready``: 200 while some replica can take traffic and the gateway is not draining."""
    service = _service(request)
    if service.draining:
        return error_response(ServiceUnavailableError("draining"))
    local = getattr(request.app.state, "local_model", None)
    local_down = local is not None and not local.running  # crashed, being restarted (or given up)
    usable = [
        r for r in service.pool.replicas()
        if r.healthy and r.breaker.available() and not (local_down and r.backend.name == LOCAL_BACKEND)
    ]
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
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
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
