"""The gateway's one exception tree and its OpenAI-shaped rendering.

Every error a client can see is a :class:`PointsmanError`. Foreign exceptions (aiohttp, orjson,
pydantic, policy errors) are translated into this tree at one boundary each — the upstream client
and the request parser — so route handlers only ever deal with these types.
"""

from __future__ import annotations

from typing import Any

import orjson


class PointsmanError(Exception):
    """Base of every client-visible error. Renders as ``{"error": {message, type, param, code}}``."""

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        status: int | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:  # otherwise the subclass's status
            self.status = status
        if error_type is not None:
            self.error_type = error_type
        self.headers: dict[str, str] = dict(headers or {})

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error object for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


class InvalidRequestError(PointsmanError):
    """The request body is not valid JSON or not a valid request for this endpoint (400)."""

    status = 400
    error_type = "invalid_request_error"


class AuthenticationError(PointsmanError):
    """Missing or unknown API key (401)."""

    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFoundError(PointsmanError):
    """The requested model is neither a configured model nor a route (404)."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFoundError(PointsmanError):
    """Unknown URL path (404)."""

    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowedError(PointsmanError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeoutError(PointsmanError):
    """The request body did not arrive within ``server.body_timeout`` (408)."""

    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLargeError(PointsmanError):
    """The request body exceeds ``server.max_body_bytes`` (413)."""

    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class RateLimitError(PointsmanError):
    """Upstream kept answering 429, or every replica is at its concurrency limit (429)."""

    status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BudgetExceededError(PointsmanError):
    """An API key's spend budget for the period (day, month) is used up (429 ``budget_exceeded``,
    ``Retry-After``: seconds until the period ends)."""

    status = 429
    error_type = "insufficient_quota"
    code = "budget_exceeded"


class UpstreamError(PointsmanError):
    """The upstream failed: connection refused/reset, 5xx, or a malformed response (502)."""

    status = 502
    error_type = "upstream_error"
    code = "bad_gateway"


class ServiceUnavailableError(PointsmanError):
    """No healthy replica (all breakers open or health checks failing), or the gateway is draining (503)."""

    status = 503
    error_type = "service_unavailable"
    code = "service_unavailable"


class UpstreamTimeoutError(PointsmanError):
    """The upstream did not answer within its connect / first-byte / total timeout (504)."""

    status = 504
    error_type = "timeout_error"
    code = "upstream_timeout"


class WorkflowCapError(PointsmanError):
    """A workflow reached one of its caps before any of its sub-calls answered: 400
    ``workflow_cap_reached`` (steps, tokens or cost: the request does not fit the workflow's budget, so
    a retry cannot succeed either: a 429 made the OpenAI SDK retry it twice), or 504 ``workflow_timeout``
    for ``max_seconds``."""

    status = 400
    error_type = "workflow_error"
    code = "workflow_cap_reached"


class ConfigError(Exception):
    """The configuration file is invalid. The message names the offending key. Not client-visible."""
