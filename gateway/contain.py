"""The last line of defence: an unexpected error becomes a normal response, never a dropped connection.

Starlette answers an unhandled exception with a 500 and then re-raises it (so servers can log it);
uvicorn then closes the connection without ``Connection: close``, and a keep-alive client's *next*
request on that connection fails with a reset, although it was valid. This pure ASGI middleware
sits inside Starlette's own error middleware and swallows the exception after logging it with its
traceback (never the request body): the client gets an OpenAI-shaped 500 on a connection that
stays usable. If the response had already started, its body is ended cleanly instead.
"""

from __future__ import annotations

import contextlib
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import PointsmanError
from gateway.logs import request_id as current_request_id
from gateway.responses import error_response, gateway_headers

log = logging.getLogger("pointsman.app")


class ContainUnexpectedErrors:
    """ASGI middleware: log a handler's unexpected exception and answer it, instead of re-raising."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def tracked(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if finished:
                return
            # The client may be gone (that can be the error itself): nothing more to tell it then.
            with contextlib.suppress(Exception):
                if not started:
                    error = PointsmanError("internal gateway error", code="internal_error")
                    # The id the request was given (and its log lines carry), not a fresh one.
                    await error_response(error, gateway_headers(current_request_id.get()))(scope, receive, send)
                else:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
