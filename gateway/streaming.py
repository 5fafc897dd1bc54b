"""Byte-faithful SSE passthrough with idle/total deadlines and immediate cancel on client disconnect.

The upstream's bytes are forwarded exactly as they arrive (tool-call deltas, usage chunks and
``[DONE]`` included), unless a ``rewrite`` is given: a workflow's final stage passes its bytes through
one that puts the workflow's totals into the stream's last chunk (``gateway/workflows/sse.py``).
If the upstream breaks mid-stream the client gets one OpenAI-shaped error event and the stream
ends; if the client leaves, the upstream connection is dropped at once so the model stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from gateway.forward import OpenedStream
from gateway.trace import RequestTrace
from gateway.upstream import UpstreamFailure
from gateway.upstream_log import failure_log
from gateway.usage import SSEUsageScanner

_SETTLE_SECONDS = 0.1


def error_event(message: str, error_type: str, code: str) -> bytes:
    """An SSE event carrying an OpenAI error object (the openai SDK raises it as an APIError)."""
    payload = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class ProxyStream:
    """The response to a streamed completion already opened upstream: a plain ASGI app (it writes
    its own messages), which Starlette runs like any response a route returns."""

    def __init__(
        self,
        opened: OpenedStream,
        trace: RequestTrace,
        headers: Sequence[tuple[bytes, bytes]],
        on_done: Callable[[RequestTrace, SSEUsageScanner], None],
        scanner: SSEUsageScanner | None = None,
        rewrite: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self._opened = opened
        self._trace = trace
        self._extra_headers = list(headers)
        self._on_done = on_done
        self._scanner = scanner or SSEUsageScanner()
        self._rewrite = rewrite  # None (every proxied stream): the upstream's bytes as they are
        self._client_done = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        trace = self._trace
        content_type = self._opened.response.content_type.encode("latin-1")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache"), *self._extra_headers],
            }
        )
        pump = asyncio.ensure_future(self._pump(send))
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait((pump, watcher), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done() and self._client_done:
                await pump  # the client has its whole answer; only the upstream's tail remains
            elif not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                trace.outcome = "client_disconnected"
                self._opened.finish(ok=False)
            else:
                pump.result()  # re-raise bugs rather than hiding them
        except BaseException:
            pump.cancel()
            if trace.outcome == "ok":
                trace.outcome = "client_disconnected"
            self._opened.finish(ok=False)
            raise
        finally:
            watcher.cancel()
            self._on_done(self._trace, self._scanner)

    async def _settle_upstream(self) -> None:
        opened = self._opened
        try:
            while await opened.response.next_chunk(timeout=_SETTLE_SECONDS):
                pass
        except UpstreamFailure:
            opened.finish(ok=True, reuse=False)
            return
        opened.finish(ok=True)

    async def _pump(self, send: Send) -> None:
        opened, scanner, trace = self._opened, self._scanner, self._trace
        first = opened.first_chunk
        scanner.feed(first)
        trace.ttft_ms = trace.elapsed_ms()
        try:
            chunk = first
            while not scanner.saw_done:
                out = chunk if self._rewrite is None else self._rewrite(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                chunk = await opened.response.next_chunk()
                if not chunk:
                    break
                scanner.feed(chunk)
            if scanner.saw_done:
                # [DONE] is terminal: finish the client's response now instead of waiting for the
                # upstream to close (some servers keep the stream open after it), then give the
                # upstream a moment to end its body so the connection can be reused.
                self._client_done = True
                out = chunk if self._rewrite is None else self._rewrite(chunk)
                await send({"type": "http.response.body", "body": out, "more_body": False})
                await self._settle_upstream()
                return
        except UpstreamFailure as failure:
            failure_log.note(failure, backend=opened.target.backend.name, replica=opened.replica.base_url,
                             model=opened.target.name, phase="stream")
            trace.outcome = "stream_error"
            trace.error_type = failure.kind
            trace.error_message = failure.message
            opened.finish(ok=False, failure=failure)
            event = error_event(f"upstream stream failed: {failure.message}", "upstream_error", failure.kind)
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return
        except OSError:
            # The client's socket went away under us (uvicorn raises on send after a disconnect).
            trace.outcome = "client_disconnected"
            opened.finish(ok=False)
            return
        if not scanner.saw_done and scanner.events:
            # A chat/completions stream that ends without [DONE] was cut short upstream.
            trace.outcome = "stream_error"
            trace.error_type = "truncated"
            trace.error_message = "upstream stream ended without [DONE]"
            opened.finish(ok=False, failure=UpstreamFailure("reset", "stream ended without [DONE]"))
            event = error_event("upstream stream ended without [DONE]", "upstream_error", "truncated")
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return
        opened.finish(ok=True)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message: dict[str, Any] = dict(await receive())
        if message["type"] == "http.disconnect":
            return
