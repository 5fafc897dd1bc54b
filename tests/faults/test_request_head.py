"""A hostile client's request head: its size, its header count, and how long it takes to arrive.

uvicorn's httptools protocol held a request line or a header value in memory for as long as the
client sent it, read a million headers, and kept a connection that sent a partial head (or nothing)
open for ever. These are written byte for byte on raw sockets, against a real gateway process.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import resource
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.http_protocol import MAX_HEAD_BYTES, MAX_HEADERS, MAX_PIPELINED
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

HEADER_TIMEOUT = 1.0
WAIT = 20.0  # a socket timeout far over every limit here: hitting it means the gateway never answered


def _config(upstream: FakeUpstream, **server: object) -> dict[str, object]:
    return {
        "server": {"header_timeout": HEADER_TIMEOUT, "body_timeout": 10, **server},
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [{"name": "fake-ok", "upstream_name": "ok"}, {"name": "fake-slow", "upstream_name": "slow:2"}],
        }],
    }


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(_config(upstream), tmp_path_factory.mktemp("gw-head")).start()
    yield proc
    proc.terminate()


def _connect(gateway: GatewayProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT)


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, response.read()


def _closed(sock: socket.socket) -> bool:
    """Whether the gateway closed ``sock`` (after whatever it answered) before :data:`WAIT` seconds."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def _chat(model: str = "fake-ok") -> bytes:
    body = orjson.dumps({"model": model, "user": uuid.uuid4().hex, "messages": [{"role": "user", "content": "hi"}]})
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _assert_431(status: int, body: bytes) -> None:
    assert status == 431, body
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] == "request_header_fields_too_large"


def _health(gateway: GatewayProcess) -> None:
    assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200


def test_a_header_over_the_head_limit_is_431_and_closed(gateway: GatewayProcess) -> None:
    # It was read whole (200 MB held ~300 MB and blocked the event loop for seconds), then answered.
    with _connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(64):  # 4 MB unless the gateway stops reading first
                sock.sendall(b"a" * (MAX_HEAD_BYTES + 1))
            sock.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while this was still sending: the answer is still there to read
        _assert_431(*_answer(sock))
    _health(gateway)


@pytest.mark.parametrize("split", [None, 12, 1000])
def test_a_url_over_the_head_limit_is_431(gateway: GatewayProcess, split: int | None) -> None:
    # However the socket reads fall: a read that began the request was not counted, so a request line
    # read in one or two reads reached httptools' own URL limit and got uvicorn's bare 400 (1 in 4).
    request = b"GET /health?" + b"q" * (4 * MAX_HEAD_BYTES) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(10):
        with _connect(gateway) as sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if split is None:
                    sock.sendall(request)
                else:
                    sock.sendall(request[:split])
                    time.sleep(0.01)
                    sock.sendall(request[split:])
            _assert_431(*_answer(sock))


def test_a_header_over_the_head_limit_in_one_read_is_431(gateway: GatewayProcess) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * (2 * MAX_HEAD_BYTES) + b"\r\n\r\n"
    for _ in range(10):
        with _connect(gateway) as sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(request)
            _assert_431(*_answer(sock))


def test_too_many_headers_is_431(gateway: GatewayProcess) -> None:
    # A million headers (10 MB) were read and answered 200.
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
    with _connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        _assert_431(*_answer(sock))


def test_headers_at_the_limits_are_served(gateway: GatewayProcess) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS - 2))  # with Host and X-Pad: MAX_HEADERS
    with _connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"X-Pad: " + b"p" * 32768 + b"\r\n\r\n")
        status, body = _answer(sock)
    assert status == 200, body


def test_a_head_that_stops_arriving_is_408_and_closed(gateway: GatewayProcess) -> None:
    # Slowloris: the connection was held for ever (uvicorn's keep-alive timeout only runs between requests).
    with _connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        status, body = _answer(sock)
        assert status == 408, body
        assert orjson.loads(body)["error"]["code"] == "request_timeout"
        assert _closed(sock)


