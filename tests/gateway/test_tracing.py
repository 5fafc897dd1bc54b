"""OpenTelemetry tracing (issue 14's acceptance): one routed request's spans, seen by an in-memory
exporter, nested under the request span with their attributes; the decision record names the trace;
the upstream received the attempt's ``traceparent``. With tracing off no span is made."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.tracing import build_tracer
from tests.fakes.upstream import FakeUpstream, free_port

REDACT = {"name": "redact-pii", "priority": 90, "when": {"signal": "pii", "op": "truthy"},
          "action": {"redact": ["email"]}}


class InProcessGateway:
    """``create_app`` served by uvicorn (lifespan on) in a background thread."""

    def __init__(self, config: dict[str, Any], exporter: InMemorySpanExporter | None) -> None:
        self.port = free_port()
        self.app = create_app(parse_config(config), span_exporter=exporter)
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, lifespan="on",
                                                     log_level="warning", timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> InProcessGateway:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


def _config(upstream: FakeUpstream, db: Path, *, tracing: bool) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1"},
        "store": {"kind": "sqlite", "path": str(db), "flush_interval": 0.05},
        "tracing": {"enabled": tracing, "exporter": "none"},
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "small", "upstream_name": "ok"}, {"name": "big", "upstream_name": "ok"}]}],
        "routes": [{"name": "auto", "policy": "rules", "rules": [REDACT], "model": "small"}],
    }


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def test_one_routed_request_is_traced(upstream: FakeUpstream, exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    with InProcessGateway(_config(upstream, db, tracing=True), exporter) as gateway:
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "auto", "user": "tracing", "messages": [{"role": "user", "content": "hello there"}],
        })
        assert response.status_code == 200, response.text
        request_id = response.headers["x-pointsman-request-id"]
        sent = upstream.state.headers[-1]
    spans = list(exporter.get_finished_spans())
    request = _one(spans, "pointsman.request")
    policy = _one(spans, "pointsman.policy")
    signals = _one(spans, "pointsman.signals")
    attempt = _one(spans, "pointsman.upstream")
    assert request.parent is None
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (policy, signals, attempt)} == {trace_id}
    # Nesting: the policy and the upstream attempt under the request, the signals inside the decision.
    assert policy.parent is not None and policy.parent.span_id == request.context.span_id
    assert signals.parent is not None and signals.parent.span_id == policy.context.span_id
    assert attempt.parent is not None and attempt.parent.span_id == request.context.span_id
    assert request.attributes is not None and policy.attributes is not None and attempt.attributes is not None
    assert signals.attributes is not None
    assert dict(request.attributes).items() >= {
        "pointsman.request_id": request_id, "pointsman.endpoint": "chat.completions", "pointsman.route": "auto",
        "pointsman.requested_model": "auto", "pointsman.model": "small", "pointsman.backend": "fake",
        "pointsman.status": 200, "pointsman.outcome": "ok", "pointsman.attempts": 1,
    }.items()
    assert policy.attributes["pointsman.policy"] == "rules:auto"
    assert tuple(policy.attributes["pointsman.candidates"]) == ("small",)  # type: ignore[arg-type]
    assert tuple(signals.attributes["pointsman.signals"]) == ("pii",)  # type: ignore[arg-type]
    assert dict(attempt.attributes).items() >= {
        "pointsman.model": "small", "pointsman.backend": "fake", "pointsman.replica": upstream.base_url,
        "pointsman.attempt": 1, "pointsman.status": 200,
    }.items()
    # The upstream request carried the attempt span's W3C trace context.
    hex_trace = format(trace_id, "032x")
    flags = int(attempt.context.trace_flags)
    assert flags & 1  # sampled
    assert sent["traceparent"] == f"00-{hex_trace}-{attempt.context.span_id:016x}-{flags:02x}"
    # The decision record names the trace (the store was flushed at shutdown).
    conn = sqlite3.connect(db)
    try:
        [(stored,)] = conn.execute("SELECT trace_id FROM decisions WHERE request_id = ?", (request_id,)).fetchall()
    finally:
        conn.close()
    assert stored == hex_trace


def test_no_spans_and_no_trace_id_when_tracing_is_off(upstream: FakeUpstream, tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    with InProcessGateway(_config(upstream, db, tracing=False), None) as gateway:
        assert gateway.app.state.service.tracer is None
        assert gateway.app.state.service.forwarder.tracer is None
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "auto", "user": "tracing-off", "messages": [{"role": "user", "content": "hello"}],
        })
        assert response.status_code == 200
        assert "traceparent" not in upstream.state.headers[-1]
    conn = sqlite3.connect(db)
    try:
        [(stored,)] = conn.execute("SELECT trace_id FROM decisions").fetchall()
    finally:
        conn.close()
    assert stored is None


def test_tracing_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_sdk(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry.sdk"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sdk)
    config = parse_config({"tracing": {"enabled": True}, "backends": [
        {"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": [{"name": "m"}]}]})
    with pytest.raises(ConfigError, match="otel"):
        build_tracer(config.tracing)
    assert build_tracer(config.tracing.model_copy(update={"enabled": False})) is None


def test_workflow_steps_are_spans(upstream: FakeUpstream, exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    config = _config(upstream, tmp_path / "decisions.db", tracing=True)
    config["backends"][0]["models"] = [{"name": "small", "upstream_name": "lp-2.0"},  # never confident: escalates
                                       {"name": "big", "upstream_name": "ok"}]
    config["workflows"] = [{"name": "fast", "kind": "cascade", "stages": ["small", "big"],
                            "confidence": {"source": "logprobs", "threshold": 0.7}}]
    with InProcessGateway(config, exporter) as gateway:
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "cascade/fast", "user": "tracing-wf", "messages": [{"role": "user", "content": "hi"}],
        })
        assert response.status_code == 200, response.text
    spans = list(exporter.get_finished_spans())
    request = _one(spans, "pointsman.request")
    steps = sorted((s for s in spans if s.name == "pointsman.workflow.step"),
                   key=lambda s: s.attributes["pointsman.index"] if s.attributes else 0)
    assert [(s.attributes or {}).get("pointsman.step") for s in steps] == ["small", "big"]
    assert all(s.parent is not None and s.parent.span_id == request.context.span_id for s in steps)
    assert [dict(s.attributes or {}).get("pointsman.workflow") for s in steps] == ["fast", "fast"]
    attempts = [s for s in spans if s.name == "pointsman.upstream"]
    assert sorted(a.parent.span_id for a in attempts if a.parent) == sorted(s.context.span_id for s in steps)


def test_a_clients_traceparent_is_continued(upstream: FakeUpstream, exporter: InMemorySpanExporter,
                                            tmp_path: Path) -> None:
    client_trace, client_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with InProcessGateway(_config(upstream, tmp_path / "decisions.db", tracing=True), exporter) as gateway:
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                              headers={"traceparent": f"00-{client_trace}-{client_span}-01"},
                              json={"model": "auto", "user": "tracing-parent",
                                    "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200
    request = _one(list(exporter.get_finished_spans()), "pointsman.request")
    assert format(request.context.trace_id, "032x") == client_trace
    assert request.parent is not None and format(request.parent.span_id, "016x") == client_span
