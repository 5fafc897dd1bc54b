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


async def _error_after_a_token(writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
    token = orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                          "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
    event = orjson.dumps({"error": {"message": "failed", "code": CODE}})
    writer.write(head() + b"data: " + token + b"\n\n" + b"data: " + event + b"\n\n")


def test_streamed_error_code_is_stored_masked(tmp_path: Path) -> None:
    # After a token (the stream is committed): the error ends the stream and its code is in the record.
    # As the first event (nothing committed yet): the request fails over as for a 502, its message (the
    # client's and the record's) names the code the same way.
    upstream = HostileUpstream({"err": _error_event, "late": _error_after_a_token}).start()
    config = {"backends": [{"name": "h", "base_url": upstream.base_url, "health": {"enabled": False},
                            "models": [{"name": "m", "upstream_name": "err"}, {"name": "l", "upstream_name": "late"}]}],
              "retry": {"attempts": 1},
              "routes": [{"name": "auto", "model": "m"}]}
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        records = {}
        for model, status in (("l", 200), ("m", 502)):
            response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
                "model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == status, response.text
            if status != 200:  # a committed stream passes the upstream's own bytes on to its client, as sent
                assert "4111" not in response.text and "careless upstream" not in response.text
            records[model] = gateway.decision(response.headers["x-pointsman-request-id"])
    finally:
        assert gateway.terminate() == 0
        upstream.stop()
    assert (records["l"]["outcome"], records["l"]["error_type"]) == ("stream_error", "upstream_error")
    assert (records["m"]["outcome"], records["m"]["status"]) == ("error", 502)
    for record in records.values():
        assert "4111" not in record["error_message"] and "careless upstream" not in record["error_message"]
        assert "card ####" in record["error_message"], record["error_message"]
