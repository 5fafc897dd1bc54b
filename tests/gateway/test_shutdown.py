"""Graceful shutdown: on SIGTERM the gateway turns not-ready, lets in-flight streams finish, flushes
every decision record it answered, and exits 0 — what a Kubernetes rollout relies on."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.upstream import WORDS, FakeUpstream, stream_events
from tests.gatewayproc import GatewayProcess

MESSAGES = [{"role": "user", "content": "hello"}]


def _config(upstream: FakeUpstream, workdir: Path) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "timeouts": {"connect": 1.0, "first_byte": 2.0, "total": 20.0, "idle": 2.0},
            "models": [{"name": "fake-ok", "upstream_name": "ok"},
                       {"name": "fake-slow-drip", "upstream_name": "slow-drip"}],
        }],
        "server": {"drain_timeout": 15},
        # A batch writer that would not flush on its own for a long while: whatever is in the log
        # after exit was written by the shutdown flush.
        "store": {"kind": "sqlite", "path": str(workdir / "decisions.db"), "flush_interval": 60,
                  "batch_size": 100_000},
    }


class _Stream(threading.Thread):
    """Reads one streamed completion through the gateway, byte for byte, in the background."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.first_chunk = threading.Event()
        self.body = b""
        self.status = 0
        self.request_id = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=30) as client, client.stream(
                "POST", f"{self.url}/v1/chat/completions",
                json={"model": "fake-slow-drip", "messages": MESSAGES, "stream": True},
            ) as response:
                self.status = response.status_code
                self.request_id = response.headers.get("x-pointsman-request-id", "")
                for chunk in response.iter_raw():
                    self.body += chunk
                    self.first_chunk.set()
        except BaseException as exc:
            self.error = exc
        finally:
            self.first_chunk.set()


def _ready_status(url: str, client: httpx.Client | None = None) -> int | str:
    """/ready's status, or "refused" once the gateway stops listening / closes idle connections."""
    try:
        if client is not None:
            return client.get(f"{url}/ready").status_code
        with httpx.Client(timeout=2) as fresh:
            return fresh.get(f"{url}/ready").status_code
    except httpx.TransportError as exc:
        return f"refused ({type(exc).__name__})"


def test_sigterm_drains_stream_and_flushes_every_record(upstream: FakeUpstream, tmp_path: Path) -> None:
    gateway = GatewayProcess(_config(upstream, tmp_path), tmp_path).start()
    try:
        assert _ready_status(gateway.url) == 200
        answered: list[str] = []
        with httpx.Client(base_url=gateway.base_url, timeout=10) as client:
            for _ in range(50):
                response = client.post("/chat/completions", json={"model": "fake-ok", "messages": MESSAGES})
                assert response.status_code == 200, response.text
                answered.append(response.headers["x-pointsman-request-id"])
        assert gateway.decisions() == [], "the writer must not have flushed yet (flush_interval 60)"

        stream = _Stream(gateway.url)
        stream.start()
        assert stream.first_chunk.wait(10) and stream.error is None, stream.error
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)

        # While the stream drains (~1.25 s of chunks left), readiness must never say "ready" again.
        readiness: list[int | str] = []
        while stream.is_alive():
            readiness.append(_ready_status(gateway.url))
            time.sleep(0.02)
        stream.join(10)

        exit_code = gateway.proc.wait(timeout=20)
    finally:
        if gateway.proc is not None and gateway.proc.poll() is None:
            gateway.proc.kill()
            gateway.proc.wait()

    # The in-flight stream was delivered completely, byte for byte, [DONE] included.
    assert stream.error is None, f"stream broke during the drain: {stream.error!r}"
    assert stream.status == 200
    assert stream.body == b"".join(stream_events({"model": "slow-drip"}, WORDS)), stream.body[-200:]
    assert stream.body.endswith(b"data: [DONE]\n\n")

    assert readiness, "the stream ended before /ready could be polled during the drain"
    assert 200 not in readiness, f"/ready answered 200 after SIGTERM: {readiness}"
    assert readiness[0] == 503 or str(readiness[0]).startswith("refused"), readiness

    # Every answered request has its record, written by the shutdown flush.
    records = {r["request_id"]: r for r in gateway.decisions()}
    missing = [rid for rid in answered if rid not in records]
    assert not missing, f"{len(missing)} of 50 answered requests have no decision record after exit"
    assert all(records[rid]["status"] == 200 for rid in answered)
    streamed = records.get(stream.request_id)
    assert streamed is not None, "the drained stream has no decision record after exit"
    assert streamed["status"] == 200 and streamed["outcome"] == "ok" and streamed["stream"] == 1

    assert exit_code == 0, (
        f"gateway exited with {exit_code} after a graceful SIGTERM drain (expected 0)\n{gateway.log()[-2000:]}"
    )


def test_ready_is_503_as_soon_as_sigterm_arrives(upstream: FakeUpstream, tmp_path: Path) -> None:
    """Right after SIGTERM, while a stream keeps the process alive, /ready is 503 and new work is
    refused. uvicorn closes its listener and idle connections within ~0.1 s of the signal, so the
    probes go over keep-alive connections opened beforehand; a closed connection is accepted too."""
    gateway = GatewayProcess(_config(upstream, tmp_path), tmp_path).start()
    probe = httpx.Client(timeout=5)
    late = httpx.Client(timeout=5)
    try:
        assert _ready_status(gateway.url, probe) == 200
        warm = late.post(f"{gateway.base_url}/chat/completions", json={"model": "fake-ok", "messages": MESSAGES})
        assert warm.status_code == 200
        stream = _Stream(gateway.url)
        stream.start()
        assert stream.first_chunk.wait(10) and stream.error is None, stream.error
        assert gateway.proc is not None
        gateway.proc.send_signal(signal.SIGTERM)
        first = _ready_status(gateway.url, probe)
        late_result: int | str
        try:
            response = late.post(f"{gateway.base_url}/chat/completions",
                                 json={"model": "fake-ok", "messages": MESSAGES})
            late_result = response.status_code
            if response.status_code == 503:
                error = response.json()["error"]
                assert error["type"] == "service_unavailable" and "shutting down" in error["message"]
        except httpx.TransportError:
            late_result = "refused"
        stream.join(10)
        gateway.proc.wait(timeout=20)
    finally:
        probe.close()
        late.close()
        if gateway.proc is not None and gateway.proc.poll() is None:
            gateway.proc.kill()
            gateway.proc.wait()
    assert first == 503 or str(first).startswith("refused"), f"/ready right after SIGTERM answered {first}"
    assert late_result in (503, "refused"), f"a new request during the drain got {late_result}"
    assert stream.error is None and stream.body.endswith(b"data: [DONE]\n\n")


def test_sigterm_when_idle_exits_zero(upstream: FakeUpstream, tmp_path: Path) -> None:
    gateway = GatewayProcess(_config(upstream, tmp_path), tmp_path).start()
    code = gateway.terminate(timeout=20)
    assert code == 0, (
        f"an idle gateway exited with {code} on SIGTERM (expected 0; -15 means it was killed by the "
        f"re-raised signal)\n{gateway.log()[-1500:]}"
    )
