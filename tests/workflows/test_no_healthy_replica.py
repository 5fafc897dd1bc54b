"""A workflow whose sub-calls find no healthy replica answers 503 ``service_unavailable``, as a plain
model does (README "Behaviour an application can rely on"), not a 502 that says an upstream failed.

The replicas are ejected by the circuit breaker: their backend points at a port nothing listens on,
and the first request's connect errors open the circuit (``failure_threshold: 2``, a long cooldown).
A workflow that also meets a real upstream failure still answers 502."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, free_port
from tests.gatewayproc import GatewayProcess

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    dead_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens here
    fast = {"connect": 1.0, "first_byte": 2.0, "total": 10.0, "idle": 2.0}
    config = {
        "backends": [
            {"name": "dead", "base_url": dead_url, "health": {"enabled": False}, "timeouts": fast,
             "models": [{"name": "dead-a", "upstream_name": "ok"}, {"name": "dead-b", "upstream_name": "ok"}]},
            {"name": "live", "base_url": upstream.base_url, "health": {"enabled": False}, "timeouts": fast,
             "models": [{"name": "failing", "upstream_name": "always-500"}]},
        ],
        "workflows": [
            {"name": "ladder", "kind": "cascade", "stages": ["dead-a", "dead-b"],
             "confidence": {"source": "logprobs", "threshold": 0.7}},
            {"name": "panel", "kind": "fusion", "candidates": ["dead-a", "dead-b"], "min_answers": 1,
             "combine": {"fuser": "dead-b"}},
            {"name": "mixed", "kind": "fusion", "candidates": ["dead-a", "failing"], "min_answers": 1,
             "combine": {"fuser": "dead-b"}},
        ],
        "retry": {"attempts": 3, "backoff_base": 0.001, "backoff_max": 0.005},
        "breaker": {"failure_threshold": 2, "cooldown": 600},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-no-replica")).start()
    # Open the circuit: the first request's two connect errors eject the only replica of "dead".
    first = _chat(proc, "dead-a")
    assert first.status_code == 502, first.text
    plain = _chat(proc, "dead-a")
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "service_unavailable", plain.text
    yield proc
    proc.terminate()


def _chat(gateway: GatewayProcess, model: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
        "model": model, "messages": MESSAGES, "user": uuid.uuid4().hex, **body})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("workflow", ["cascade/ladder", "fusion/panel"])
def test_a_workflow_with_no_healthy_replica_is_503_like_a_plain_model(
    gateway: GatewayProcess, workflow: str, stream: bool
) -> None:
    response = _chat(gateway, workflow, stream=stream)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "service_unavailable"), error
    assert "no healthy replica" in error["message"]
    assert response.headers["x-pointsman-request-id"]
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["status"] == 503


def test_a_real_upstream_failure_among_them_is_still_502(gateway: GatewayProcess) -> None:
    response = _chat(gateway, "fusion/mixed")
    assert response.status_code == 502, response.text
    assert response.json()["error"]["type"] == "upstream_error"
