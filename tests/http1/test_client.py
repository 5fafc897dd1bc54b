"""The gateway's HTTP/1.1 upstream client against real loopback servers that answer what a test scripts
(each test on asyncio's loop and on uvloop, see conftest.py).

Each server is a raw asyncio server (no HTTP library), so answers the gateway's own fake upstreams
never give (chunked, close-delimited, compressed, 1xx, broken, bytes after the answer) are exact.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import select
import socket
import ssl
import struct
import subprocess
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway import http1
from gateway.config import Timeouts
from gateway.upstream import UpstreamClient
from tests.polling import eventually_async

# -> keep the connection open (True), close it (False), or send nothing more until the client closes (None)
Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool | None]]


@dataclass
class Server:
    """Reads whole requests (head + Content-Length body) and answers each with ``answer``."""

    answer: Answer
    connections: int = 0
    closed: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None
    reader: asyncio.StreamReader | None = None  # the latest connection's

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.reader = reader
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                keep = await self.answer(head, writer)
                if keep is None:
                    await reader.read()  # stalled: returns at the client's close
                    break
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(answer: Answer) -> Server:
        server = Server(answer)
        server.server = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()


@pytest.fixture
async def pool() -> AsyncIterator[http1.Http1Pool]:
    client = http1.Http1Pool(keepalive=60.0)
    yield client
    await client.close()


def fixed(*parts: bytes, keep: bool | None = True) -> Answer:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool | None:
        for part in parts:
            writer.write(part)
            await writer.drain()
        return keep

    return answer


OK = b'{"ok": true}'
JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + OK


async def read_all(response: http1.Response) -> bytes:
    parts = []
    while chunk := await response.readany():
        parts.append(chunk)
    return b"".join(parts)


async def test_keep_alive_reuses_one_connection_and_sends_a_plain_head(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    server = await serve(fixed(JSON_OK))
    for _ in range(5):
        response = await pool.request("POST", server.url, {"Content-Type": "application/json"}, b'{"a":1}')
        assert response.status == 200 and response.headers["content-type"] == "application/json"
        assert await read_all(response) == OK
    assert server.connections == 1 and len(server.requests) == 5
    port = server.url.split(":")[2].split("/")[0]
    assert server.requests[0] == (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 7\r\n\r\n"
    ).encode() + b'{"a":1}'


async def test_chunked_close_delimited_and_1xx_answers_are_read_whole(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    chunked = await serve(fixed(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"))
    for _ in range(2):
        response = await pool.request("POST", chunked.url, {}, b"x")
        assert response.status == 200 and await read_all(response) == b"hello world"
    assert chunked.connections == 1  # chunked answers keep the connection
    until_close = await serve(fixed(b"HTTP/1.1 200 OK\r\n\r\nno length, ", b"ends at close", keep=False))
    response = await pool.request("POST", until_close.url, {}, b"x")
    assert await read_all(response) == b"no length, ends at close"
    response = await pool.request("POST", until_close.url, {}, b"x")  # a new connection, not the closed one
    assert await read_all(response) == b"no length, ends at close" and until_close.connections == 2


async def test_compressed_answers_are_decoded_a_bounded_piece_per_read(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    plain = b"0123456789" * 100_000  # 1 MB of answer in ~2 KB on the wire
    for encoding, data in (("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain))):
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: {encoding}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        server = await serve(fixed(head + data))
        response = await pool.request("POST", server.url, {}, b"x")
        pieces = []
        while piece := await response.readany():
            pieces.append(piece)
        assert b"".join(pieces) == plain
        assert max(map(len, pieces)) <= http1.DECODE_CHUNK  # what one read decodes is bounded: no bomb
    broken = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nnope!"
    server = await serve(fixed(broken))
    response = await pool.request("POST", server.url, {}, b"x")
    with pytest.raises(http1.ProtocolError, match="could not be decoded"):
        await read_all(response)
    server = await serve(fixed(b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nxx"))
    with pytest.raises(http1.ProtocolError, match="'br'"):
        await pool.request("POST", server.url, {}, b"x")


async def test_broken_answers_raise_and_are_never_reused(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    cut = await serve(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", keep=False))
    response = await pool.request("POST", cut.url, {}, b"x")
    with pytest.raises(http1.ConnectionClosed):
        await read_all(response)
    garbage = await serve(fixed(b"SMTP ready\r\n\r\n"))
    with pytest.raises(http1.ProtocolError):
        await pool.request("POST", garbage.url, {}, b"x")
    huge = await serve(fixed(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (http1.MAX_HEAD_BYTES + 10) + b"\r\n\r\n"))
    with pytest.raises(http1.ProtocolError, match="head is over"):
        await pool.request("POST", huge.url, {}, b"x")
    nothing = await serve(fixed(keep=False))
    with pytest.raises(http1.ConnectionClosed):
        await pool.request("POST", nothing.url, {}, b"x")
    # An answer followed by bytes nobody asked for: the connection is not used again.
    extra = await serve(fixed(JSON_OK + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    assert await read_all(await pool.request("POST", extra.url, {}, b"x")) == OK
    await asyncio.sleep(0.05)
    assert await read_all(await pool.request("POST", extra.url, {}, b"x")) == OK
    assert extra.connections == 2


async def test_an_idle_connection_the_server_closed_is_not_used(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    server = await serve(fixed(JSON_OK, keep=False))  # answers, then closes (no Connection: close header)
    assert await read_all(await pool.request("POST", server.url, {}, b"x")) == OK
    await eventually_async(lambda: server.closed == 1, "the server closed its side")
    await asyncio.sleep(0.05)  # the client has seen the FIN
    assert await read_all(await pool.request("POST", server.url, {}, b"x")) == OK
    assert server.connections == 2


async def test_idle_connections_are_closed_after_keepalive(
    serve: Callable[[Answer], Awaitable[Server]]
) -> None:
    server = await serve(fixed(JSON_OK))
    pool = http1.Http1Pool(keepalive=0.2)
    try:
        assert await read_all(await pool.request("POST", server.url, {}, b"x")) == OK
        await eventually_async(lambda: server.closed == 1, "the idle connection swept")
    finally:
        await pool.close()


async def test_a_cancelled_wait_drops_the_connection(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    async def never(head: bytes, writer: asyncio.StreamWriter) -> bool:
        assert server.reader is not None
        await server.reader.read()  # no answer; returns at the client's close
        return False

    server = await serve(never)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await pool.request("POST", server.url, {}, b"x")
    await eventually_async(lambda: server.closed == 1, "the upstream saw the connection close")


async def test_reading_pauses_while_the_reader_lags(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    total = 64 << 20

    async def endless(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n".encode())
        block = b"x" * (1 << 20)
        for _ in range(total >> 20):
            writer.write(block)
            await writer.drain()
        return False

    server = await serve(endless)
    response = await pool.request("POST", server.url, {}, b"x")
    await asyncio.sleep(0.3)  # the server writes as fast as the client takes it
    assert response._buffered < 4 * http1.HIGH_WATER  # not the 64 MB the server has to send
    response.close()
    await eventually_async(lambda: server.closed == 1, "the upstream saw the connection close")


async def test_url_credentials_are_sent_as_basic_auth_and_bad_headers_are_refused(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    server = await serve(fixed(JSON_OK))
    url = server.url.replace("http://", "http://svc:p%40ss@")
    await read_all(await pool.request("POST", url, {"authorization": "Bearer sk-other"}, b"x"))
    expected = base64.b64encode(b"svc:p@ss")
    assert b"Authorization: Basic " + expected + b"\r\n" in server.requests[0]
    assert b"sk-other" not in server.requests[0]
    for headers in ({"Authorization": "Bearer sk-key\n"}, {"X-A\r\nX-B": "1"}, {"": "1"}):
        with pytest.raises(ValueError):
            await pool.request("POST", server.url, headers, b"x")
    with pytest.raises(ValueError):
        await pool.request("POST", "ftp://127.0.0.1/x", {}, b"x")


async def test_connect_failures_are_connect_errors(pool: http1.Http1Pool) -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(http1.ConnectError):
        await pool.request("POST", f"http://127.0.0.1:{port}/v1", {}, b"x")


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost`` (and its key) that no trust store knows."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_https_upstreams_are_verified(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(JSON_OK)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    try:
        default = http1.Http1Pool()  # the system's trust store does not know this certificate
        with pytest.raises(http1.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await default.request("GET", f"https://localhost:{port}/v1/models", {})
        await default.close()
        trusting = http1.Http1Pool(ssl_context=ssl.create_default_context(cafile=str(cert)))
        response = await trusting.request("GET", f"https://localhost:{port}/v1/models", {})
        assert response.status == 200 and await read_all(response) == OK
        assert seen[-1].startswith(b"GET /v1/models HTTP/1.1\r\nHost: localhost:%d\r\n" % port)
        with pytest.raises(http1.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED|match"):  # wrong host name
            await trusting.request("GET", f"https://127.0.0.1:{port}/v1/models", {})
        await trusting.close()
    finally:
        server.close()


async def test_a_close_delimited_body_cut_by_a_reset_is_an_error_not_the_whole_answer(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    head_read = asyncio.Event()

    async def reset(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"partial": ')
        await writer.drain()
        await head_read.wait()
        # SO_LINGER 0: the close is a reset (RST), not the FIN that ends a close-delimited body.
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False

    server = await serve(reset)
    response = await pool.request("POST", server.url, {}, b"x")
    head_read.set()
    with pytest.raises(http1.ConnectionClosed):
        await read_all(response)


async def test_an_empty_body_with_a_content_encoding_is_empty_not_broken(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    # Servers label empty answers (a 204, a Content-Length: 0) with the encoding they would have used.
    answers = [b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
               b"HTTP/1.1 204 No Content\r\nContent-Encoding: deflate\r\n\r\n"]

    async def in_turn(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(answers.pop(0))
        await writer.drain()
        return True

    server = await serve(in_turn)
    assert await read_all(await pool.request("POST", server.url, {}, b"x")) == b""
    response = await pool.request("POST", server.url, {}, b"x")
    assert response.status == 204 and await read_all(response) == b""
    assert server.connections == 1


async def test_chunked_trailers_do_not_rewrite_the_answers_headers(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    server = await serve(fixed(head + b"c\r\n" + OK + b"\r\n0\r\nContent-Type: text/html\r\nX-Checksum: 1\r\n\r\n"))
    for _ in range(2):
        response = await pool.request("POST", server.url, {}, b"x")
        assert await read_all(response) == OK
        assert response.headers["content-type"] == "application/json" and "x-checksum" not in response.headers
    assert server.connections == 1


async def test_a_head_line_that_never_ends_is_refused_at_the_head_limit(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    async def endless_line(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        for _ in range(4):  # the head's limit twice over, in one header value with no line end yet
            writer.write(b"a" * (http1.MAX_HEAD_BYTES // 2))
            await writer.drain()
        assert server.reader is not None
        await server.reader.read()  # returns at the client's close
        return False

    server = await serve(endless_line)
    with pytest.raises(http1.ProtocolError, match="head is over"):
        async with asyncio.timeout(2):
            await pool.request("POST", server.url, {}, b"x")
    await eventually_async(lambda: server.closed == 1, "the upstream saw the connection close")


async def test_a_post_cancelled_while_reading_a_retryable_answer_drops_its_connection(
    serve: Callable[[Answer], Awaitable[Server]]
) -> None:
    # The rest of the body never comes.
    server = await serve(fixed(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\nbusy", keep=None))
    client = UpstreamClient()
    await client.start()
    try:
        task = asyncio.create_task(client.post(server.url, b"{}", {}, Timeouts()))
        await eventually_async(
            lambda: any(c.response is not None and c.response.status == 503 for c in client.pool._open),
            "the 503's head arrived (its body is being read)",
        )
        task.cancel()  # the gateway's client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually_async(lambda: server.closed == 1, "the upstream saw the connection close")
    finally:
        await client.close()



@pytest.mark.timeout(10)  # the bug spun the event loop itself: no asyncio deadline could end the test
async def test_a_long_gzip_body_followed_by_stray_bytes_is_read_not_spun_on(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    plain = b"0123456789" * 20_000  # decoded over several capped reads
    data = gzip.compress(plain) + b"\r\n"  # a byte or two after the member's end (a padding newline)
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(data)}\r\n\r\n".encode()
    server = await serve(fixed(head + data))
    assert await read_all(await pool.request("POST", server.url, {}, b"x")) == plain


async def test_a_gzip_body_of_several_members_is_decoded_whole(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    # RFC 1952: a gzip stream is one or more members; a server compressing piece by piece sends several.
    plain = [b"hello ", b"0123456789" * 20_000, b" world"]
    data = b"".join(gzip.compress(part) for part in plain)
    cut = len(gzip.compress(plain[0])) + 1  # the second member's header split across writes
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(data)}\r\n\r\n".encode()
    server = await serve(fixed(head + data[:cut], data[cut:]))
    response = await pool.request("POST", server.url, {}, b"x")
    pieces = []
    while piece := await response.readany():
        pieces.append(piece)
    assert b"".join(pieces) == b"".join(plain) and max(map(len, pieces)) <= http1.DECODE_CHUNK


async def test_a_request_connecting_while_the_pool_closes_fails_and_keeps_no_connection(
    serve: Callable[[Answer], Awaitable[Server]]
) -> None:
    server = await serve(fixed(JSON_OK))
    pool = http1.Http1Pool()
    task = asyncio.create_task(pool.request("POST", server.url, {}, b"x"))
    await asyncio.sleep(0)  # the request is in create_connection
    await pool.close()
    with pytest.raises(http1.ConnectError, match="closed"):
        await task
    await eventually_async(lambda: server.closed == server.connections, "the upstream saw every connection close")
    assert not server.requests


async def test_a_deflate_body_without_its_zlib_header_is_decoded(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    # Some servers send "deflate" as the bare deflate stream (no zlib wrapper); aiohttp read it, so did the gateway.
    plain = b"0123456789" * 1000
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    data = packer.compress(plain) + packer.flush()
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: {len(data)}\r\n\r\n".encode()
    server = await serve(fixed(head + data))
    assert await read_all(await pool.request("POST", server.url, {}, b"x")) == plain


async def test_a_close_delimited_body_cut_by_closing_the_pool_is_an_error_not_the_whole_answer(
    serve: Callable[[Answer], Awaitable[Server]]
) -> None:
    # The rest never comes (no length: the body would end at the server's close).
    server = await serve(fixed(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"partial": ', keep=None))
    pool = http1.Http1Pool()
    response = await pool.request("POST", server.url, {}, b"x")
    await pool.close()  # the gateway shutting down with this answer in flight
    with pytest.raises(http1.ConnectionClosed):
        await read_all(response)


class _ClosesWhenTold:
    """A blocking server on a thread: each connection gets one keep-alive answer, then is closed when the
    test says so (an upstream's keep-alive timeout, e.g. uvicorn's 5 s), while the client's loop is busy."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.close_now = threading.Event()
        self.closed = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1/chat/completions"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # the listener was closed: the test is over
                return
            self.connections += 1
            with conn:
                request = b""
                while not request.endswith(b"x"):  # the head and the one-byte body
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                conn.sendall(JSON_OK)
                self.close_now.wait(10)
            self.closed.set()


