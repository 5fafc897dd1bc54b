"""A hostile upstream's streams, through a real gateway, read by the official SDK.

The upstream writes raw bytes (``tests.fakes.hostile``): events cut across writes, CR or CRLF line
endings, garbage data, an error object mid-stream, an event that never ends, keep-alives after
``[DONE]``. Whatever it sends, the client reads either the answer or an ``openai.APIError`` (never a
JSON decoding error from half an event), and the decision record says what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from openai import OpenAI

from gateway.sse_frames import MAX_EVENT_BYTES
from tests.fakes.hostile import HostileUpstream, Script, chunk_event, head
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

DONE = b"data: [DONE]\n\n"
MESSAGES = [{"role": "user", "content": "hello"}]


def _writes(*parts: bytes) -> Script:
    """A stream written in exactly these pieces (each its own TCP write, a pause between)."""

    async def script(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        writer.write(head())
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.02)

    return script


async def _keepalives_after_done(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    writer.write(head() + chunk_event("whole", "stop") + DONE)
    while True:  # until the gateway drops the connection
        writer.write(b": ping\n\n")
        await writer.drain()
        await asyncio.sleep(0.02)


async def _endless_keepalives(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    writer.write(head() + chunk_event("a"))
    while True:  # never idle for long, never done: only the total timeout ends it
        writer.write(b": ping\n\n")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _endless_event(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    writer.write(head() + chunk_event("x") + b'data: {"x": "')
    for _ in range(MAX_EVENT_BYTES // (256 << 10) + 2):
        writer.write(b"a" * (256 << 10))
        await writer.drain()
    writer.write(b'"}\n\n' + DONE)


async def _flood(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    writer.write(head())
    event = chunk_event("x" * 1000)
    for _ in range(64 << 10):  # 64 MB: far more than the sockets between here and the client hold
        writer.write(event)
        await writer.drain()
    writer.write(DONE)


SCRIPTS: dict[str, Script] = {
    "split-crlf": _writes(
        chunk_event("Hel").replace(b"\n", b"\r\n")[:17], chunk_event("Hel").replace(b"\n", b"\r\n")[17:-1],
        b"\n: keep-alive\r\n\r\n", chunk_event("lo", "stop").replace(b"\n", b"\r"), DONE.replace(b"\n", b"\r\n"),
    ),
    "cut-mid-event": _writes(chunk_event("a"), chunk_event("b")[:25]),
    "not-json": _writes(chunk_event("a"), b"data: {not json\n\n", chunk_event("b", "stop"), DONE),
    "error-object": _writes(
        chunk_event("a"), b'data: {"error": {"message": "engine died", "type": "server_error", "code": 500}}\n\n', DONE
    ),
    "keepalives-only": _writes(b": keep-alive\n\n", b": ping\n\n"),
    "done-unterminated": _writes(chunk_event("a", "stop"), b"data: [DONE]\n"),
    "keepalives-after-done": _keepalives_after_done,
    "endless-event": _endless_event,
    "endless-keepalives": _endless_keepalives,
    "flood": _flood,
}
SHORT = {"endless-keepalives", "flood"}  # served by a backend with a total timeout of 1.5 s (idle 1 s)


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileUpstream]:
    upstream = HostileUpstream(SCRIPTS).start()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def gateway(hostile: HostileUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # Deadlines far beyond what any test waits for: only the gateway's handling can end these streams.
    timeouts = {"connect": 5.0, "first_byte": 30.0, "total": 120.0, "idle": 30.0}
    config = {
        "backends": [{
            "name": "hostile", "base_url": hostile.base_url, "timeouts": timeouts, "health": {"enabled": False},
            "models": [{"name": name, "upstream_name": name} for name in SCRIPTS if name not in SHORT],
        }, {
            "name": "short", "base_url": hostile.base_url, "health": {"enabled": False},
            "timeouts": {"connect": 5.0, "first_byte": 30.0, "total": 1.5, "idle": 1.0},
            "models": [{"name": name, "upstream_name": name} for name in SHORT],
        }],
        "retry": {"attempts": 1},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("hostile")).start()
    yield proc
    proc.terminate()


@pytest.fixture
def client(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0, timeout=60)


def _read(client: OpenAI, model: str) -> tuple[str, list[str], BaseException | None]:
    """(request id, the text deltas received, the error the SDK raised while reading, if any)."""
    with client.chat.completions.with_streaming_response.create(model=model, messages=MESSAGES, stream=True) as r:
        request_id = r.headers["x-pointsman-request-id"]
        texts: list[str] = []
        try:
            for chunk in r.parse():
                texts.extend(c.delta.content or "" for c in chunk.choices)
        except Exception as exc:  # the test asserts which kind it is
            return request_id, texts, exc
    return request_id, texts, None


def test_events_split_across_writes_with_cr_and_crlf_endings_arrive_whole(
    client: OpenAI, gateway: GatewayProcess
) -> None:
    request_id, texts, error = _read(client, "split-crlf")
    assert error is None and "".join(texts) == "Hello"
    assert gateway.decision(request_id)["outcome"] == "ok"


def test_a_stream_cut_mid_event_ends_with_an_api_error_not_a_json_error(
    client: OpenAI, gateway: GatewayProcess
) -> None:
    # The half event was glued to the gateway's error event: the SDK raised json.JSONDecodeError.
    request_id, texts, error = _read(client, "cut-mid-event")
    assert texts == ["a"]
    assert isinstance(error, openai.APIError) and error.body["code"] == "truncated", repr(error)  # type: ignore[index]
    record = gateway.decision(request_id)
    assert record["outcome"] == "stream_error" and record["error_type"] == "truncated"


def test_an_event_that_is_not_json_ends_the_stream_with_an_api_error(client: OpenAI, gateway: GatewayProcess) -> None:
    request_id, texts, error = _read(client, "not-json")
    assert texts == ["a"]  # the good event before it was delivered, the garbage was not
    assert isinstance(error, openai.APIError) and "not JSON" in error.message, repr(error)
    record = gateway.decision(request_id)
    assert record["outcome"] == "stream_error" and record["error_type"] == "malformed"


def test_an_error_object_mid_stream_is_recorded_as_a_failed_answer(client: OpenAI, gateway: GatewayProcess) -> None:
    request_id, texts, error = _read(client, "error-object")
    assert texts == ["a"]
    assert isinstance(error, openai.APIError) and error.message == "engine died"  # the upstream's own event
    record = gateway.decision(request_id)
    assert record["outcome"] == "stream_error" and record["error_type"] == "upstream_error", record


def test_a_stream_of_keepalives_only_is_an_error_not_an_empty_answer(client: OpenAI, gateway: GatewayProcess) -> None:
    # Nothing but comments, then the end: no data arrived, so nothing was committed to the client (the
    # stream is held until its first data event) and the failure is an HTTP error (retried, where retries are
    # configured, and falling back).
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="keepalives-only", messages=MESSAGES, stream=True)
    assert info.value.status_code == 502
    assert "closed the stream before sending any data" in info.value.message
    record = gateway.decision(info.value.response.headers["x-pointsman-request-id"])
    assert (record["outcome"], record["status"]) == ("error", 502)


def test_done_as_the_last_line_without_a_blank_line_is_a_whole_answer(
    client: OpenAI, gateway: GatewayProcess
) -> None:
    request_id, texts, error = _read(client, "done-unterminated")
    assert error is None and texts == ["a"]
    assert gateway.decision(request_id)["outcome"] == "ok"


def test_an_upstream_that_keeps_sending_after_done_is_dropped(
    client: OpenAI, gateway: GatewayProcess, hostile: HostileUpstream
) -> None:
    # The gateway read on until the total timeout (120 s here), holding the replica slot and the record.
    request_id, texts, error = _read(client, "keepalives-after-done")
    assert error is None and texts == ["whole"]
    eventually(lambda: hostile.closed["keepalives-after-done"] == 1, "the upstream connection was dropped")
    assert gateway.decision(request_id)["outcome"] == "ok"


def test_an_event_that_never_ends_is_refused_at_the_size_limit(client: OpenAI, gateway: GatewayProcess) -> None:
    # It was buffered (and rescanned on every read) until the total timeout, then half of it went out.
    request_id, texts, error = _read(client, "endless-event")
    assert texts == ["x"]
    assert isinstance(error, openai.APIError) and f"over {MAX_EVENT_BYTES} bytes" in error.message, repr(error)
    assert gateway.decision(request_id)["error_type"] == "malformed"


def test_a_stream_cut_by_the_total_timeout_says_so_not_stalled(client: OpenAI, gateway: GatewayProcess) -> None:
    # Keep-alives every 50 ms: never idle for 1 s; the total timeout (1.5 s) is what ends it. Its last
    # wait was bounded by the total deadline but could be reported as "stalled for over 1s".
    request_id, texts, error = _read(client, "endless-keepalives")
    assert texts == ["a"] and isinstance(error, openai.APIError), repr(error)
    assert gateway.decision(request_id)["error_type"] == "total_timeout"


def test_a_client_that_stops_reading_a_stream_does_not_hold_it(
    gateway: GatewayProcess, hostile: HostileUpstream
) -> None:
    # A client that read the headers and then nothing: the gateway blocked on writing to it for ever (no
    # deadline runs while it waits for the client), holding the upstream connection, the replica's slot
    # (max_concurrency such clients shut a backend) and the request's record. It is cut off once it has
    # taken none of the stream for the backend's idle timeout, like an upstream that stalls.
    body = orjson.dumps({"model": "flood", "stream": True, "messages": MESSAGES})
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.settimeout(60)
        sock.connect(("127.0.0.1", gateway.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(1024)
        request_id = re.search(rb"x-pointsman-request-id: (psm-[0-9a-f]+)", received)
        assert request_id is not None, received
        # ... and reads no more.
        record = gateway.decision(request_id.group(1).decode(), timeout=60)
        assert record["outcome"] == "client_disconnected" and record["error_type"] == "client_stalled", record
        eventually(lambda: hostile.closed["flood"] == 1, "the upstream connection was dropped", timeout=30)
        with contextlib.suppress(ConnectionResetError):  # the connection is closed (reset: its bytes unread)
            while sock.recv(1 << 16):
                pass
