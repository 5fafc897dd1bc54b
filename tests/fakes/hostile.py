"""A hostile upstream for fault tests: raw bytes on a loopback socket, chosen per request's model.

The other fakes are well-behaved HTTP servers (uvicorn frames every response correctly). This one
writes exactly the bytes a script gives it, with the TCP writes split where the script splits them,
so a test can send what a broken or malicious upstream would: an SSE event cut across writes,
CRLF or bare-CR line endings, headers that lie about the body, a 401 that names the gateway's key,
an endless stream. Each script is an async function of ``(writer, body)``; the server closes the
connection when it returns (every answer is ``Connection: close``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Self

import orjson

from tests.fakes.upstream import free_port

Script = Callable[[asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]


def head(status: int = 200, content_type: str = "text/event-stream", extra: bytes = b"",
         length: int | None = None) -> bytes:
    """A raw HTTP/1.1 status line and headers (no body); ``length`` adds a Content-Length."""
    lines = [f"HTTP/1.1 {status} X".encode(), b"Content-Type: " + content_type.encode("utf-8"), b"Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}".encode())
    return b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n"


def chunk_event(content: str, finish: str | None = None) -> bytes:
    """One chat.completion.chunk SSE event (``\\n\\n`` terminated) carrying ``content``."""
    payload = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1, "model": "h",
               "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def completion(text: str) -> bytes:
    """A whole chat.completion JSON body answering ``text``."""
    return orjson.dumps({
        "id": "chatcmpl-h", "object": "chat.completion", "created": 1, "model": "h",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    })


class HostileUpstream:
    """A loopback server whose every POST is answered by ``scripts[body["model"]]``."""

    def __init__(self, scripts: dict[str, Script]) -> None:
        self.port = free_port()
        self.scripts = scripts
        self.requests: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()  # connections whose script ended (or whose client left)
        self.headers: list[bytes] = []  # each request's raw header block, in arrival order
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("HostileUpstream did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        model = "?"
        try:
            header = await reader.readuntil(b"\r\n\r\n")
            self.headers.append(header)
            length = 0
            for line in header.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = orjson.loads(await reader.readexactly(length)) if length else {}
            model = str(body.get("model", "?"))
            self.requests[model] += 1
            await self.scripts[model](writer, body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed[model] += 1
            writer.close()


def answer(status: int, content_type: str, body: bytes, extra: bytes = b"") -> Script:
    """A script answering one whole response: ``status``, ``content_type`` (any characters), ``body``."""

    async def script(writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        writer.write(head(status, content_type, extra, len(body)) + body)

    return script
