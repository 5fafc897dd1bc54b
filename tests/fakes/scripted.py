"""A one-answer upstream for tests: every POST gets the same status, headers and JSON body.

For responses the behaviour-by-model fake (``tests.fakes.upstream``) does not script, such as an
unusual ``Retry-After`` header. A real uvicorn server on loopback, like the other fake.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.upstream import free_port


class ScriptedUpstream:
    """Answers every ``POST /v1/...`` with ``status``, ``headers`` and ``body``; counts requests."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.requests = 0
        self.port = free_port()
        self._status, self._body, self._headers = status, body, headers or {}

        async def answer(request: Request) -> Response:
            await request.body()
            self.requests += 1
            return JSONResponse(self._body, status_code=self._status, headers=self._headers)

        app = Starlette(routes=[Route("/v1/{path:path}", answer, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", timeout_graceful_shutdown=1,
        ))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedUpstream:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted upstream did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