def test_a_head_trickled_a_byte_at_a_time_is_408(gateway: GatewayProcess) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"s" * 200 + b"\r\n\r\n"
    with _connect(gateway) as sock:
        try:
            for byte in head:  # 4 bytes a second: never idle, never done within the header timeout
                sock.sendall(bytes([byte]))
                time.sleep(0.25)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _ = _answer(sock)
    assert status == 408


def test_a_connection_that_sends_nothing_is_closed(gateway: GatewayProcess) -> None:
    with _connect(gateway) as sock:
        assert sock.recv(100) == b""  # closed without an answer: there was no request


def test_the_next_request_on_a_keep_alive_connection_has_the_same_limit(gateway: GatewayProcess) -> None:
    with _connect(gateway) as sock:
        sock.sendall(_chat())
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.read()
        assert response.status == 200
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")  # then nothing
        status, _ = _answer(sock)
    assert status == 408


def test_slow_answers_and_bodies_are_not_cut_by_the_header_timeout(gateway: GatewayProcess) -> None:
    # The upstream takes 2 s (twice the header timeout); the body comes after 1.5 s (under body_timeout).
    request = _chat("fake-slow")
    head, _, body = request.partition(b"\r\n\r\n")
    with _connect(gateway) as sock:
        sock.sendall(head + b"\r\n\r\n")
        time.sleep(HEADER_TIMEOUT * 1.5)
        sock.sendall(body)
        status, answer = _answer(sock)
    assert status == 200, answer


def test_a_client_pipelining_without_reading_is_cut_off(gateway: GatewayProcess) -> None:
    # Each answer resumed reading, queueing another socket read of requests (thousands): 27 MB of
    # pipelined GETs never read held 2 GB.
    answers = b""
    with _connect(gateway) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
        with contextlib.suppress(ConnectionResetError):  # closed with requests unread: reset, answers lost
            while data := sock.recv(65536):  # the gateway closes the connection (else: a socket timeout)
                answers += data
    assert answers.count(b"HTTP/1.1 200") <= MAX_PIPELINED + 1


