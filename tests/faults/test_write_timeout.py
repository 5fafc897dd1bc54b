"""A client that stops reading a whole (non-streamed) answer: ``server.write_timeout``.

A buffered answer is handed to the connection in one write; what the client's socket does not take
waits in the gateway's write buffer (up to ``server.max_response_bytes``). A client that never reads
held that buffer, its connection and the request for ever, past shutdown's drain. The gateway cuts
such a connection once its buffer has been over the high-water mark with nothing taken for
``server.write_timeout``; a client that reads, however slowly, is not cut, and an idle keep-alive
connection (nothing to write) is not either.

A real gateway process, a real loopback upstream answering several MB, raw sockets as clients (the
official SDK as the client that keeps being served). Nothing is timed: each test waits for the effect
it expects with a deadline far over it; the only sleeps are a slow reader's pace and an idle gap,
which are the behaviour under test.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from openai import OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.upstream import LoopbackServer
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

WAIT = 30.0  # every deadline here: far over what each wait takes
WRITE_TIMEOUT = 1.0
ANSWER_TEXT = 8 << 20  # 8 MB: more than the kernel's socket buffers on both sides hold (4 MB tcp_wmem max)


def _answer(text: str) -> bytes:
    return orjson.dumps({
        "id": "big", "object": "chat.completion", "created": 0, "model": "big",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })


async def _stream() -> AsyncIterator[bytes]:
    """:data:`ANSWER_TEXT` bytes of text as a chat completion stream, in 64 KB chunks, as fast as they go."""
    piece = "x" * (64 << 10)
    for _ in range(ANSWER_TEXT // len(piece)):
        chunk = {"id": "big", "object": "chat.completion.chunk", "created": 0, "model": "big",
                 "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"


class BigUpstream(LoopbackServer):
    """Answers model ``big`` with :data:`ANSWER_TEXT` bytes of text, any other model with a short answer."""

    def __init__(self) -> None:
        big = _answer("x" * ANSWER_TEXT)

        async def chat(request: Request) -> Response:
            body = orjson.loads(await request.body())
            if body.get("stream"):
                return StreamingResponse(_stream(), media_type="text/event-stream")
            return Response(big if body["model"] == "big" else _answer("hi"), media_type="application/json")

        super().__init__(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))


@pytest.fixture(scope="module")
def upstream() -> Iterator[BigUpstream]:
    server = BigUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(upstream: BigUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "server": {"write_timeout": WRITE_TIMEOUT, "keep_alive_timeout": 60},
        "backends": [{
            "name": "big",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "max_concurrency": 1,  # a request that kept its slot would shut every other client out (429)
            "models": [{"name": "big", "upstream_name": "big"}, {"name": "small", "upstream_name": "small"},
                       {"name": "behind", "upstream_name": "small"}],  # a model of its own: one test's records
        }],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-write-timeout")).start()
    yield proc
    proc.terminate()


def _request(model: str, *, stream: bool = False) -> bytes:
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _client(gateway: GatewayProcess, window: int = 4096) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)  # before connecting: a small window
    sock.settimeout(WAIT)
    sock.connect(("127.0.0.1", gateway.port))
    return sock


def _head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The answer's head and the bytes of its body read with it."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(1024)
        assert chunk, received
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


def _request_id(head: bytes) -> str:
    found = re.search(rb"x-pointsman-request-id: (psm-[0-9a-f]+)", head)
    assert found is not None, head
    return found.group(1).decode()


def _open_on_gateway(gateway: GatewayProcess, client_port: int) -> bool:
    """Whether the gateway still holds its side of the connection from ``client_port`` open."""
    local, remote = f"0100007F:{gateway.port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote and fields[3] in ("01", "08"):  # ESTABLISHED, CLOSE_WAIT
            return True
    return False


def _metric(gateway: GatewayProcess, name: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=WAIT).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_client_that_never_reads_its_answer_is_cut_off(gateway: GatewayProcess) -> None:
    # The client sends a request whose answer is 8 MB, reads its head and nothing more. Before: the
    # answer sat in the gateway's write buffer for ever, the connection stayed open (the keep-alive
    # timer's close waits for the buffer to empty), the record said "ok" and shutdown waited its whole
    # drain_timeout for that connection.
    with _client(gateway) as stalled:
        stalled.sendall(_request("big"))
        head, _ = _head(stalled)
        assert head.startswith(b"HTTP/1.1 200"), head
        request_id = _request_id(head)
        # While it is held, other clients are served (its replica's one slot is not held by it).
        sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=WAIT)
        answer = sdk.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content == "hi"
        # ... and reads no more.
        record = gateway.decision(request_id, timeout=WAIT)
        assert record["outcome"] == "client_disconnected" and record["error_type"] == "client_stalled", record
        assert record["status"] == 200  # its head was sent
        port = stalled.getsockname()[1]
        eventually(lambda: not _open_on_gateway(gateway, port), "the gateway closed the connection", timeout=WAIT)
        assert _metric(gateway, "pointsman_in_flight_requests") == 0
        answer = sdk.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content == "hi"


def test_a_client_that_never_reads_its_stream_is_cut_off_and_recorded_as_stalled(gateway: GatewayProcess) -> None:
    # The server's write timeout (1 s here) is shorter than the backend's idle timeout, which the stream's
    # own watchdog uses: the server cuts the connection first. Before, the record said only
    # "client_disconnected", as for a client that hung up, not why.
    with _client(gateway) as stalled:
        stalled.sendall(_request("big", stream=True))
        head, _ = _head(stalled)
        assert head.startswith(b"HTTP/1.1 200"), head
        record = gateway.decision(_request_id(head), timeout=WAIT)
        assert (record["outcome"], record["error_type"]) == ("client_disconnected", "client_stalled"), record
        port = stalled.getsockname()[1]
        eventually(lambda: not _open_on_gateway(gateway, port), "the gateway closed the connection", timeout=WAIT)
    eventually(lambda: _metric(gateway, "pointsman_in_flight_requests") == 0, "no request in flight", timeout=WAIT)


def test_a_request_pipelined_behind_an_unread_answer_is_finished_when_it_is_cut(gateway: GatewayProcess) -> None:
    # Two requests at once, nothing read: the second's answer could not even start (its head waits for
    # the first's bytes to leave). Before: its task waited for ever (its follow-ups never ran, shutdown
    # waited for it). Cut with the connection, it is recorded as a client that went away.
    with _client(gateway) as stalled:
        stalled.sendall(_request("big") + _request("behind"))
        head, _ = _head(stalled)
        first = gateway.decision(_request_id(head), timeout=WAIT)
        assert (first["outcome"], first["error_type"]) == ("client_disconnected", "client_stalled"), first

        def behind() -> list[dict[str, object]]:
            return [d for d in gateway.decisions() if d["model"] == "behind"]

        eventually(behind, "the request behind it recorded", timeout=WAIT)
        assert [(d["outcome"], d["error_type"]) for d in behind()] == [("client_disconnected", "client_stalled")]
    eventually(lambda: _metric(gateway, "pointsman_in_flight_requests") == 0, "no request in flight", timeout=WAIT)


def test_a_slow_reader_is_not_cut_off(gateway: GatewayProcess) -> None:
    # A client that reads its 8 MB at under 1 MB/s: it takes many write timeouts to read it all, but
    # its socket takes bytes all along, so it is not cut and the answer arrives whole. (The gateway's
    # write buffer alone did not show it: it stays put while the kernel's send queue, megabytes, drains;
    # measured on the buffer alone, this client was cut after 3 MB.)
    with _client(gateway, window=8192) as slow:
        slow.sendall(_request("big"))
        head, body = _head(slow)
        length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            chunk = slow.recv(8192)
            assert chunk, f"cut off after {len(body)} of {length} bytes"
            body += chunk
            time.sleep(0.01)  # the pace of a slow reader (8 KiB per 10 ms at most), not a synchronisation
        assert len(orjson.loads(body)["choices"][0]["message"]["content"]) == ANSWER_TEXT
    assert gateway.decision(_request_id(head), timeout=WAIT)["outcome"] == "ok"


def test_an_idle_keep_alive_connection_is_not_cut_by_the_write_timeout(gateway: GatewayProcess) -> None:
    # Nothing to write is not a stalled write: a keep-alive connection idle for longer than the write
    # timeout (and shorter than keep_alive_timeout) serves its next request.
    with _client(gateway) as client:
        for _ in range(2):
            client.sendall(_request("small"))
            head, body = _head(client)
            length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                body += client.recv(1 << 16)
            assert orjson.loads(body)["choices"][0]["message"]["content"] == "hi"
            time.sleep(3 * WRITE_TIMEOUT)  # the idle gap under test