async def test_a_connection_the_upstream_closed_while_idle_is_not_reused_even_before_the_loop_saw_it(
    pool: http1.Http1Pool,
) -> None:
    server = _ClosesWhenTold()
    try:
        response = await pool.request("POST", server.url, {}, b"x")
        assert await read_all(response) == OK
        [(conn,)] = [tuple(idle) for idle in pool._idle.values()]
        # The upstream closes the idle connection; its FIN reaches the client's socket, and the request
        # below is sent before this loop runs again (no await in between), so connection_lost has not run.
        server.close_now.set()
        assert server.closed.wait(10)
        fd = conn.transport.get_extra_info("socket").fileno()
        assert select.select([fd], [], [], 10)[0], "the close never reached the client's socket"
        assert not conn.closed
        response = await pool.request("POST", server.url, {}, b"x")
        assert response.status == 200 and await read_all(response) == OK
        assert server.connections == 2  # a new connection, not a reset on the closed one
    finally:
        server.close_now.set()
        server.listener.close()


async def test_a_request_crossing_the_upstreams_idle_close_is_sent_once_more_on_a_new_connection(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    answered: list[int] = []

    async def keep_alive_timeout_on_the_second(head: bytes, writer: asyncio.StreamWriter) -> bool:
        answered.append(len(answered))
        if len(answered) == 2:  # the upstream's keep-alive timeout fired as this request came in
            return False
        writer.write(JSON_OK)
        await writer.drain()
        return True

    server = await serve(keep_alive_timeout_on_the_second)
    for _ in range(2):
        response = await pool.request("POST", server.url, {}, b'{"a":1}')
        assert response.status == 200 and await read_all(response) == OK
    assert server.connections == 2 and len(server.requests) == 3  # the crossed request went once more
    assert server.requests[1] == server.requests[2]


async def test_a_close_before_any_answer_is_an_error_on_a_new_connection_or_after_part_of_an_answer(
    serve: Callable[[Answer], Awaitable[Server]], pool: http1.Http1Pool
) -> None:
    silent = await serve(fixed(keep=False))  # reads the request, closes without a byte
    with pytest.raises(http1.ConnectionClosed):
        await pool.request("POST", silent.url, {}, b"x")
    assert len(silent.requests) == 1  # a new connection: the upstream had the request, it is not sent again

    heads: list[int] = []

    async def half_a_head_on_the_second(head: bytes, writer: asyncio.StreamWriter) -> bool:
        heads.append(1)
        writer.write(JSON_OK if len(heads) == 1 else b"HTTP/1.1 200 OK\r\nContent-")
        await writer.drain()
        return len(heads) == 1

    partial = await serve(half_a_head_on_the_second)
    response = await pool.request("POST", partial.url, {}, b"x")
    assert await read_all(response) == OK
    with pytest.raises(http1.ConnectionClosed):
        await pool.request("POST", partial.url, {}, b"x")
    assert len(partial.requests) == 2  # the answer had begun: the upstream was working on it


def test_a_url_that_cannot_be_sent_is_refused_without_showing_its_credentials() -> None:
    for url in ("ftp://admin:Sup3rSecret@host/x", "http://admin:Sup3rSecret@host/v1\x00"):
        with pytest.raises(ValueError) as refused:
            http1.split_url(url)
        assert "Sup3rSecret" not in str(refused.value) and "***@host" in str(refused.value)