def test_idle_connections_do_not_exhaust_a_low_open_file_limit(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Started with a soft limit of 256 open files (still common), 400 idle connections made accept()
    fail and /health with it: the gateway raises its soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        # The gateway can only raise its soft limit up to the hard one: below ~2,000 (a locked-down
        # container) 400 idle connections plus the test's own files may not fit whatever it does.
        pytest.skip(f"the machine's hard open-file limit is {hard}; this test needs 2048 to show the soft "
                    "limit being raised")
    proc = GatewayProcess(_config(upstream, header_timeout=60), tmp_path_factory.mktemp("gw-nofile"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # inherited by the gateway process
    try:
        proc.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    idle: list[socket.socket] = []
    try:
        idle = [socket.create_connection(("127.0.0.1", proc.port), timeout=WAIT) for _ in range(400)]
        time.sleep(0.5)  # let the gateway accept them all
        _health(proc)
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()


def test_a_body_whose_last_read_is_over_the_head_limit_is_answered(gateway: GatewayProcess) -> None:
    # The read that completed a body was counted as head bytes of the next request: a final read over
    # 64 KiB closed the connection with no answer while the request was being served.
    content = "x" * (4 * MAX_HEAD_BYTES)
    messages = [{"role": "user", "content": content}]
    body = orjson.dumps({"model": "fake-ok", "user": uuid.uuid4().hex, "messages": messages})
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with contextlib.closing(_connect(gateway)) as sock:
        sock.sendall(head)
        time.sleep(0.3)  # the head is read on its own; the whole body then arrives in one burst
        sock.sendall(body)
        status, answer = _answer(sock)
    assert status == 200, answer


def test_the_keep_alive_timeout_is_the_configured_one(upstream: FakeUpstream, tmp_path: Path) -> None:
    # It was uvicorn's 5 s whatever the deployment: behind a load balancer with a longer idle timeout the
    # balancer reuses connections the gateway has just closed (502s).
    proc = GatewayProcess(_config(upstream, keep_alive_timeout=0.5), tmp_path).start()
    try:
        with _connect(proc) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _ = _answer(sock)
            assert status == 200
            sock.settimeout(3.0)  # well under 5 s: the old fixed timeout would still hold it open
            assert sock.recv(1) == b""  # closed by the gateway
    finally:
        proc.terminate()


def _refusal_headers(gateway: GatewayProcess, request: bytes) -> http.client.HTTPMessage:
    with _connect(gateway) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.read()
        assert response.status in (408, 431)
        return response.headers


def test_refusals_carry_a_fresh_request_id(gateway: GatewayProcess) -> None:
    # The 408 and 431 had no x-pointsman-request-id, unlike every other gateway answer: nothing to quote
    # to an operator, nothing to find in the logs.
    too_many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
    refusals = [
        _refusal_headers(gateway, too_many + b"\r\n"),
        _refusal_headers(gateway, too_many + b"\r\n"),
        _refusal_headers(gateway, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"),  # then nothing: 408
    ]
    ids = [headers["x-pointsman-request-id"] for headers in refusals]
    assert all(re.fullmatch(r"psm-[0-9a-f]{32}", str(request_id)) for request_id in ids), ids
    assert len(set(ids)) == len(ids)
    assert all(headers["x-pointsman-model"] == "" for headers in refusals)


@pytest.mark.parametrize("request_line", [b"NOT HTTP", b"GET /health HTTP/1.1\r\nHost x", b"GET /he\x01lth HTTP/1.1"])
def test_a_malformed_request_is_an_openai_shaped_400(gateway: GatewayProcess, request_line: bytes) -> None:
    # It was uvicorn's text/plain "Invalid HTTP request received.", without x-pointsman-request-id: an
    # OpenAI client's error handling could not read it.
    with _connect(gateway) as sock:
        sock.sendall(request_line + b"\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
        assert response.status == 400, body
        assert response.getheader("content-type") == "application/json"
        assert re.fullmatch(r"psm-[0-9a-f]{32}", str(response.getheader("x-pointsman-request-id")))
        error = orjson.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_http_request"
        assert _closed(sock)
    _health(gateway)


def _answered_before_its_body(sock: socket.socket, length: int) -> None:
    """Send the head of a request the gateway answers without reading its body (an unknown path: 404)
    and the body's first bytes, and read the answer: ``length - 10`` bytes of body are still to come."""
    sock.sendall(b"POST /v1/no-such-endpoint HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                 % (length, b"x" * 10))
    status, _ = _answer(sock)
    assert status == 404


def test_a_body_trickled_after_its_answer_does_not_hold_the_connection(gateway: GatewayProcess) -> None:
    # After an early answer (401, 404, 413, the body timeout's 408) the rest of the body is read and
    # dropped, and no timer ran meanwhile: a byte every quarter second held the connection for ever,
    # past every configured timeout.
    with _connect(gateway) as sock:
        _answered_before_its_body(sock, 1 << 20)
        sock.settimeout(0.25)
        closed = False
        for _ in range(int(WAIT / 0.25)):  # the client's pace, bounded by WAIT
            try:
                sock.sendall(b"x")
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if closed:
                break
    assert closed, "the gateway still reads the rest of an answered request's body"


def test_a_connection_idle_after_an_answered_requests_body_is_closed(gateway: GatewayProcess) -> None:
    # The rest of the body arrived after the answer; then nothing: the keep-alive timeout (cancelled by
    # the body's bytes, never armed again) no longer ran, and the idle connection was held for ever.
    with _connect(gateway) as sock:
        _answered_before_its_body(sock, 100)
        sock.sendall(b"x" * 90)
        assert _closed(sock)


def test_the_next_request_after_an_answered_requests_body_is_served(gateway: GatewayProcess) -> None:
    # The rest of the body is dropped, and the keep-alive connection serves the next request.
    with _connect(gateway) as sock:
        _answered_before_its_body(sock, 100)
        sock.sendall(b"x" * 90 + _chat())
        status, body = _answer(sock)
    assert status == 200, body
