"""HTTP/1.1 pipelining: requests written back to back, before any answer is read, are all answered, in order.

Written on raw sockets against a real gateway process. The client reads until the gateway closes and
only then splits the bytes into answers: reading each answer with a fresh ``http.client.HTTPResponse``
on the socket loses the answers its buffered reader took in with the previous one (1 in 3 runs here),
which looks like a gateway dropping answers.
"""

from __future__ import annotations

import http.client
import io
import socket
import time
import uuid
from collections.abc import Iterator

import orjson
import pytest

from gateway.http_protocol import MAX_HEAD_BYTES, MAX_PIPELINED
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

WAIT = 20.0  # a socket timeout far over every answer here: hitting it means the gateway never closed
CLOSE = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "server": {"header_timeout": 5, "body_timeout": 10},
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [
                {"name": "fake-ok", "upstream_name": "ok"},
                {"name": "fake-slow", "upstream_name": "slow:0.3"},
                {"name": "fake-drip", "upstream_name": "slow-drip"},
            ],
        }],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-pipelining")).start()
    yield proc
    proc.terminate()


class _Bytes(io.BytesIO):
    def close(self) -> None:  # http.client closes its file after each answer: the next one is still in it
        pass


class _Received:
    """What the gateway wrote on a connection, as a socket ``http.client`` can read answer after answer from."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._file = _Bytes(data)

    def makefile(self, mode: str) -> io.BytesIO:
        return self._file

    def answers(self) -> list[tuple[http.client.HTTPResponse, bytes]]:
        answers = []
        while self._file.tell() < len(self.data):
            response = http.client.HTTPResponse(self)  # type: ignore[arg-type]
            response.begin()
            answers.append((response, response.read()))
        return answers


def _chat(model: str = "fake-ok", stream: bool = False) -> bytes:
    body = orjson.dumps({"model": model, "stream": stream, "user": uuid.uuid4().hex,
                         "messages": [{"role": "user", "content": "hi"}]})
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _exchange(gateway: GatewayProcess, *writes: bytes) -> list[tuple[http.client.HTTPResponse, bytes]]:
    """Send ``writes`` (each one socket write, a moment apart), read until the gateway closes, split the answers."""
    data = b""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, write in enumerate(writes):
            if i:
                time.sleep(0.02)  # a separate socket read on the gateway's side
            sock.sendall(write)
        while chunk := sock.recv(65536):  # a socket timeout here: the connection was never closed
            data += chunk
    return _Received(data).answers()


def _assert_chats_then_health(answers: list[tuple[http.client.HTTPResponse, bytes]], chats: int) -> None:
    assert [response.status for response, _ in answers] == [200] * (chats + 1)
    for response, body in answers[:chats]:
        assert response.getheader("x-pointsman-model") == "fake-ok"
        assert b"Hello from the fake upstream" in body or b'"Hello"' in body
    assert orjson.loads(answers[-1][1]) == {"status": "ok"}
    assert answers[-1][0].getheader("connection") == "close"


@pytest.mark.parametrize("stream", [False, True])
def test_pipelined_requests_are_all_answered_before_the_close(gateway: GatewayProcess, stream: bool) -> None:
    for _ in range(20):
        requests = b"".join(_chat(stream=stream) for _ in range(3)) + CLOSE
        _assert_chats_then_health(_exchange(gateway, requests), chats=3)


def test_a_pipelined_body_in_two_writes_is_answered(gateway: GatewayProcess) -> None:
    first, second = _chat(), _chat()
    for cut in (len(first) - 10, len(first) + 30, len(first) + len(second) - 5):
        requests = first + second + _chat() + CLOSE
        _assert_chats_then_health(_exchange(gateway, requests[:cut], requests[cut:]), chats=3)


def test_a_malformed_request_behind_pipelined_ones_is_400_after_their_answers(gateway: GatewayProcess) -> None:
    # The connection was closed at once, with no answer at all: the upstream was called for nothing.
    answers = _exchange(gateway, _chat("fake-slow") + _chat() + b"NOT HTTP\r\n\r\n")
    assert [response.status for response, _ in answers] == [200, 200, 400]
    assert answers[0][0].getheader("x-pointsman-model") == "fake-slow"
    assert answers[-1][0].getheader("connection") == "close"


def test_an_oversized_head_behind_a_stream_is_431_after_the_stream(gateway: GatewayProcess) -> None:
    # The stream being written was cut off (the connection closed), and no 431 said why.
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n"
    answers = _exchange(gateway, _chat("fake-drip", stream=True) + big)
    assert [response.status for response, _ in answers] == [200, 431]
    assert answers[0][1].rstrip().endswith(b"data: [DONE]")
    assert orjson.loads(answers[1][1])["error"]["code"] == "request_header_fields_too_large"


def test_more_than_max_pipelined_are_answered_up_to_the_limit_then_closed(gateway: GatewayProcess) -> None:
    # The connection was closed as the limit was passed: the requests within it got no answer either.
    sent = MAX_PIPELINED + 4
    answers = _exchange(gateway, b"".join(_chat() for _ in range(sent)))
    assert len(answers) >= MAX_PIPELINED + 1  # one being answered and the queued ones
    assert [response.status for response, _ in answers] == [200] * len(answers)
    if len(answers) < sent:  # the limit was passed (one socket read held them all): the last one says so
        assert answers[-1][0].getheader("connection") == "close"
