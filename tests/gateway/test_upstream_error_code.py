"""An upstream's streamed error object is upstream text: its ``code`` reaches the decision record's
``error_message`` (and the dashboard) as a client's echo would, a short prefix with digits masked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.fakes.hostile import HostileUpstream, head
from tests.gatewayproc import GatewayProcess

CODE = "card 4111111111111111 of the prompt, quoted at length by a careless upstream"


async def _error_event(writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
    event = orjson.dumps({"error": {"message": "failed", "code": CODE}})
    writer.write(head() + b"data: " + event + b"\n\n")


def test_streamed_error_code_is_stored_masked(tmp_path: Path) -> None:
    upstream = HostileUpstream({"err": _error_event}).start()
    config = {"backends": [{"name": "h", "base_url": upstream.base_url, "health": {"enabled": False},
                            "models": [{"name": "m", "upstream_name": "err"}]}],
              "routes": [{"name": "auto", "model": "m"}]}
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200
        record = gateway.decision(response.headers["x-pointsman-request-id"])
    finally:
        assert gateway.terminate() == 0
        upstream.stop()
    assert record["error_type"] == "upstream_error"
    assert "4111" not in record["error_message"] and "careless upstream" not in record["error_message"]
    assert "card ####" in record["error_message"]
