"""How an upstream's stream begins: read up to its first data event before the stream is committed.

A stream is committed (its ``200`` sent, no retry or fallback possible) once the gateway hands its
first bytes to the client. Some upstreams (OpenRouter and other aggregators, proxies in front of slow
models) first send SSE comments (``: PROCESSING``) to keep the connection open, and may then stream an
error object as their first event, when the model behind them failed. Committed at the first comment,
that failure reached the client as a broken stream, while a failure before any token is exactly
what a retry or a fallback model is for. So the stream is held back (within the backend's first-byte
deadline and :data:`MAX_HELD_BYTES`) until its first data event has arrived, and that event is read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sse_frames import SSEFramer, event_data
from gateway.upstream import UpstreamFailure, UpstreamResponse

#: Bytes held back waiting for the first data event; past this the stream is committed as it is.
MAX_HELD_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class StreamStart:
    """The bytes read so far and, when the first data event was an error object, that object."""

    held: bytes
    error: Mapping[str, Any] | None = None


async def read_stream_start(response: UpstreamResponse, first: bytes, deadline: float) -> StreamStart:
    """Read ``response`` on from its ``first`` bytes until a data event has arrived whole, the held bytes
    pass :data:`MAX_HELD_BYTES`, or ``deadline`` (``time.perf_counter()``) passes: the upstream is alive
    (it sends comments), so the stream then goes on as it is. Raises :class:`UpstreamFailure` when the
    upstream closes before any data."""
    framer = SSEFramer()
    held = first  # almost always the whole start: returned as it is, not copied
    events = framer.feed(first)
    while True:
        for event in events:
            data = event_data(event)
            if data is not None:
                return StreamStart(held, _error_object(data))
        remaining = deadline - time.perf_counter()
        if remaining <= 0 or len(held) > MAX_HELD_BYTES:
            return StreamStart(held)
        try:
            chunk = await response.next_chunk(timeout=remaining)
        except UpstreamFailure as failure:
            if failure.kind != "idle_timeout":
                raise
            return StreamStart(held)  # only comments until the deadline: the stream goes on
        if not chunk:
            raise UpstreamFailure("malformed", "upstream closed the stream before sending any data")
        held += chunk  # comments first (rare, and at most MAX_HELD_BYTES): a new bytes each time is fine
        events = framer.feed(chunk)


def _error_object(data: bytes) -> Mapping[str, Any] | None:
    """The error object a data event carries (``{"error": {...}}``), or None for any other event."""
    if not data.startswith(b"{") or b'"error"' not in data:
        return None  # every chunk of a working stream: no parse
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return error if isinstance(error, dict) else None


def error_status(error: Mapping[str, Any]) -> int:
    """The HTTP status an error object that began a stream stands for: its numeric ``code`` when it is
    one (OpenRouter streams the provider's), 400 for a request the upstream refused
    (``invalid_request_error``), else 502 (the upstream failed)."""
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    if isinstance(code, str) and code.isdigit() and 400 <= int(code) < 600:
        return int(code)
    return 400 if error.get("type") == "invalid_request_error" else 502
