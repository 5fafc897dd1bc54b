"""The SSE framer cuts any split of an upstream stream into the same whole events, bytes untouched.

Streams with LF line endings (every OpenAI-compatible server) take a ``find``-based fast path; CR and
CRLF streams, and anything held back across reads, the general one. Both must cut alike.
"""

from __future__ import annotations

import random

from gateway.sse_frames import SSEFramer, event_data

PIECES = [b"data: ", b"{}", b"x", b"\n", b"\n\n", b": ping", b"data:", b"[DONE]", b"\r", b"\r\n"]


def _cut_split(data: bytes, cuts: list[int]) -> tuple[list[bytes], bytes]:
    framer, events, previous = SSEFramer(), [], 0
    for cut in [*cuts, len(data)]:
        events += framer.feed(data[previous:cut])
        previous = cut
    return events, framer.rest()


def _lf_events(data: bytes) -> tuple[list[bytes], bytes]:
    """The SSE specification's events of an LF-only stream: each ends at the next blank line."""
    events, begin = [], 0
    while (end := data.find(b"\n\n", begin)) >= 0:
        events.append(data[begin:end + 2])
        begin = end + 2
    return events, data[begin:]


def test_any_split_of_an_lf_stream_gives_the_specifications_events() -> None:
    rng = random.Random(7)
    lf_pieces = [piece for piece in PIECES if b"\r" not in piece]
    for _ in range(1000):
        data = b"".join(rng.choice(lf_pieces) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 6))))
        assert _cut_split(data, cuts) == _lf_events(data), (data, cuts)
        # One byte at a time: every read but an event's first goes through the general path.
        assert _cut_split(data, list(range(1, len(data)))) == _lf_events(data), data


def test_every_byte_arrives_once_in_order_and_each_event_has_its_data() -> None:
    rng = random.Random(11)
    for _ in range(1000):
        data = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 6))))
        events, rest = _cut_split(data, cuts)
        assert b"".join(events) + rest == data


def test_the_common_event_shape_reads_its_data() -> None:
    assert event_data(b'data: {"a": 1}\n\n') == b'{"a": 1}'
    assert event_data(b"data: a\r\n\r\n") == b"a"
    assert event_data(b"data: a\rdata: b\n\n") == b"a\nb"  # a bare CR ends a line too
    assert event_data(b": keep-alive\n\n") is None
    assert event_data(b"data: a\ndata: b\n\n") == b"a\nb"
