"""Fault tests: real fake upstreams on loopback misbehave; the gateway retries, falls back, or fails
cleanly in OpenAI's shape — and the decision log holds a record of each request."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from openai import OpenAI

from gateway.app import create_app
from gateway.config import parse_config
from tests.conftest import standard_config
from tests.fakes.upstream import FAILS, WORDS, FakeUpstream, free_port
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

MESSAGES = [{"role": "user", "content": "hello"}]


def _key() -> str:
    return uuid.uuid4().hex


def _request_id(exc: openai.APIStatusError) -> str:
    return exc.response.headers["x-pointsman-request-id"]


def test_upstream_down_without_fallback_is_502(client: OpenAI, gateway: GatewayProcess) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="down-model", messages=MESSAGES)
    assert info.value.status_code == 502
    assert info.value.body["type"] == "upstream_error"  # type: ignore[index]
    record = gateway.decision(_request_id(info.value))
    assert record["status"] == 502 and record["outcome"] == "error" and record["attempts"] == 3


def test_upstream_down_falls_back_in_order(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="resilient", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "".join(WORDS)
    assert raw.headers["x-pointsman-model"] == "backup-ok"
    assert raw.headers["x-pointsman-backend"] == "backup"
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert record["model"] == "backup-ok" and record["attempts"] == 4  # 3 on the dead one, 1 on backup
    assert json.loads(record["decision"])["candidates"] == ["down-model", "backup-ok"]


def test_model_level_fallback(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="down-model-fb", messages=MESSAGES)
    assert raw.headers["x-pointsman-model"] == "backup-ok"


def test_500_then_success_is_retried(client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    user = _key()
    raw = client.chat.completions.with_raw_response.create(model="fake-flaky-500", messages=MESSAGES, user=user)
    assert raw.parse().choices[0].message.content == "".join(WORDS)
    assert upstream.state.requests[("flaky-500", user)] == FAILS + 1
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert record["attempts"] == FAILS + 1 and record["status"] == 200


def test_500_forever_falls_back(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="fake-always-500-fb", messages=MESSAGES)
    assert raw.headers["x-pointsman-model"] == "backup-ok"


def test_500_forever_without_fallback_is_502(client: OpenAI, gateway: GatewayProcess) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="fake-always-500", messages=MESSAGES)
    assert info.value.status_code == 502
    assert "HTTP 500" in info.value.body["message"]  # type: ignore[index]
    assert gateway.decision(_request_id(info.value))["attempts"] == 3


def test_429_with_retry_after_is_honoured(client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    user = _key()
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(model="fake-rate-limited", messages=MESSAGES, user=user)
    elapsed = time.monotonic() - started
    assert raw.parse().choices[0].message.content
    assert elapsed >= 0.95, "the retry must wait for Retry-After: 1"
    assert upstream.state.requests[("rate-limited", user)] == 2
    assert gateway.decision(raw.headers["x-pointsman-request-id"])["attempts"] == 2


def test_hang_before_first_byte_is_504(client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    before = upstream.state.disconnects["hang"]
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="fake-hang", messages=MESSAGES)
    assert info.value.status_code == 504
    assert info.value.body["code"] == "upstream_timeout"  # type: ignore[index]
    assert time.monotonic() - started < 8  # 3 attempts x 1 s first-byte timeout, plus back-off
    record = gateway.decision(_request_id(info.value))
    assert record["status"] == 504 and record["attempts"] == 3
    eventually(lambda: upstream.state.disconnects["hang"] >= before + 3, "the upstream requests were dropped")


def test_hang_falls_back(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="fake-hang-fb", messages=MESSAGES)
    assert raw.headers["x-pointsman-model"] == "backup-ok"


def test_stream_headers_then_silence_is_retried_then_504(client: OpenAI, gateway: GatewayProcess) -> None:
    # The upstream sends 200 + headers, then nothing: nothing was sent to the client yet, so it is retried.
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="fake-hang-body", messages=MESSAGES, stream=True)
    assert info.value.status_code == 504
    assert gateway.decision(_request_id(info.value))["attempts"] == 3


def test_stall_mid_stream_ends_with_error_event(client: OpenAI, gateway: GatewayProcess) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="fake-stall-midstream", messages=MESSAGES, stream=True
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        received = []
        with pytest.raises(openai.APIError, match="stalled"):
            for chunk in response.parse():
                received.append(chunk)
    assert len(received) == 2  # what arrived before the stall was delivered
    record = gateway.decision(request_id)
    assert record["status"] == 200 and record["outcome"] == "stream_error"
    assert record["error_type"] == "idle_timeout"


def test_reset_mid_stream_ends_with_error_event(client: OpenAI, gateway: GatewayProcess) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="fake-reset-midstream", messages=MESSAGES, stream=True
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        with pytest.raises(openai.APIError, match="upstream stream"):
            list(response.parse())
    record = gateway.decision(request_id)
    assert record["outcome"] == "stream_error" and record["error_type"] in ("reset", "truncated")


def test_stream_ending_cleanly_without_done_ends_with_truncated_event(
    client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    # The upstream ends its body properly (chunked terminator, no transport error) after two chunks
    # but never sends [DONE]: only the missing [DONE] says the answer was cut short.
    user = _key()
    with client.chat.completions.with_streaming_response.create(
        model="fake-truncated-stream", messages=MESSAGES, stream=True, user=user
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        received = []
        with pytest.raises(openai.APIError) as info:
            for chunk in response.parse():
                received.append(chunk)
    assert [c.choices[0].delta.content for c in received] == ["", WORDS[0]]  # delivered before the error
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "truncated", info.value.body
    assert info.value.body["type"] == "upstream_error"
    assert upstream.state.requests[("truncated-stream", user)] == 1  # bytes were sent: never retried
    record = gateway.decision(request_id)
    assert record["status"] == 200 and record["outcome"] == "stream_error"
    assert record["error_type"] == "truncated" and record["attempts"] == 1


def test_malformed_json_is_502(client: OpenAI, gateway: GatewayProcess) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="fake-malformed", messages=MESSAGES)
    assert info.value.status_code == 502
    assert "not valid JSON" in info.value.body["message"]  # type: ignore[index]
    assert gateway.decision(_request_id(info.value))["error_type"] == "bad_gateway"


def test_a_stream_request_answered_without_an_event_stream_is_502(
    client: OpenAI, gateway: GatewayProcess
) -> None:
    """A 200 JSON body to ``stream: true`` used to pass as an empty "stream": no chunks, no error."""
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="fake-malformed", messages=MESSAGES, stream=True)
    assert info.value.status_code == 502
    assert "without an event stream" in info.value.body["message"]  # type: ignore[index]
    record = gateway.decision(_request_id(info.value))
    assert record["outcome"] == "error" and record["attempts"] == 3  # malformed answers are retried


def test_slow_drip_stream_completes(client: OpenAI, gateway: GatewayProcess) -> None:
    # 0.25 s between chunks stays under the 0.6 s idle timeout: the stream must complete.
    with client.chat.completions.with_streaming_response.create(
        model="fake-slow-drip", messages=MESSAGES, stream=True
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text == "".join(WORDS)
    record = gateway.decision(request_id)
    assert record["outcome"] == "ok" and record["latency_ms"] > 1000


def test_client_disconnect_cancels_upstream(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    before = upstream.state.disconnects["hang"]
    body = {"model": "fake-hang", "messages": MESSAGES}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=0.3)
    # The gateway notices at once and drops its upstream request (well before its 1 s first-byte timeout).
    eventually(lambda: upstream.state.disconnects["hang"] > before, "the upstream request was dropped", timeout=0.9)
    eventually(lambda: any(r["outcome"] == "client_disconnected" for r in gateway.decisions()), "recorded")


def test_client_disconnect_mid_stream_cancels_upstream(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    before = upstream.state.disconnects["stall-midstream"]
    body = {"model": "fake-stall-midstream", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body, timeout=5) as response:
        request_id = response.headers["x-pointsman-request-id"]
        next(response.iter_raw())
    # Closing our side mid-stream must make the gateway drop the upstream before its 0.6 s idle timeout.
    eventually(lambda: upstream.state.disconnects["stall-midstream"] > before, "upstream dropped", timeout=0.5)
    assert gateway.decision(request_id)["outcome"] == "client_disconnected"



def test_under_another_asgi_server_a_disconnect_still_cancels_the_upstream_call(
    upstream: FakeUpstream, backup_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # create_app served by stock uvicorn (not the gateway's own HTTP front, which fires a callback at
    # the disconnect): the service then watches receive() for http.disconnect itself.
    config = standard_config(upstream, backup_upstream)
    config["store"] = {"kind": "sqlite", "path": str(tmp_path / "pointsman.db"), "flush_interval": 0.05}
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(parse_config(config)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started, "stock uvicorn serving the app", timeout=30)
        before = upstream.state.disconnects["hang"]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=0.3,
                       json={"model": "fake-hang", "messages": MESSAGES})
        # At once: well before the backend's 1 s first-byte timeout would drop it anyway (0.3 + 0.5 s).
        eventually(lambda: upstream.state.disconnects["hang"] > before, "the upstream request was dropped", timeout=0.5)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_a_stream_that_begins_with_an_error_event_falls_back(
    client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    # An aggregator keeps the connection open with SSE comments, then streams the provider's failure as
    # its first event. Committed at the first comment, the client got a broken stream; nothing had been
    # sent, so the gateway retries and falls back as for an HTTP 502.
    user = _key()
    raw = client.chat.completions.with_raw_response.create(
        model="fake-error-event-fb", messages=MESSAGES, stream=True, user=user)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert text == "".join(WORDS)
    assert upstream.state.requests[("error-event:502", user)] == 3  # retried, as a 502 is
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert (record["model"], record["outcome"], record["attempts"]) == ("backup-ok", "ok", 4)


def test_a_stream_the_upstream_refuses_in_its_first_event_is_a_plain_error_answer(
    client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    # The request's own fault (too long for the model): passed on with the upstream's error object, as
    # the non-streamed answer would be, and not retried.
    user = _key()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake-error-event-refused", messages=MESSAGES, stream=True, user=user)
    assert info.value.code == "context_length_exceeded"
    assert upstream.state.requests[("error-event:context", user)] == 1
    record = gateway.decision(_request_id(info.value))
    assert (record["status"], record["attempts"]) == (400, 1)


def test_comments_before_the_first_token_pass_through(client: OpenAI, gateway: GatewayProcess) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="fake-comments-first", messages=MESSAGES, stream=True
    ) as response:
        raw = b"".join(response.iter_bytes())
    assert raw.startswith(b": PROCESSING\n\n: PROCESSING\n\ndata: ")  # the upstream's bytes, as sent
    assert raw.endswith(b"data: [DONE]\n\n")
