"""Request fields OpenAI itself refuses are a 400 at the gateway, never forwarded.

A backend that does not check them answers worse than OpenAI would: llama.cpp's server reads
``max_tokens: 0`` or ``-1`` as "no limit" (one request then holds a core for as long as the context
allows) and answers a bad role or a numeric ``content`` with a 500, which the gateway retried three
times and turned into a 502. Valid shapes (an assistant turn that only calls tools, content parts) pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

USER = {"role": "user", "content": "hello"}


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [{"name": "fake-ok", "upstream_name": "ok"},
                       {"name": "reasoner", "upstream_name": "ok", "max_tokens_field": "max_completion_tokens"},
                       {"name": "legacy", "upstream_name": "ok", "max_tokens_field": "max_tokens"},
                       {"name": "o-series", "upstream_name": "ok", "max_tokens_field": "max_completion_tokens",
                        "drop_params": ["temperature", "top_p"]}],
        }],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-fields")).start()
    yield proc
    proc.terminate()


def _post(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/{path}", json=body, timeout=30)


@pytest.mark.parametrize(("extra", "param"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"n": True}, "n"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": [1]}, "top_p"),
    ({"tools": "x"}, "tools"),
    ({"tools": ["x"]}, "tools"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": ["text"]}]}, "messages.0.content"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream: true
    ({"stream": True, "stream_options": "usage"}, "stream_options"),
    ({"logprobs": "yes"}, "logprobs"),  # a cascade scores the log-probabilities a backend returns
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
])
def test_a_field_openai_refuses_is_a_400_naming_it(
    gateway: GatewayProcess, upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    user = uuid.uuid4().hex
    response = _post(gateway, "chat/completions", {"model": "fake-ok", "messages": [USER], "user": user, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert not upstream.state.requests[("ok", user)]  # never forwarded


def test_valid_shapes_pass(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is 6 x 7?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    body = {"model": "fake-ok", "messages": messages, "max_tokens": 5, "n": 1, "temperature": 0, "top_p": 1.0,
            "logprobs": True, "top_logprobs": 2, "stream_options": None}
    assert _post(gateway, "chat/completions", body).status_code == 200
    streamed = {"model": "fake-ok", "messages": [USER], "stream": True, "stream_options": {"include_usage": True}}
    assert _post(gateway, "chat/completions", streamed).status_code == 200
    # Completions' logprobs is a number of tokens, not chat's boolean.
    assert _post(gateway, "completions", {"model": "fake-ok", "prompt": "hi", "logprobs": 2}).status_code == 200
    completion = {"model": "fake-ok", "prompt": "hi", "max_tokens": 0}
    assert _post(gateway, "completions", completion).json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(("model", "sent", "forwarded"), [
    ("reasoner", {"max_tokens": 40}, {"max_completion_tokens": 40}),
    ("reasoner", {"max_tokens": 40, "max_completion_tokens": 60}, {"max_completion_tokens": 40}),
    ("reasoner", {"max_completion_tokens": 30}, {"max_completion_tokens": 30}),
    ("legacy", {"max_completion_tokens": 30}, {"max_tokens": 30}),
    ("fake-ok", {"max_completion_tokens": 30}, {"max_completion_tokens": 30}),  # unset: as the client sent it
])
def test_a_model_gets_its_completion_bound_under_the_name_its_api_takes(
    gateway: GatewayProcess, upstream: FakeUpstream, model: str, sent: dict[str, int], forwarded: dict[str, int]
) -> None:
    # OpenAI's reasoning models answer max_tokens with a 400 ("use max_completion_tokens instead"), and some
    # OpenAI-compatible servers ignore max_completion_tokens: a model's max_tokens_field names the one it takes.
    user = uuid.uuid4().hex
    response = _post(gateway, "chat/completions", {"model": model, "messages": [USER], "user": user, **sent})
    assert response.status_code == 200, response.text
    [body] = [b for b in upstream.state.bodies if b.get("user") == user]
    assert {k: body[k] for k in ("max_tokens", "max_completion_tokens") if k in body} == forwarded
    assert body["model"] == "ok" and body["messages"] == [USER]


def test_fields_a_model_refuses_are_dropped_on_the_way_upstream(
    gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    # OpenAI's reasoning models answer temperature 0 (which the judge and workflow steps send) with a 400.
    user = uuid.uuid4().hex
    sent = {"temperature": 0, "top_p": 0.9, "max_tokens": 40, "seed": 7}
    response = _post(gateway, "chat/completions", {"model": "o-series", "messages": [USER], "user": user, **sent})
    assert response.status_code == 200, response.text
    [body] = [b for b in upstream.state.bodies if b.get("user") == user]
    assert {k: body.get(k) for k in (*sent, "max_completion_tokens")} == {
        "temperature": None, "top_p": None, "max_tokens": None, "seed": 7, "max_completion_tokens": 40}
