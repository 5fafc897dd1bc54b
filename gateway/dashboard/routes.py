"""The dashboard's routes: one static page (with its script and stylesheet, shipped in the package)
and its JSON API.

``GET /dashboard`` and ``GET /dashboard/static/<file>`` hold no data and are served to anyone (the
page asks for the admin key and keeps it in the tab's ``sessionStorage``, never in a URL).
``GET /dashboard/api/summary?window=<seconds>`` holds the data and needs the admin key
(:mod:`gateway.dashboard.auth`) as ``Authorization: Bearer``; a window outside 60 s - 30 days is a 400.
"""

from __future__ import annotations

import logging
import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.dashboard.auth import DashboardAuth
from gateway.dashboard.summary import MAX_WINDOW, MIN_WINDOW, build_summary
from gateway.errors import InvalidRequestError, PointsmanError, RouteNotFoundError, ServiceUnavailableError
from gateway.responses import error_response, gateway_headers, json_response
from policies.knob import PLAIN_DECIMAL

if TYPE_CHECKING:
    from gateway.service import ProxyService

log = logging.getLogger("pointsman.dashboard")

#: The files under ``gateway/dashboard/static`` that are served, with their content types.
STATIC_FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

# No inline script or style, nothing from another origin, no framing.
_SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
     b"form-action 'none'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


@cache
def _static(name: str) -> bytes:
    return resources.files("gateway.dashboard").joinpath("static", name).read_bytes()


def _file_response(name: str) -> Response:
    body = _static(name)
    response = Response(content=body, status_code=200, media_type=None)
    response.raw_headers = [
        (b"content-type", STATIC_FILES[name].encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-cache"),
        *_SECURITY_HEADERS,
        *gateway_headers(),
    ]
    return response


async def page(request: Request) -> Response:
    """``GET /dashboard``: the page (no data in it)."""
    return _file_response("index.html")


async def static(request: Request) -> Response:
    """``GET /dashboard/static/<file>``: the page's script and stylesheet."""
    name = request.path_params["name"]
    if name not in STATIC_FILES:
        return error_response(RouteNotFoundError("no such dashboard file"))
    return _file_response(name)


#: A plain decimal number of seconds, as the page sends it (60, 3600.5, 6e1); a sign is read so that
#: "-60" is "below the minimum" rather than "not a number".
_SECONDS = re.compile(r"[-+]?" + PLAIN_DECIMAL.pattern)
_RANGE = f"a number of seconds from {MIN_WINDOW} (1 minute) to {MAX_WINDOW} (30 days)"


def parse_window(raw: str) -> float:
    """The ``window`` query parameter in seconds (always a float), or a 400 naming the parameter and its
    range. Out-of-range values are refused, not clamped: the answer then covers the window asked for."""
    shown = raw if len(raw) <= 40 else raw[:40] + "..."  # echoed, but bounded
    if not _SECONDS.fullmatch(raw):
        raise InvalidRequestError(f"Invalid 'window': expected {_RANGE}, but got {shown!r} "
                                  "instead.", param="window", code="invalid_type")
    window = float(raw)  # may overflow to inf ("1e999"): above the maximum like any other large number
    if window < MIN_WINDOW:
        raise InvalidRequestError(f"Invalid 'window': below the minimum value. Expected {_RANGE}, but got {shown} "
                                  "instead.", param="window", code="decimal_below_min_value")
    if window > MAX_WINDOW:
        raise InvalidRequestError(f"Invalid 'window': above the maximum value. Expected {_RANGE}, but got {shown} "
                                  "instead.", param="window", code="decimal_above_max_value")
    return window


def _one_param(request: Request, name: str, default: str) -> str:
    """Query parameter ``name`` given at most once: ``?window=60&window=70`` is a 400, not whichever wins."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise InvalidRequestError(f"Invalid '{name}': given {len(values)} times; give it once.", param=name,
                                  code="invalid_value")
    return values[0] if values else default


def _auth(request: Request) -> DashboardAuth:
    auth: DashboardAuth | None = getattr(request.app.state, "dashboard_auth", None)
    if auth is None:
        service: ProxyService = request.app.state.service
        auth = request.app.state.dashboard_auth = DashboardAuth(service.config.auth)
    return auth


async def summary(request: Request) -> Response:
    """``GET /dashboard/api/summary?window=3600``: traffic, cost, latency, cache, experiments, router
    version and recent decisions (admin key required when keys are configured)."""
    try:
        _auth(request).admin_for(request.headers.get("authorization"))
        window = parse_window(_one_param(request, "window", "3600"))
    except PointsmanError as error:
        return error_response(error)
    service: ProxyService = request.app.state.service
    try:
        payload = await build_summary(service.recorder.store, service.config, service.router, window,
                                      started_at=getattr(request.app.state, "started_at", None))
    except Exception as exc:  # the store is down or slow: say so, the page keeps polling
        log.warning("dashboard summary failed: %s: %s", type(exc).__name__, exc)
        return error_response(ServiceUnavailableError(f"the decision store cannot be read: {type(exc).__name__}"))
    response = json_response(payload)
    response.raw_headers.extend([(b"cache-control", b"no-store"), *_SECURITY_HEADERS])
    return response


ROUTES = [
    Route("/dashboard", page, methods=["GET"]),
    Route("/dashboard/static/{name}", static, methods=["GET"]),
    Route("/dashboard/api/summary", summary, methods=["GET"]),
]
