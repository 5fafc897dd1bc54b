"""Chunked request bodies (``Transfer-Encoding: chunked``, no Content-Length) and the body size limit.

Without a Content-Length the gateway can only enforce ``server.max_body_bytes`` while it reads, so
these requests are written byte for byte on a raw socket: exactly the chunked framing given here,
and never a Content-Length header a client library might add.
"""

from __future__ import annotations

import http.client
import socket
import time
import uuid
from collections.abc import Iterator

import orjson
import pytest

from tests.fakes.upstream import WORDS, FakeUpstream
from tests.gatewayproc import GatewayProcess

MAX_BODY = 4096
BODY_TIMEOUT = 1.5  # seconds a body may take to arrive
PIECE = 1000  # bytes per chunk: each chunk is under the limit, only their sum can exceed it


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "server": {"max_body_bytes": MAX_BODY, "body_timeout": BODY_TIMEOUT},
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [{"name": "fake-ok", "upstream_name": "ok"}],
        }],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-chunked")).start()
    yield proc
    proc.terminate()


def _body(user: str, size: int) -> bytes:
    """A valid chat request for ``fake-ok`` of exactly ``size`` bytes (padded in the message)."""
    empty = orjson.dumps({"model": "fake-ok", "user": user, "messages": [{"role": "user", "content": ""}]})
    assert size >= len(empty)
    body = orjson.dumps({"model": "fake-ok", "user": user,
                         "messages": [{"role": "user", "content": "x" * (size - len(empty))}]})
    assert len(body) == size
    return body


def _chunked(body: bytes, *, finish: bool = True) -> bytes:
    """``body`` in chunked framing, ``PIECE`` bytes a chunk; ``finish=False`` leaves out the last chunk."""
    framed = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i:i + PIECE]), body[i:i + PIECE]) for i in range(0, len(body), PIECE)
    )
    return framed + (b"0\r\n\r\n" if finish else b"")


def _post_chunked(gateway: GatewayProcess, framed_body: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send a chat request with ``Transfer-Encoding: chunked`` and no Content-Length on a raw socket."""
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{gateway.port}\r\n"
        "Content-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(head + framed_body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def _assert_too_large(status: int, body: bytes) -> None:
    assert status == 413, body
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large", error
    assert str(MAX_BODY) in error["message"], error


def test_chunked_body_over_limit_is_413(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    user = uuid.uuid4().hex
    body = _body(user, 3 * MAX_BODY)
    status, headers, answer = _post_chunked(gateway, _chunked(body))
    _assert_too_large(status, answer)
    record = gateway.decision(headers["x-pointsman-request-id"])
    assert record["status"] == 413 and record["outcome"] == "error"
    assert record["error_type"] == "request_too_large" and record["attempts"] == 0
    assert upstream.state.requests[("ok", user)] == 0, "an oversized body must never reach the upstream"


def test_chunked_body_one_byte_over_limit_is_413(gateway: GatewayProcess) -> None:
    status, _, answer = _post_chunked(gateway, _chunked(_body(uuid.uuid4().hex, MAX_BODY + 1)))
    _assert_too_large(status, answer)


def test_endless_chunked_body_is_refused_once_over_limit(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    # The terminating 0-length chunk never comes: the gateway must answer as soon as the limit is
    # crossed instead of waiting for (and buffering) a body that may never end.
    user = uuid.uuid4().hex
    status, _, answer = _post_chunked(gateway, _chunked(_body(user, 2 * MAX_BODY), finish=False))
    _assert_too_large(status, answer)
    assert upstream.state.requests[("ok", user)] == 0


def test_chunked_body_under_limit_is_served(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    user = uuid.uuid4().hex
    body = _body(user, MAX_BODY)  # exactly at the limit, in five chunks
    status, headers, answer = _post_chunked(gateway, _chunked(body))
    assert status == 200, answer
    assert orjson.loads(answer)["choices"][0]["message"]["content"] == "".join(WORDS)
    assert upstream.state.requests[("ok", user)] == 1
    forwarded = next(b for b in upstream.state.bodies if b.get("user") == user)
    assert forwarded["messages"] == orjson.loads(body)["messages"], "the reassembled body must reach the upstream"
    assert gateway.decision(headers["x-pointsman-request-id"])["status"] == 200


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_body_that_stops_arriving_is_a_408_not_a_held_connection(gateway: GatewayProcess, framing: str) -> None:
    """A client that sends headers and part of a body, then nothing (slowloris), gets a 408 once
    ``server.body_timeout`` has passed, and the decision record says so."""
    body = _body(uuid.uuid4().hex, 2000)
    length = "Transfer-Encoding: chunked\r\n" if framing == "chunked" else f"Content-Length: {len(body)}\r\n"
    part = _chunked(body, finish=False)[:600] if framing == "chunked" else body[:600]
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{length}\r\n")
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=BODY_TIMEOUT * 10) as sock:
        sock.sendall(head.encode() + part)
        response = http.client.HTTPResponse(sock)
        response.begin()  # arrives after the timeout, while the body is still incomplete
        payload = orjson.loads(response.read())
    assert response.status == 408, payload
    assert payload["error"]["code"] == "request_timeout" and str(BODY_TIMEOUT) in payload["error"]["message"]
    request_id = response.getheader("x-pointsman-request-id")
    assert request_id and gateway.decision(request_id)["status"] == 408


def test_a_slow_upload_is_not_counted_as_gateway_overhead(gateway: GatewayProcess) -> None:
    # x-pointsman-overhead-ms is the gateway's own time: a client that takes a second to send its body
    # once showed up as a second of gateway overhead (and in the overhead histogram).
    body = _body("slow-upload-" + uuid.uuid4().hex, 600)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{gateway.port}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head + body[:100])
        time.sleep(1.0)  # inside body_timeout (1.5 s): the request is served
        sock.sendall(body[100:])
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.read()
        assert response.status == 200
        overhead_ms = float(response.getheader("x-pointsman-overhead-ms") or "nan")
    assert 0 <= overhead_ms < 900, overhead_ms
