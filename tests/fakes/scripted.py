"""A one-answer upstream for tests: every POST gets the same status, headers and JSON body.

For responses the behaviour-by-model fake (``tests.fakes.upstream``) does not script, such as an
unusual ``Retry-After`` header. A real uvicorn server on loopback, like the other fake.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.upstream import LoopbackServer


class ScriptedUpstream(LoopbackServer):
    """Answers every ``POST /v1/...`` with ``status``, ``headers`` and ``body``; counts requests."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.requests = 0
        self._status, self._body, self._headers = status, body, headers or {}

        async def answer(request: Request) -> Response:
            await request.body()
            self.requests += 1
            return JSONResponse(self._body, status_code=self._status, headers=self._headers)

        super().__init__(Starlette(routes=[Route("/v1/{path:path}", answer, methods=["POST"])]))
