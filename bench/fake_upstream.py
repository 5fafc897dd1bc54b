"""A fast fake OpenAI-compatible upstream for benchmarks.

Answers ``POST /v1/chat/completions`` (and ``/v1/completions``) with a fixed small JSON body, or an SSE
stream when the request body has ``"stream": true``, and ``GET /v1/models``. Everything else is 404.

Two implementations, chosen with ``--impl``:

* ``protocol`` (default): a raw asyncio ``Protocol`` speaking HTTP/1.1 with keep-alive. Responses are
  pre-encoded bytes, so the per-request cost is parsing the head and one ``transport.write``.
* ``uvicorn``: uvicorn + httptools with a raw ASGI app (no framework), for comparison.

The fake must never be the bottleneck of a proxy benchmark, so the faster one is the default
(measured in ``bench/README.md``). uvloop is used when it is installed.

Run: ``python bench/fake_upstream.py --port 9001 [--impl protocol|uvicorn] [--delay-ms 0]``.
``--record-dir DIR`` (protocol only) saves every request body of at least ``--record-min-bytes`` to
``DIR`` (``bench/event_loop.py`` checks what reached the upstream).
It prints ``READY <port>`` on stdout once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

MODEL = "fake-model"
CREATED = 1_700_000_000


def completion_body(model: str = MODEL) -> bytes:
    """The fixed non-streaming ``chat.completion`` JSON body."""
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the fake upstream."},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        },
        separators=(",", ":"),
    ).encode()


def stream_events(model: str = MODEL) -> list[bytes]:
    """The SSE events of a streamed answer: role, two content deltas, finish with usage, ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None, usage: dict[str, int] | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if usage is not None:
            payload["usage"] = usage
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    return [
        chunk({"role": "assistant", "content": ""}, None),
        chunk({"content": "Hello from "}, None),
        chunk({"content": "the fake upstream."}, None),
        chunk({}, "stop", {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}),
        b"data: [DONE]\n\n",
    ]


def models_body() -> bytes:
    """The ``GET /v1/models`` list body."""
    return json.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "created": CREATED, "owned_by": "fake"}]},
        separators=(",", ":"),
    ).encode()


def _is_stream(body: bytes) -> bool:
    # A substring test instead of json.loads: the fake must stay cheap, and benchmark clients
    # send either compact or default-spaced JSON.
    return b'"stream":true' in body or b'"stream": true' in body


# --------------------------------------------------------------------------------------------------
# Raw asyncio Protocol implementation
# --------------------------------------------------------------------------------------------------


def _plain(status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: keep-alive\r\n\r\n"
        + body
    )


def _chunked_stream() -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
    )
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in stream_events())
    return head + chunks + b"0\r\n\r\n"


RESP_COMPLETION = _plain(b"200 OK", completion_body())
RESP_STREAM = _chunked_stream()
RESP_MODELS = _plain(b"200 OK", models_body())
RESP_HEALTH = _plain(b"200 OK", b'{"status":"ok"}')
RESP_404 = _plain(b"404 Not Found", b'{"error":{"message":"not found","type":"not_found","code":404}}')
RESP_400 = _plain(b"400 Bad Request", b'{"error":{"message":"bad request","type":"bad_request"}}')


class FakeUpstreamProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, Content-Length or chunked request bodies, and pipelining-safe order."""

    #: Where bodies of at least ``record_min_bytes`` are saved (None: nowhere).
    record_dir: Path | None = None
    record_min_bytes = 1 << 20
    _recorded = itertools.count()

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.buf = b""
        self.pending: list[bytes] = []
        self.pending_size = 0
        self.pending_need = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, so no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.pending:  # the rest of a large body: append without re-copying what came before
            self.pending.append(data)
            self.pending_size += len(data)
            if self.pending_size < self.pending_need:
                return
            data, self.pending = b"".join(self.pending), []
        self.buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = self.buf[:head_end]
            body_start = head_end + 4
            try:
                parsed = self._parse(head, body_start)
            except ValueError:
                out.append(RESP_400)
                self.buf = b""
                break
            if parsed is None:
                need = self._declared_end(head, body_start)
                if need is not None and need - len(self.buf) > 1 << 16:
                    # A large body still arriving: collect its chunks in a list until it is complete.
                    self.pending, self.pending_size, self.pending_need = [self.buf], len(self.buf), need
                    self.buf = b""
                break  # body not complete yet
            body, consumed = parsed
            self.buf = self.buf[consumed:]
            if self.record_dir is not None and len(body) >= self.record_min_bytes:
                # Written by a thread, so the fake keeps answering everyone else meanwhile.
                path = self.record_dir / f"body-{os.getpid()}-{next(self._recorded)}.json"
                asyncio.get_running_loop().run_in_executor(None, path.write_bytes, body)
            out.append(self._route(head, body))
        if out and self.transport is not None:
            payload = b"".join(out)
            if self.delay > 0:
                asyncio.get_running_loop().call_later(self.delay, self._write, payload)
            else:
                self.transport.write(payload)

    def _write(self, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(payload)

    @staticmethod
    def _declared_end(head: bytes, body_start: int) -> int | None:
        lower = head.lower()
        idx = lower.find(b"\r\ncontent-length:")
        if idx < 0:
            return None
        end = lower.find(b"\r\n", idx + 2)
        return body_start + int(head[idx + 17 : end if end >= 0 else len(head)].strip())

    def _parse(self, head: bytes, body_start: int) -> tuple[bytes, int] | None:
        """Return (body, bytes consumed) or None when incomplete; ValueError when malformed."""
        lower = head.lower()
        idx = lower.find(b"\r\ncontent-length:")
        if idx >= 0:
            end = lower.find(b"\r\n", idx + 2)
            raw = head[idx + 17 : end if end >= 0 else len(head)]
            length = int(raw.strip())
            if len(self.buf) < body_start + length:
                return None
            return self.buf[body_start : body_start + length], body_start + length
        if b"\r\ntransfer-encoding: chunked" in lower or b"\r\ntransfer-encoding:chunked" in lower:
            return self._parse_chunked(body_start)
        return b"", body_start

    def _parse_chunked(self, pos: int) -> tuple[bytes, int] | None:
        parts: list[bytes] = []
        while True:
            line_end = self.buf.find(b"\r\n", pos)
            if line_end < 0:
                return None
            size = int(self.buf[pos:line_end].split(b";")[0], 16)
            pos = line_end + 2
            if size == 0:
                trailer_end = self.buf.find(b"\r\n", pos)
                if trailer_end < 0:
                    return None
                return b"".join(parts), trailer_end + 2
            if len(self.buf) < pos + size + 2:
                return None
            parts.append(self.buf[pos : pos + size])
            pos += size + 2

    @staticmethod
    def _route(head: bytes, body: bytes) -> bytes:
        line_end = head.find(b"\r\n")
        request_line = head if line_end < 0 else head[:line_end]
        parts = request_line.split(b" ")
        if len(parts) < 2:
            return RESP_400
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            return RESP_STREAM if _is_stream(body) else RESP_COMPLETION
        if method == b"GET" and path == b"/v1/models":
            return RESP_MODELS
        if method == b"GET" and path in (b"/health", b"/v1/health"):
            return RESP_HEALTH
        return RESP_404


async def serve_protocol(host: str, port: int, delay: float) -> None:
    """Serve with the raw Protocol until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeUpstreamProtocol(delay), host, port, backlog=1024)
    print(f"READY {port}", flush=True)
    async with server:
        await _wait_for_signal()


# --------------------------------------------------------------------------------------------------
# uvicorn + raw ASGI implementation (for comparison)
# --------------------------------------------------------------------------------------------------

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def make_asgi_app(delay: float) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A framework-free ASGI app with the same routes as the Protocol server."""
    completion, models, events = completion_body(), models_body(), stream_events()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if delay > 0:
            await asyncio.sleep(delay)
        method, path = scope["method"], scope["path"]
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            if _is_stream(body):
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                for event in events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            await _send_json(send, 200, completion)
        elif method == "GET" and path == "/v1/models":
            await _send_json(send, 200, models)
        else:
            await _send_json(send, 404, b'{"error":{"message":"not found","type":"not_found","code":404}}')

    return app


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


def serve_uvicorn(host: str, port: int, delay: float) -> None:
    """Serve with uvicorn + httptools (blocking)."""
    import uvicorn

    config = uvicorn.Config(
        make_asgi_app(delay),
        host=host,
        port=port,
        http="httptools",
        loop="auto",
        log_level="warning",
        access_log=False,
        lifespan="on",
        backlog=1024,
    )
    server = uvicorn.Server(config)

    async def run() -> None:
        # uvicorn installs its own SIGINT/SIGTERM handlers inside serve().
        task = asyncio.create_task(server.serve())
        # uvicorn exposes readiness only as a flag, so poll it.
        while not server.started and not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if server.started:
            print(f"READY {port}", flush=True)
        await task

    _run(run())


# --------------------------------------------------------------------------------------------------


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _run(coro: Awaitable[None]) -> None:
    try:
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python bench/fake_upstream.py --port P``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--impl", choices=("protocol", "uvicorn"), default="protocol")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="fixed delay before every answer")
    parser.add_argument("--record-dir", type=Path, default=None, help="save large request bodies here")
    parser.add_argument("--record-min-bytes", type=int, default=1 << 20, help="what counts as large")
    args = parser.parse_args(argv)
    if args.record_dir is not None:
        args.record_dir.mkdir(parents=True, exist_ok=True)
        FakeUpstreamProtocol.record_dir = args.record_dir
        FakeUpstreamProtocol.record_min_bytes = args.record_min_bytes
    delay = args.delay_ms / 1000.0
    if args.impl == "uvicorn":
        serve_uvicorn(args.host, args.port, delay)
    else:
        _run(serve_protocol(args.host, args.port, delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
