"""Black-box: what applications send with today's openai SDK, through a route, a workflow and a concrete model.

One gateway subprocess serves a routed ``auto`` (rules + the trained difficulty head on the static
encoder), two cascades and concrete models, all over the fake upstream's ``multi`` model (``n``
choices, one call per tool, logprobs: what a full OpenAI server does). Each test checks that the
answer reaches the client intact, that the request's fields reach the upstream untouched, and that
the decision record (status, outcome, tokens, cost) is right.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.fakes.upstream import WORDS, FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

#: Prices (USD per million tokens in, out) of the gateway's models.
PRICES = {"small-model": (0.6, 0.6), "big-model": (10.0, 30.0), "multi-model": (1.0, 2.0),
          "draft": (1.0, 2.0), "unsure": (1.0, 2.0), "strong": (10.0, 30.0)}
STRONG_TEXT = "The strong answer."
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
]
MESSAGES = [{"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "Say hello."}]


def sdk_config(upstream: FakeUpstream) -> dict[str, Any]:
    def model(name: str, script: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "upstream_name": script, "input_cost_per_mtok": PRICES[name][0],
                "output_cost_per_mtok": PRICES[name][1], **extra}

    def cascade(name: str, first: str) -> dict[str, Any]:
        return {"name": name, "kind": "cascade", "stages": [first, "strong"],
                "confidence": {"source": "logprobs", "threshold": 0.7}}

    return {
        "backends": [{
            "name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
            "models": [
                model("small-model", "multi"), model("big-model", "multi", tags=["tools"]),
                model("multi-model", "multi"), model("draft", "lp-0.05"), model("unsure", "lp-0.60"),
                model("strong", f"say:{STRONG_TEXT}"), {"name": "hang-model", "upstream_name": "hang"},
            ],
        }],
        "classifiers": {"encoder": "static"},
        "workflows": [cascade("sure", "draft"), cascade("escalate", "unsure"), cascade("think", "multi-model")],
        "routes": [{
            "name": "auto", "policy": "rules",
            "rules": [{"name": "tools-need-big", "priority": 50, "when": {"signal": "tools", "op": "truthy"},
                       "action": {"route": "big-model"}}],
            "cost_quality": {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                             "threshold": 0.5},
        }],
    }


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(sdk_config(upstream), tmp_path_factory.mktemp("sdk")).start(timeout=60)
    yield proc
    proc.terminate()


@pytest.fixture
def client(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0, timeout=30)


def _user() -> str:
    return uuid.uuid4().hex


def _sent(upstream: FakeUpstream, user: str) -> list[dict[str, Any]]:
    """The bodies the upstream received on behalf of ``user``, oldest first."""
    return [b for b in upstream.state.bodies if b.get("user") == user]


def _cost(model: str, prompt: int, completion: int) -> float:
    return (prompt * PRICES[model][0] + completion * PRICES[model][1]) / 1e6


def _words(index: int) -> list[str]:
    return ["Choice", f" {index}", " says", " hi."]


def _assert_record(gateway: GatewayProcess, request_id: str, model: str, prompt: int, completion: int,
                   *, stream: bool = False) -> dict[str, Any]:
    record = gateway.decision(request_id)
    assert (record["status"], record["outcome"], record["model"]) == (200, "ok", model)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (prompt, completion)
    assert record["cost_usd"] == pytest.approx(_cost(model, prompt, completion))
    assert record["stream"] == int(stream)
    return record


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_current_request_fields_reach_the_upstream_untouched(
    client: OpenAI, upstream: FakeUpstream, gateway: GatewayProcess, model: str
) -> None:
    user = _user()
    fields: dict[str, Any] = {
        "max_completion_tokens": 64, "reasoning_effort": "low", "seed": 7, "stop": ["END", "\n\n"],
        "metadata": {"app": "sdk-test", "ticket": "42"}, "store": False,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "greeting", "strict": True,
            "schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                       "additionalProperties": False}}},
    }
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, user=user, extra_body={"vendor": {"top_k": 5}},
        extra_headers={"x-test": "1"}, **fields,
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "Choice 0 says hi."
    sent = _sent(upstream, user)[-1]
    for key, value in fields.items():
        assert sent[key] == value, key
    assert sent["vendor"] == {"top_k": 5} and sent["messages"] == MESSAGES
    assert "max_tokens" not in sent
    answered = raw.headers["x-pointsman-model"]
    assert answered in (("small-model", "big-model") if model == "auto" else ("multi-model",))
    assert raw.headers["x-pointsman-route"] == ("auto" if model == "auto" else "direct")
    _assert_record(gateway, raw.headers["x-pointsman-request-id"], answered, 11, 4)


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_json_object_response_format(client: OpenAI, upstream: FakeUpstream, model: str) -> None:
    user = _user()
    client.chat.completions.create(model=model, messages=MESSAGES, user=user,
                                   response_format={"type": "json_object"})
    assert _sent(upstream, user)[-1]["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_several_tool_calls_non_streamed(client: OpenAI, upstream: FakeUpstream, model: str) -> None:
    user = _user()
    completion = client.chat.completions.create(
        model=model, messages=MESSAGES, user=user, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_0_0", "get_weather", {"k": 0}), ("call_0_1", "get_time", {"k": 1})]
    sent = _sent(upstream, user)[-1]
    assert sent["tools"] == TOOLS and sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is True


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_several_streamed_tool_calls_in_several_choices(
    client: OpenAI, gateway: GatewayProcess, model: str
) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=True, n=2, stream=True, stream_options={"include_usage": True},
    ) as response:
        request_id, answered = response.headers["x-pointsman-request-id"], response.headers["x-pointsman-model"]
        chunks = list(response.parse())
    calls: dict[tuple[int, int], dict[str, str]] = {}
    finishes = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault((choice.index, call.index), {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function.name or "") if call.function else ""
                slot["arguments"] += (call.function.arguments or "") if call.function else ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert calls == {(i, k): {"id": f"call_{i}_{k}", "name": name, "arguments": f'{{"k":{k}}}'}
                     for i in range(2) for k, name in enumerate(["get_weather", "get_time"])}
    assert finishes == {0: "tool_calls", 1: "tool_calls"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert answered == ("big-model" if model == "auto" else "multi-model")
    _assert_record(gateway, request_id, answered, 11, 8, stream=True)


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_n_choices_plain(client: OpenAI, gateway: GatewayProcess, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, n=3)
    completion = raw.parse()
    assert [(c.index, c.message.content) for c in completion.choices] == [
        (i, f"Choice {i} says hi.") for i in range(3)]
    _assert_record(gateway, raw.headers["x-pointsman-request-id"], raw.headers["x-pointsman-model"], 11, 12)


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_n_choices_streamed(client: OpenAI, gateway: GatewayProcess, model: str) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, n=3, stream=True, stream_options={"include_usage": True},
    ) as response:
        request_id, answered = response.headers["x-pointsman-request-id"], response.headers["x-pointsman-model"]
        chunks = list(response.parse())
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {i: f"Choice {i} says hi." for i in range(3)}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    _assert_record(gateway, request_id, answered, 11, 12, stream=True)


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_streamed_logprobs(client: OpenAI, upstream: FakeUpstream, model: str) -> None:
    user = _user()
    stream = client.chat.completions.create(model=model, messages=MESSAGES, user=user, stream=True,
                                            logprobs=True, top_logprobs=3)
    tokens = []
    for chunk in stream:
        for choice in chunk.choices:
            for item in (choice.logprobs.content or []) if choice.logprobs else []:
                assert item.logprob == pytest.approx(-0.1) and len(item.top_logprobs) == 3
                tokens.append(item.token)
    assert tokens == _words(0)
    sent = _sent(upstream, user)[-1]
    assert sent["logprobs"] is True and sent["top_logprobs"] == 3


def test_include_usage_through_a_route(client: OpenAI, gateway: GatewayProcess) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="auto", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
    ) as response:
        request_id, answered = response.headers["x-pointsman-request-id"], response.headers["x-pointsman-model"]
        chunks = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Choice 0 says hi."
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (11, 4)
    _assert_record(gateway, request_id, answered, 11, 4, stream=True)


@pytest.mark.parametrize(("workflow", "answer"), [("cascade/sure", "".join(WORDS)), ("cascade/escalate", STRONG_TEXT)])
def test_include_usage_through_a_workflow(
    client: OpenAI, gateway: GatewayProcess, workflow: str, answer: str
) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=workflow, messages=MESSAGES, stream=True, stream_options={"include_usage": True},
        max_completion_tokens=50, reasoning_effort="low",
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        chunks = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    usage = chunks[-1].usage
    record = gateway.decision(request_id)
    assert (record["status"], record["outcome"]) == (200, "ok")
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (record["prompt_tokens"], record["completion_tokens"])
    calls = 1 if workflow == "cascade/sure" else 2
    assert record["prompt_tokens"] == 11 * calls
    expected = _cost("draft", 11, 7) if calls == 1 else _cost("unsure", 11, 7) + _cost("strong", 11, 3)
    assert record["cost_usd"] == pytest.approx(expected)


def test_workflow_stream_without_include_usage_has_no_usage_chunk(client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="cascade/escalate", messages=MESSAGES, stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == STRONG_TEXT


@pytest.mark.parametrize("model", ["auto", "multi-model"])
@pytest.mark.parametrize("stream", [False, True])
def test_image_and_audio_parts(
    client: OpenAI, upstream: FakeUpstream, gateway: GatewayProcess, model: str, stream: bool
) -> None:
    user = _user()
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "What is in this picture, and what is said in the recording?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ]
    messages: list[Any] = [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                           {"role": "user", "content": content}]
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, user=user, stream=stream)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = raw.parse().choices[0].message.content or ""
    assert text == "Choice 0 says hi."
    assert _sent(upstream, user)[-1]["messages"] == messages
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert (record["status"], record["outcome"]) == (200, "ok")


def test_raw_response_headers_and_per_request_timeout(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.with_options(timeout=5.0, max_retries=0).chat.completions.with_raw_response.create(
        model="auto", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "Choice 0 says hi."
    headers = {k: v for k, v in raw.headers.items() if k.startswith("x-pointsman-")}
    assert {"x-pointsman-request-id", "x-pointsman-model", "x-pointsman-backend", "x-pointsman-route",
            "x-pointsman-overhead-ms"} <= set(headers)
    assert headers["x-pointsman-backend"] == "fake" and headers["x-pointsman-route"] == "auto"
    assert gateway.decision(headers["x-pointsman-request-id"])["model"] == headers["x-pointsman-model"]


def test_twenty_concurrent_async_streams(gateway: GatewayProcess) -> None:
    async def one(client: AsyncOpenAI, index: int) -> tuple[str, str, int]:
        response = await client.chat.completions.with_raw_response.create(
            model="auto" if index % 2 else "multi-model", messages=MESSAGES, stream=True,
            stream_options={"include_usage": True}, user=f"async-{index}")
        text, completion = "", 0
        async for chunk in response.parse():
            text += "".join(c.delta.content or "" for c in chunk.choices)
            completion = chunk.usage.completion_tokens if chunk.usage else completion
        return response.headers["x-pointsman-request-id"], text, completion

    async def run() -> list[tuple[str, str, int]]:
        async with AsyncOpenAI(base_url=gateway.base_url, api_key="sk", max_retries=0, timeout=30) as client:
            return await asyncio.gather(*(one(client, i) for i in range(20)))

    results = asyncio.run(run())
    assert [(text, completion) for _, text, completion in results] == [("Choice 0 says hi.", 4)] * 20
    assert len({request_id for request_id, _, _ in results}) == 20
    for request_id, _, _ in results:
        record = gateway.decision(request_id)
        assert (record["status"], record["outcome"], record["completion_tokens"]) == (200, "ok", 4)


def test_legacy_completions_streamed(client: OpenAI, gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    user = _user()
    with client.completions.with_streaming_response.create(
        model="multi-model", prompt="Say hello", stream=True, stream_options={"include_usage": True},
        max_tokens=16, user=user, seed=3, stop=["\n"],
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        chunks = list(response.parse())
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "".join(WORDS)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(WORDS)
    sent = _sent(upstream, user)[-1]
    assert (sent["prompt"], sent["seed"], sent["stop"]) == ("Say hello", 3, ["\n"])
    record = gateway.decision(request_id)
    assert record["endpoint"] == "completions"
    _assert_record(gateway, request_id, "multi-model", 2, len(WORDS), stream=True)


@pytest.mark.parametrize("model", ["auto", "multi-model"])
def test_legacy_function_result_with_no_content(
    client: OpenAI, upstream: FakeUpstream, gateway: GatewayProcess, model: str
) -> None:
    """A deprecated function-calling conversation whose function returned nothing: the SDK types a
    ``function`` turn's content ``Optional[str]`` (as OpenAI's spec does), so null must be served."""
    user = _user()
    messages: list[Any] = [
        {"role": "user", "content": "Turn the lights off."},
        {"role": "assistant", "content": None, "function_call": {"name": "lights_off", "arguments": "{}"}},
        {"role": "function", "name": "lights_off", "content": None},
    ]
    functions = [{"name": "lights_off", "parameters": {"type": "object", "properties": {}}}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, functions=functions, user=user)
    assert raw.parse().choices[0].message.content == "Choice 0 says hi."
    sent = _sent(upstream, user)[-1]
    assert sent["messages"] == messages and sent["functions"] == functions
    _assert_record(gateway, raw.headers["x-pointsman-request-id"], raw.headers["x-pointsman-model"], 11, 4)


@pytest.mark.parametrize("model", ["multi-model", "cascade/think"])
def test_reasoning_content_reaches_a_streaming_client(client: OpenAI, model: str) -> None:
    """A reasoning model's ``reasoning_content`` (vLLM, DeepSeek) is part of its answer: a client
    streaming a workflow whose checked stage answered (written out as chunks) gets it as a direct one does."""
    whole = client.chat.completions.create(model=model, messages=MESSAGES, reasoning_effort="low")
    assert (whole.choices[0].message.model_extra or {}).get("reasoning_content") == "Thinking."
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, reasoning_effort="low", stream=True,
    ) as response:
        assert response.headers["x-pointsman-model"] == "multi-model"  # the cascade's first stage answered
        chunks = [c for c in response.parse() if c.choices]
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert reasoning == "Thinking."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Choice 0 says hi."


@pytest.mark.parametrize("stream", [False, True])
def test_client_timeout_cancels_the_upstream_call(
    client: OpenAI, upstream: FakeUpstream, gateway: GatewayProcess, stream: bool
) -> None:
    """``with_options(timeout=...)`` running out: the SDK gives up, the gateway drops the upstream call
    (the model stops generating) and records the request as the client's disconnect."""
    def hung() -> list[dict[str, Any]]:  # an earlier test's record may still be landing: only this model's
        return [r for r in gateway.decisions() if r["model"] == "hang-model"]

    records, dropped = len(hung()), upstream.state.disconnects["hang"]
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).chat.completions.create(
            model="hang-model", messages=MESSAGES, stream=stream, user=_user())
    eventually(lambda: len(hung()) > records, "the request's decision record", timeout=10)
    record = hung()[-1]
    assert (record["model"], record["status"], record["outcome"], record["stream"]) == (
        "hang-model", 499, "client_disconnected", int(stream))
    eventually(lambda: upstream.state.disconnects["hang"] > dropped, "the upstream call dropped", timeout=10)
