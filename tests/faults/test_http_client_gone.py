"""A client gone while its requests are answered: pipelined requests it left are not sent upstream,
the one being answered is told (its upstream call cancelled), a stream's upstream call is cancelled.

Raw sockets against a real gateway process and real loopback upstreams. Nothing here is timed: each
test waits for the effect it expects (with a deadline far over it), or for the event after which an
unwanted effect would have happened (the gateway closing its side of the connection).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.fakes.upstream import FakeUpstream, LoopbackServer
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

WAIT = 20.0  # every deadline here: far over what each wait takes, so reaching one means the behaviour is wrong
DRIP_CHUNKS = 400  # 400 chunks 50 ms apart: a stream that runs for 20 s unless it is cancelled


class DripUpstream(LoopbackServer):
    """A stream that drips :data:`DRIP_CHUNKS` chunks; ``sent`` and ``cancelled`` say how it ended."""

    def __init__(self) -> None:
        self.sent = 0
        self.cancelled = 0

        async def chat(request: Request) -> StreamingResponse:
            await request.body()
            return StreamingResponse(self._drip(), media_type="text/event-stream")

        super().__init__(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))

    async def _drip(self) -> AsyncIterator[bytes]:
        chunk = {
            "id": "d",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "drip",
            "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
        }
        try:
            for _ in range(DRIP_CHUNKS):
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                self.sent += 1
                await asyncio.sleep(0.05)
            yield b"data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise


@pytest.fixture(scope="module")
def drip() -> Iterator[DripUpstream]:
    server = DripUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(
    upstream: FakeUpstream, drip: DripUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = {
        "server": {"header_timeout": 5, "body_timeout": 10},
        "backends": [
            {
                "name": "fake",
                "base_url": upstream.base_url,
                "health": {"enabled": False},
                "timeouts": {"total": 120, "idle": 60},
                "models": [
                    {"name": "fake-ok", "upstream_name": "ok"},
                    {"name": "fake-slow-gone", "upstream_name": "slow:1.5#gone"},
                    {"name": "fake-slow-rst", "upstream_name": "slow:60#rst"},
                ],
            },
            {
                "name": "drip",
                "base_url": drip.base_url,
                "health": {"enabled": False},
                "timeouts": {"total": 120, "idle": 60},
                "models": [{"name": "fake-drip", "upstream_name": "drip"}],
            },
        ],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-client-gone")).start()
    yield proc
    proc.terminate()


def _chat(model: str, user: str, stream: bool = False) -> bytes:
    body = orjson.dumps(
        {"model": model, "stream": stream, "user": user, "messages": [{"role": "user", "content": "hi"}]}
    )
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def _records(gateway: GatewayProcess, model: str, before: set[str]) -> list[dict[str, object]]:
    """The decision records of ``model`` not among the request ids ``before`` (each test's own model:
    a record of the test before may be written after its connection closed)."""
    return [d for d in gateway.decisions() if d["model"] == model and d["request_id"] not in before]


def _record_ids(gateway: GatewayProcess) -> set[str]:
    return {d["request_id"] for d in gateway.decisions()}


def _open_on_gateway(gateway: GatewayProcess, client_port: int) -> bool:
    """Whether the gateway still holds its side of the connection from ``client_port`` open
    (established, or the client's FIN in and the gateway's side not closed: CLOSE_WAIT)."""
    local, remote = f"0100007F:{gateway.port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote and fields[3] in ("01", "08"):
            return True
    return False


def test_pipelined_requests_of_a_client_that_closed_are_not_sent_upstream(
    gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    # A slow upstream, 5 pipelined requests, the client closes while the first is in flight. Before: the
    # FIN lay unread behind the queued requests (reading pauses while they queue) and the second was
    # started after the first's answer (an upstream call for nobody); or, when the FIN was read, the
    # first's answer, written to the closed connection, raised in the app ("unhandled error", a 500).
    user, model, before = uuid.uuid4().hex, "slow:1.5#gone", _record_ids(gateway)
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT)
    client_port = sock.getsockname()[1]
    sock.sendall(b"".join(_chat("fake-slow-gone", user) for _ in range(5)))
    eventually(lambda: upstream.state.requests[(model, user)] == 1, "the first request reached the upstream", WAIT)
    sock.close()
    # Once the gateway has closed its side, no queued request can be started any more.
    eventually(lambda: not _open_on_gateway(gateway, client_port), "the gateway closed the connection", WAIT)
    eventually(lambda: _records(gateway, "fake-slow-gone", before), "the first request's record", WAIT)
    assert upstream.state.requests[(model, user)] == 1
    records = _records(gateway, "fake-slow-gone", before)
    assert len(records) == 1
    assert records[0]["status"] != 500
    assert "unhandled error" not in gateway.log()


def test_a_pipelined_request_in_flight_is_cancelled_when_its_client_resets(
    gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    # Before: only the last request queued was told its client was gone, so the one in flight ran its
    # upstream call to the end (60 s here) for nobody.
    user, model, before = uuid.uuid4().hex, "slow:60#rst", _record_ids(gateway)
    cancelled = upstream.state.disconnects[model]
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT)
    sock.sendall(b"".join(_chat("fake-slow-rst", user) for _ in range(5)))
    eventually(lambda: upstream.state.requests[(model, user)] == 1, "the first request reached the upstream", WAIT)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, as a client killed with unread answers sends
    eventually(lambda: upstream.state.disconnects[model] == cancelled + 1, "the upstream call was cancelled", WAIT)
    eventually(lambda: _records(gateway, "fake-slow-rst", before), "the first request's record", WAIT)
    assert upstream.state.requests[(model, user)] == 1


def test_a_stream_is_cancelled_upstream_when_its_client_closes(gateway: GatewayProcess, drip: DripUpstream) -> None:
    cancelled = drip.cancelled
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=WAIT) as sock:
        sock.sendall(_chat("fake-drip", uuid.uuid4().hex, stream=True))
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
    eventually(lambda: drip.cancelled == cancelled + 1, "the upstream stream was cancelled", WAIT)
    assert drip.sent < DRIP_CHUNKS
