"""Black-box: the official openai SDK against a gateway subprocess, fake upstream on loopback."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from openai import OpenAI

from tests.fakes.upstream import WORDS, FakeUpstream, stream_events
from tests.gatewayproc import GatewayProcess

HEADERS = ("x-pointsman-request-id", "x-pointsman-model", "x-pointsman-backend", "x-pointsman-route",
           "x-pointsman-overhead-ms")
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello."},
]
TOOLS = [{
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather for a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}},
}]


def _key() -> str:
    return uuid.uuid4().hex


def test_chat_non_stream_through_route(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    completion = raw.parse()
    assert completion.choices[0].message.content == "".join(WORDS)
    assert completion.usage is not None and completion.usage.prompt_tokens == 11
    for header in HEADERS:
        assert raw.headers.get(header), header
    assert raw.headers["x-pointsman-model"] == "fake-ok"
    assert raw.headers["x-pointsman-backend"] == "fake"
    assert raw.headers["x-pointsman-route"] == "auto"
    assert float(raw.headers["x-pointsman-overhead-ms"]) >= 0
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert record["route"] == "auto" and record["model"] == "fake-ok" and record["status"] == 200
    assert record["prompt_tokens"] == 11 and record["completion_tokens"] == 7
    assert record["cost_usd"] == pytest.approx((11 * 1.0 + 7 * 2.0) / 1e6)
    assert json.loads(record["decision"])["candidates"] == ["fake-ok"]


def test_concrete_model_goes_direct_with_upstream_name(client: OpenAI, upstream: FakeUpstream) -> None:
    user = _key()
    raw = client.chat.completions.with_raw_response.create(model="fake-ok", messages=MESSAGES, user=user)
    assert raw.headers["x-pointsman-route"] == "direct"
    sent = [b for b in upstream.state.bodies if b.get("user") == user][-1]
    assert sent["model"] == "ok"  # the backend's own name for the model
    assert sent["messages"] == MESSAGES


def test_unused_request_fields_are_forwarded_untouched(client: OpenAI, upstream: FakeUpstream) -> None:
    user = _key()
    client.chat.completions.create(
        model="auto", messages=MESSAGES, user=user, tools=TOOLS, tool_choice="auto",
        response_format={"type": "json_object"}, logprobs=True, top_logprobs=2, n=1, seed=7,
        stop=["END"], temperature=0.3, max_tokens=12, extra_body={"vendor_specific": {"x": [1, 2]}},
    )
    sent = [b for b in upstream.state.bodies if b.get("user") == user][-1]
    assert sent["tools"] == TOOLS and sent["tool_choice"] == "auto"
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["logprobs"] is True and sent["top_logprobs"] == 2 and sent["n"] == 1 and sent["seed"] == 7
    assert sent["stop"] == ["END"] and sent["temperature"] == 0.3 and sent["max_tokens"] == 12
    assert sent["vendor_specific"] == {"x": [1, 2]}


def test_upstream_gets_backend_key_not_client_key(client: OpenAI, upstream: FakeUpstream) -> None:
    user = _key()
    client.chat.completions.create(model="auto", messages=MESSAGES, user=user)
    index = max(i for i, b in enumerate(upstream.state.bodies) if b.get("user") == user)
    assert upstream.state.headers[index]["authorization"] == "Bearer sk-upstream-secret"


def test_chat_stream_content_and_usage(client: OpenAI, gateway: GatewayProcess) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="auto", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ) as response:
        for header in HEADERS:
            assert response.headers.get(header), header
        request_id = response.headers["x-pointsman-request-id"]
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(WORDS)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(WORDS)
    record = gateway.decision(request_id)
    assert record["stream"] == 1 and record["outcome"] == "ok"
    assert record["ttft_ms"] is not None and record["completion_tokens"] == len(WORDS)


def test_chat_stream_tool_call_deltas(client: OpenAI) -> None:
    stream = client.chat.completions.create(model="auto", messages=MESSAGES, tools=TOOLS, stream=True)
    name, arguments, finish = "", "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            name += call.function.name or "" if call.function else ""
            arguments += call.function.arguments or "" if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert name == "get_weather"
    assert json.loads(arguments) == {"city": "Paris"}
    assert finish == "tool_calls"


def test_chat_non_stream_tool_call(client: OpenAI) -> None:
    completion = client.chat.completions.create(model="auto", messages=MESSAGES, tools=TOOLS)
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_stream_bytes_are_passed_through_unchanged(gateway: GatewayProcess) -> None:
    body = {"model": "fake-ok", "messages": MESSAGES, "stream": True, "tools": TOOLS,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        received = b"".join(response.iter_raw())
    expected = b"".join(stream_events({**body, "model": "ok"}, WORDS))
    assert received == expected


def test_completions(client: OpenAI) -> None:
    raw = client.completions.with_raw_response.create(model="fake-ok", prompt="Hello", max_tokens=1)
    assert raw.parse().choices[0].text == " world"
    assert raw.headers["x-pointsman-model"] == "fake-ok"


def test_embeddings(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.embeddings.with_raw_response.create(model="fake-ok", input=["a", "b"])
    result = raw.parse()
    assert [len(d.embedding) for d in result.data] == [3, 3]
    assert gateway.decision(raw.headers["x-pointsman-request-id"])["endpoint"] == "embeddings"


def test_models_lists_backend_models_and_routes(client: OpenAI) -> None:
    models = {m.id: m.owned_by for m in client.models.list()}
    assert models["fake-ok"] == "fake"
    assert models["backup-ok"] == "backup"
    assert models["auto"] == "pointsman-route"


def test_unknown_model_is_404_in_openai_shape(client: OpenAI, gateway: GatewayProcess) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found" and error["param"] == "model"
    request_id = info.value.response.headers["x-pointsman-request-id"]
    assert gateway.decision(request_id)["status"] == 404


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "auto"}', "messages"),
        (b'{"model": "auto", "messages": []}', "messages"),
        (b'{"model": "auto", "messages": ["hi"]}', "messages.0"),
        (b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(gateway: GatewayProcess, payload: bytes, param: str | None) -> None:
    response = httpx.post(f"{gateway.base_url}/chat/completions", content=payload,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert response.headers["x-pointsman-request-id"]


def test_bad_request_via_sdk_raises_bad_request_error(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="auto", messages=[])


def test_upstream_4xx_is_passed_through_and_not_retried(client: OpenAI, upstream: FakeUpstream) -> None:
    user = _key()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake-bad-request", messages=MESSAGES, user=user)
    assert info.value.body["param"] == "tools"  # type: ignore[index]
    assert upstream.state.requests[("bad-request", user)] == 1


def test_unknown_path_and_method_are_openai_shaped(gateway: GatewayProcess) -> None:
    missing = httpx.get(f"{gateway.base_url}/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = httpx.get(f"{gateway.base_url}/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"
    for response in (missing, wrong, httpx.get(f"{gateway.base_url}/models")):
        for header in HEADERS:
            assert header in response.headers, (response.url, header)


def test_health_ready_and_metrics(gateway: GatewayProcess, client: OpenAI) -> None:
    client.chat.completions.create(model="auto", messages=MESSAGES)
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{gateway.url}/ready").status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'pointsman_requests_total{backend="fake",model="fake-ok",outcome="ok",route="auto",status="200"}' in metrics
    assert "pointsman_request_duration_seconds_bucket" in metrics
    assert "pointsman_time_to_first_token_seconds" in metrics
    assert 'pointsman_tokens_total{backend="fake",kind="prompt",model="fake-ok",route="auto"}' in metrics
    assert "pointsman_cost_usd_total" in metrics
    assert 'pointsman_breaker_state{backend="fake"' in metrics
    assert "pointsman_decision_log_written_total" in metrics
    assert "pointsman_decision_log_write_errors_total 0.0" in metrics


def test_models_retrieve_gives_one_entry_or_a_404(client: OpenAI, gateway: GatewayProcess) -> None:
    # The SDK's models.retrieve (used by clients checking a model exists) is GET /v1/models/{id}.
    listed = {m.id: m for m in client.models.list()}
    for name in ("fake-ok", "auto"):
        assert client.models.retrieve(name) == listed[name]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no/such-model")
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found" and error["param"] == "model"
