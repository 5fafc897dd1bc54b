"""Upstream ``Retry-After`` values the gateway must survive: whatever an upstream sends, a 429 it
gives up on reaches the client as an OpenAI-shaped 429, and the decision record says so."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.scripted import ScriptedUpstream
from tests.gatewayproc import GatewayProcess

RATE_LIMITED = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": None}}


VALUES = ("soon", "0", "inf", "nan", "1e999")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One backend per Retry-After value, each on its own scripted upstream (model ``ra-<index>``)."""
    upstreams = [ScriptedUpstream(429, RATE_LIMITED, {"Retry-After": value}).start() for value in VALUES]
    config = {
        "backends": [
            {"name": f"limited-{i}", "base_url": u.base_url, "health": {"enabled": False},
             "models": [{"name": f"ra-{i}"}]}
            for i, u in enumerate(upstreams)
        ],
        "retry": {"attempts": 2, "backoff_base": 0.01, "backoff_max": 0.02, "respect_retry_after_max": 1},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-retry-after")).start()
    yield proc
    proc.terminate()
    for upstream in upstreams:
        upstream.stop()


@pytest.mark.parametrize(("index", "retry_after"), list(enumerate(VALUES)))
def test_rate_limit_with_any_retry_after_is_a_429(gateway: GatewayProcess, index: int, retry_after: str) -> None:
    response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=15,
                          json={"model": f"ra-{index}", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 429, (
        f"upstream 429 with Retry-After: {retry_after} reached the client as {response.status_code}: {response.text}"
    )
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert "x-pointsman-request-id" in response.headers
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    assert (record["status"], record["outcome"]) == (429, "error")
