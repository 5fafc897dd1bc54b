"""Byte-faithful SSE passthrough with idle/total deadlines and immediate cancel on client disconnect.

The upstream's bytes are forwarded unchanged (tool-call deltas, usage chunks and ``[DONE]``
included), a whole event at a time (``gateway/sse_frames.py``), unless a ``rewrite`` is given: a
workflow's final stage passes its bytes through one that puts the workflow's totals into the
stream's last chunk (``gateway/workflows/sse.py``). If the upstream breaks mid-stream, sends an
event that is not JSON or one that never ends, the client gets one OpenAI-shaped error event (never
glued to half an event) and the stream ends; if the client leaves, the upstream connection is
dropped at once so the model stops generating. A client that stops reading (its socket takes no more
bytes) is cut off like one that left once none of the stream has gone out for the backend's ``idle``
timeout: waiting for it ran no deadline, and held the upstream connection, the replica's slot and the
request's record for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from gateway.forward import OpenedStream
from gateway.http_protocol import ABORT_KEY, STALLED, WRITTEN_KEY
from gateway.sse_frames import EventTooLarge, SSEFramer, event_data
from gateway.trace import RequestTrace
from gateway.upstream import UpstreamFailure
from gateway.upstream_log import failure_log
from gateway.usage import SSEUsageScanner

_SETTLE_SECONDS = 0.1  # how long the upstream may take to end its body after [DONE]
_SETTLE_BYTES = 64 << 10  # and how much it may send meanwhile


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
        # When the write to the client under way began (None between writes), for the stall watchdog.
        self._sending_since: float | None = None
        self._stalled = False
        self._watchdog: asyncio.TimerHandle | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        trace = self._trace
        content_type = self._opened.content_type.encode("latin-1")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache"), *self._extra_headers],
            }
        )
        pump = asyncio.ensure_future(self._pump(send))
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        self._watch_sends(pump)
        try:
            await asyncio.wait((pump, watcher), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done() and self._client_done:
                # The client has its whole answer; only the upstream's tail remains (or its last write).
                await asyncio.wait((pump,))
            if self._stalled:
                await asyncio.wait((pump,))  # cancelled by the watchdog
                await self._cut_off(scope)
            elif pump.done():
                pump.result()  # re-raise bugs rather than hiding them
            else:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                trace.outcome = "client_disconnected"
                await self._name_a_stall(scope)
                self._opened.finish(ok=False)
        except BaseException:
            pump.cancel()
            if trace.outcome == "ok":
                trace.outcome = "client_disconnected"
            self._opened.finish(ok=False)
            raise
        finally:
            watcher.cancel()
            if self._watchdog is not None:
                self._watchdog.cancel()
            self._on_done(self._trace, self._scanner)

    def _watch_sends(self, pump: asyncio.Future[None]) -> None:
        """Cancel ``pump`` once one write to the client has waited the backend's idle timeout (the
        client stopped reading); checked once per idle timeout at most, not per write."""
        idle = self._opened.response.idle
        since = self._sending_since
        now = time.perf_counter()
        if since is not None and now - since >= idle:
            self._stalled = True
            pump.cancel()
            return
        delay = idle if since is None else since + idle - now
        self._watchdog = asyncio.get_running_loop().call_later(delay, self._watch_sends, pump)

    async def _send(self, send: Send, body: bytes, more_body: bool) -> None:
        self._sending_since = time.perf_counter()
        await send({"type": "http.response.body", "body": body, "more_body": more_body})
        self._sending_since = None

    async def _name_a_stall(self, scope: Scope) -> None:
        """Record a connection the server cut because its client took none of the stream for
        ``server.write_timeout`` as such (the server's own write timeout can be shorter than the
        backend's idle timeout this proxy's watchdog uses)."""
        written = scope.get(WRITTEN_KEY)  # the connection is lost: answers at once
        if callable(written) and await written() == STALLED:
            self._trace.error_type = STALLED
            self._trace.error_message = "the client took none of the stream for the server's write_timeout"

    async def _cut_off(self, scope: Scope) -> None:
        """End the stream of a client that stopped reading: the upstream is dropped, and so is the
        client's connection (closing it would wait for it to take the bytes it does not read)."""
        trace = self._trace
        trace.outcome, trace.error_type = "client_disconnected", "client_stalled"
        trace.error_message = f"the client read none of the stream for {self._opened.response.idle:g}s"
        self._opened.finish(ok=False)
        abort = scope.get(ABORT_KEY)
        if callable(abort):
            abort()
            await asyncio.sleep(0)  # the server learns of the lost connection: the answer is not "incomplete"

    async def _settle_upstream(self) -> None:
        """After ``[DONE]``: give the upstream a moment to end its body so its connection can be
        reused; one that keeps sending (keep-alives after [DONE]) is dropped rather than read on: the
        client has its answer, and the request's record and replica slot must not wait for it."""
        opened = self._opened
        deadline = time.perf_counter() + _SETTLE_SECONDS
        read = 0
        try:
            while (left := deadline - time.perf_counter()) > 0 and read <= _SETTLE_BYTES:
                chunk = await opened.response.next_chunk(timeout=left)
                if not chunk:
                    opened.finish(ok=True)
                    return
                read += len(chunk)
        except UpstreamFailure:
            pass
        opened.finish(ok=True, reuse=False)

    async def _pump(self, send: Send) -> None:
        opened, scanner, trace = self._opened, self._scanner, self._trace
        framer = SSEFramer()
        trace.ttft_ms = trace.elapsed_ms()
        chunk = opened.first_chunk
        try:
            while True:
                ready, failure = self._whole_events(framer, chunk)
                if ready and self._rewrite is not None:
                    ready = self._rewrite(ready)
                if failure is not None:
                    if ready:
                        await self._send(send, ready, True)
                    raise failure
                if scanner.upstream_error is not None:
                    # The upstream streamed an error object (the client's SDK raises it): the answer
                    # has failed, whatever may follow it.
                    self._client_done = True
                    await self._send(send, ready, False)
                    self._failed("upstream_error", f"the upstream streamed an error (code {scanner.upstream_error})")
                    opened.finish(ok=False, failure=UpstreamFailure("status", "error event", status=500))
                    return
                if scanner.saw_done:
                    # [DONE] is terminal: finish the client's response now instead of waiting for the
                    # upstream to close (some servers keep the stream open after it).
                    self._client_done = True
                    await self._send(send, ready, False)
                    await self._settle_upstream()
                    return
                if ready:
                    await self._send(send, ready, True)
                chunk = await opened.response.next_chunk()
                if not chunk:
                    break
        except UpstreamFailure as failure:
            failure_log.note(failure, backend=opened.target.backend.name, replica=opened.replica.base_url,
                             model=opened.target.name, phase="stream")
            self._failed(failure.kind, failure.message)
            opened.finish(ok=False, failure=failure)
            event = error_event(f"upstream stream failed: {failure.message}", "upstream_error", failure.kind)
            await self._send(send, event, False)
            return
        except OSError:
            # The client's socket went away under us (uvicorn raises on send after a disconnect).
            trace.outcome = "client_disconnected"
            opened.finish(ok=False)
            return
        rest = framer.rest()
        if (event_data(rest) or b"").strip() == b"[DONE]":
            # "data: [DONE]" as the body's last line, without the blank line after it: the answer is
            # whole (an SSE reader drops an unterminated event at the end anyway).
            scanner.saw_done = True
            opened.finish(ok=True)
            if self._rewrite is not None:
                # A rewriter may hold events until [DONE] (a workflow's finish chunk, which gets its
                # extension then): it reads whole events only, so this one gets its blank line.
                rest = self._rewrite(rest.rstrip(b"\r\n") + b"\n\n")
            await self._send(send, rest, False)
            return
        # The body ended without [DONE] (an event cut short is dropped, never half-sent): the answer was
        # cut short upstream, or never began (a stream of keep-alives only).
        self._failed("truncated", "upstream stream ended without [DONE]")
        opened.finish(ok=False, failure=UpstreamFailure("reset", "stream ended without [DONE]"))
        event = error_event("upstream stream ended without [DONE]", "upstream_error", "truncated")
        await self._send(send, event, False)

    def _whole_events(self, framer: SSEFramer, chunk: bytes) -> tuple[bytes, UpstreamFailure | None]:
        """The bytes of the whole events ``chunk`` completes, up to ``[DONE]`` or an upstream error
        event (included), and the failure that stops the stream there (an event that is not JSON,
        or one that will not end), if any."""
        scanner = self._scanner
        try:
            events = framer.feed(chunk)
        except EventTooLarge as exc:
            return b"", UpstreamFailure("malformed", str(exc))
        taken = 0
        for event in events:
            scanner.scan(event)
            if scanner.malformed:
                ready = b"".join(events[:taken])
                return ready, UpstreamFailure("malformed", "the upstream sent an event that is not JSON")
            taken += 1
            if scanner.saw_done or scanner.upstream_error is not None:
                break
        return (events[0] if taken == 1 else b"".join(events[:taken])), None

    def _failed(self, error_type: str, message: str) -> None:
        trace = self._trace
        trace.outcome = "stream_error"
        trace.error_type = error_type
        trace.error_message = message


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message: dict[str, Any] = dict(await receive())
        if message["type"] == "http.disconnect":
            return
