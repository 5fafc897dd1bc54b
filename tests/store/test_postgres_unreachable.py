"""A gateway whose PostgreSQL stops answering mid-traffic (a network partition: connections stay open,
nothing comes back), then answers again.

The database is reached through a TCP proxy of the test's own that can freeze: the shared server is
never stopped. Completions keep being answered and their records are written once it answers again;
feedback that needs the store is a prompt 503, not a request held for the driver's timeouts.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from openai import OpenAI

from gateway.auth import hash_key
from store import DecisionRecord, DecisionRecorder, PostgresDecisionStore
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually, eventually_async
from tests.store.conftest import sync_pg_schema

pytestmark = pytest.mark.postgres

KEY = "sk-team-a-0123456789"


class FreezableProxy:
    """Forwards 127.0.0.1:<port> to a PostgreSQL server; while frozen it accepts and keeps connections
    but forwards nothing, as a partitioned network does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thawed = threading.Event()
        self.thawed.set()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _addr = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.thawed.wait()
        upstream = socket.create_connection(self.target)
        peers = {client: upstream, upstream: client}
        try:
            while not self.closed:
                readable, _w, _x = select.select(list(peers), [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    self.thawed.wait()
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def freeze(self) -> None:
        self.thawed.clear()

    def thaw(self) -> None:
        self.thawed.set()

    def close(self) -> None:
        self.closed = True
        self.thawed.set()
        self.listener.close()


@pytest.fixture
def proxied_dsn() -> Iterator[tuple[str, FreezableProxy]]:
    with sync_pg_schema() as dsn:
        parts = urlsplit(dsn)
        proxy = FreezableProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
        user = f"{parts.username}@" if parts.username else ""
        try:
            yield urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}")), proxy
        finally:
            proxy.close()


def stored_ids(dsn: str) -> set[str]:
    import asyncio

    async def read() -> set[str]:
        conn = await asyncpg.connect(dsn)
        try:
            return {row["request_id"] for row in await conn.fetch("SELECT request_id FROM decisions")}
        finally:
            await conn.close()

    return asyncio.run(read())


def test_a_partitioned_postgres_costs_no_answers_and_feedback_is_a_prompt_503(
    upstream: FakeUpstream, tmp_path: Path, proxied_dsn: tuple[str, FreezableProxy]
) -> None:
    dsn, proxy = proxied_dsn
    config: dict[str, Any] = {
        "auth": {"api_keys": [{"name": "team-a", "sha256": hash_key(KEY)}]},
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "fake-ok", "upstream_name": "ok"}]}],
        "routes": [{"name": "auto", "model": "fake-ok"}],
        "store": {"kind": "postgres", "dsn": dsn, "flush_interval": 0.05},
        "feedback": {"write_timeout": 1.0},
    }
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        client = OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=30)

        def serve() -> str:
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "hello"}]
            )
            assert raw.http_response.status_code == 200
            return str(raw.headers["x-pointsman-request-id"])

        before = serve()
        eventually(lambda: before in stored_ids(dsn))

        proxy.freeze()
        during = [serve() for _ in range(5)]  # answered while the store does not answer
        # An id this replica did not issue is looked up in the store, which does not answer: a 503 the
        # client can retry, well before the client's own timeout (the driver's would be a minute).
        response = httpx.post(
            f"{gateway.base_url}/feedback", json={"request_id": "psm-" + "0" * 32, "score": 1.0},
            headers={"Authorization": f"Bearer {KEY}"}, timeout=20,
        )
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "store_unavailable"
        assert response.headers["retry-after"] == "1"

        proxy.thaw()
        eventually(lambda: set(during) <= stored_ids(dsn), timeout=60)
    finally:
        proxy.thaw()
        gateway.terminate()


@pytest.mark.parametrize("hung", ["writing", "draining"])
def test_a_recorder_stops_at_its_deadline_when_postgres_stops_answering(
    proxied_dsn: tuple[str, FreezableProxy], hung: str
) -> None:
    """A write hung on a partitioned database is given up at ``drain_timeout``, and the store closes at
    once. A cancelled asyncpg query first talks to the server and waits the driver's command timeout (30 s
    in a gateway) for it, and closing the pool waits for that connection: a SIGTERM took the drain timeout
    plus twice the command timeout (50 s against a 20 s drain), past a container's grace period. The store's
    command timeout is an hour here: a stop that waits for it fails the bound below by far.

    ``writing``: the writer was in the middle of a write when stop came; ``draining``: the writer was idle,
    and the write stop makes itself hangs."""
    dsn, proxy = proxied_dsn

    async def run() -> None:
        store = PostgresDecisionStore(dsn, command_timeout=3600)
        recorder = DecisionRecorder(store, flush_interval=0.02 if hung == "writing" else 3600, drain_timeout=1.0)
        await recorder.start()
        recorder.record(DecisionRecord("before", 1.0, "chat.completions", "auto", "auto"))
        await recorder.flush()
        proxy.freeze()
        recorder.record(DecisionRecord("during", 2.0, "chat.completions", "auto", "auto"))
        if hung == "writing":
            await eventually_async(lambda: recorder.pending == 1 and not recorder._queue, "the write began")
        stopping = asyncio.ensure_future(recorder.stop())
        done, _ = await asyncio.wait({stopping}, timeout=60)
        if not done:
            proxy.thaw()  # lets the stop end, so the test can fail rather than hang
            await stopping
            pytest.fail("the recorder's stop waited for the hung write well past its 1 s drain_timeout")
        assert (recorder.written, recorder.pending, recorder.dropped) == (1, 0, 1)

    asyncio.run(run())
    proxy.thaw()
    assert stored_ids(dsn) in ({"before"}, {"before", "during"})  # a write given up on may still commit
