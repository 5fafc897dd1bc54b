"""Cutting an upstream's SSE byte stream at event boundaries, bytes untouched.

The gateway forwards an upstream's stream byte for byte, but only whole events: an event's bytes
leave once its terminating blank line has arrived. An upstream that breaks (or stalls, or sends
garbage) in the middle of an event then leaves nothing half-sent, so the error event the gateway
appends is an event of its own; glued onto half an event, it made one line the openai SDK failed to
parse as JSON instead of raising an ``APIError``. Real upstreams end every write at an event
boundary, so holding back a partial event costs them no latency.

Any of the line endings the SSE specification allows (LF, CRLF, bare CR) ends a line; two in a row
end an event. An event may not grow past :data:`MAX_EVENT_BYTES`: the held bytes are bounded, and
the search for a boundary only reads bytes it has not read before.
"""

from __future__ import annotations

import re

#: The largest SSE event the gateway accepts from an upstream (16 MiB: far beyond any chunk of a
#: chat or completion stream; logprob-laden chunks are kilobytes).
MAX_EVENT_BYTES = 16 << 20

# A line ending is CRLF, or CR not followed by LF, or LF; an event ends with two of them in a row.
# (A CR that is the last byte read may be half of a CRLF: its LF then starts the next event as an
# empty line, which every SSE reader skips.)
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LOOKBACK = 3  # a terminator (at most 4 bytes) may straddle two reads


class EventTooLarge(Exception):
    """An upstream event grew past :data:`MAX_EVENT_BYTES` without ending."""


class SSEFramer:
    """Splits arbitrary reads of an SSE stream into whole events (each with its terminator)."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._pending = bytearray()
        self._max = max_event_bytes

    @property
    def pending(self) -> int:
        """Bytes of an incomplete event held back (never forwarded unless it completes)."""
        return len(self._pending)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes, each exactly as received; raises :class:`EventTooLarge`."""
        if not self._pending and b"\r" not in chunk:
            return self._feed_lf(chunk)
        buffer = self._pending
        start = max(len(buffer) - _LOOKBACK, 0)
        buffer += chunk
        events: list[bytes] = []
        begin = 0
        for match in _EVENT_END.finditer(buffer, start):
            if match.start() < begin:  # overlaps the terminator just taken
                continue
            events.append(bytes(buffer[begin:match.end()]))
            begin = match.end()
        if begin:
            del buffer[:begin]
        if len(buffer) > self._max:
            raise EventTooLarge(f"the upstream sent an SSE event over {self._max} bytes")
        return events

    def _feed_lf(self, chunk: bytes) -> list[bytes]:
        """:meth:`feed` for the common case, nothing held back and LF line endings only (every
        OpenAI-compatible server writes whole ``data: ...\\n\\n`` events): plain ``find`` instead of the
        regular expression, a few times faster per event on the streaming hot path."""
        events: list[bytes] = []
        begin = 0
        while (end := chunk.find(b"\n\n", begin)) >= 0:
            events.append(chunk[begin:end + 2] if begin or end + 2 < len(chunk) else chunk)
            begin = end + 2
        if begin < len(chunk):
            self._pending += chunk[begin:]
            if len(self._pending) > self._max:
                raise EventTooLarge(f"the upstream sent an SSE event over {self._max} bytes")
        return events

    def rest(self) -> bytes:
        """The bytes of the incomplete event held back (taken: the framer is empty afterwards)."""
        rest = bytes(self._pending)
        self._pending.clear()
        return rest


def event_data(event: bytes) -> bytes | None:
    """The data of one whole event (its ``data:`` lines joined by LF, as an SSE reader joins them),
    or None for an event with no data (a comment, a keep-alive)."""
    if event.startswith(b"data: ") and event.find(b"\n") == len(event) - 2 and b"\r" not in event:
        return event[6:-2]  # the common case: one "data: ...\n\n" line
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    if not data:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)
