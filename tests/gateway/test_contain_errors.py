"""A bug in a handler must not cost the client its keep-alive connection (or anyone their request).

The middleware is run as the gateway runs it: a Starlette app behind real uvicorn with httptools on
loopback, driven over one raw HTTP/1.1 connection. Without it, Starlette answers 500 and re-raises,
uvicorn then drops the connection without ``Connection: close``, and the client's *next* valid
request on that connection fails with a reset.
"""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.contain import ContainUnexpectedErrors
from gateway.logs import request_id as current_request_id
from tests.fakes.upstream import LoopbackServer


async def _bug(request: Request) -> Response:
    raise RuntimeError("a bug with a secret sk-live-123 in its message")


async def _bug_after_naming_the_request(request: Request) -> Response:
    current_request_id.set("psm-the-requests-own-id")  # as ProxyService does first
    raise RuntimeError("a bug later in the handler")


async def _bug_mid_stream(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        raise RuntimeError("broke after the headers were sent")

    return StreamingResponse(body(), media_type="text/event-stream")


async def _ok(request: Request) -> Response:
    return JSONResponse({"ok": True})


def _app(contained: bool) -> Starlette:
    routes = [Route("/bug", _bug, methods=["POST"]), Route("/stream-bug", _bug_mid_stream, methods=["POST"]),
              Route("/named-bug", _bug_after_naming_the_request, methods=["POST"]),
              Route("/ok", _ok, methods=["POST"])]
    middleware = [Middleware(ContainUnexpectedErrors)] if contained else []
    return Starlette(routes=routes, middleware=middleware)


@pytest.fixture(scope="module")
def server() -> Iterator[LoopbackServer]:
    logging.getLogger("pointsman.app").setLevel(logging.CRITICAL)  # the tracebacks are expected here
    running = LoopbackServer(_app(contained=True)).start()
    yield running
    running.stop()


def _exchange(connection: http.client.HTTPConnection, path: str) -> tuple[int, dict[str, str], bytes]:
    connection.request("POST", path, body=b"{}", headers={"content-type": "application/json"})
    response = connection.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def _one_connection(port: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.connect()
    connection.auto_open = 0  # never reconnect silently: the same socket must serve every request
    return connection


def test_an_unexpected_error_is_an_openai_500_on_a_connection_that_stays_usable(server: LoopbackServer) -> None:
    connection = _one_connection(server.port)
    try:
        status, headers, body = _exchange(connection, "/bug")
        assert status == 500 and headers.get("connection", "").lower() != "close"
        error = json.loads(body)["error"]
        assert error == {"message": "internal gateway error", "type": "server_error", "param": None,
                         "code": "internal_error"}
        assert "x-pointsman-request-id" in headers
        for _ in range(3):  # the same socket keeps serving
            assert _exchange(connection, "/ok")[0] == 200
    finally:
        connection.close()


def test_an_error_after_the_headers_ends_the_body_and_keeps_the_connection(server: LoopbackServer) -> None:
    connection = _one_connection(server.port)
    try:
        status, _, body = _exchange(connection, "/stream-bug")
        assert status == 200 and body == b"data: first\n\n"
        assert _exchange(connection, "/ok")[0] == 200
    finally:
        connection.close()


def test_without_the_middleware_the_next_request_is_lost() -> None:
    """The failure this middleware exists for (so this file would notice if uvicorn changed)."""
    bare = LoopbackServer(_app(contained=False)).start()
    connection = _one_connection(bare.port)
    try:
        assert _exchange(connection, "/bug")[0] == 500
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            _exchange(connection, "/ok")
    finally:
        connection.close()
        bare.stop()


def test_the_500_carries_the_id_the_request_was_given(server: LoopbackServer) -> None:
    # It carried a fresh id, matching none of the request's log lines.
    connection = _one_connection(server.port)
    try:
        status, headers, _ = _exchange(connection, "/named-bug")
        assert status == 500 and headers["x-pointsman-request-id"] == "psm-the-requests-own-id"
    finally:
        connection.close()
