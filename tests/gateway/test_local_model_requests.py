"""The embedded SmolLM2 child under requests the stock llama-cpp-python server mishandles.

One real llama.cpp child per module, driven over HTTP. What is checked: client errors are 400s in
OpenAI's shape (the stock server answered 500s, which the gateway retried and reported as 502s);
valid OpenAI conversations the model's template could not render are rendered; ``n`` > 1 is refused;
a streamed context overflow is the same 400 as an unstreamed one; a generation stops once its client
disconnects.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from gateway._llama_child import STATS_PATH
from gateway.config import LocalModelConfig
from gateway.local_model import LocalModelServer

pytestmark = pytest.mark.e2e

# One thread: on a 2-core box a second llama.cpp thread contends with the test process itself.
CONFIG = LocalModelConfig(enabled=True, n_threads=1, startup_timeout=60)
MODEL = "smollm2-135m"
EOS = "2"  # SmolLM2's <|im_end|>; a -100 bias on it makes a generation run to max_tokens
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}
TOOL = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[LocalModelServer]:
    local = LocalModelServer(CONFIG)
    await local.start()
    yield local
    await local.stop()


@pytest.fixture
async def http(server: LocalModelServer) -> AsyncIterator[httpx.AsyncClient]:
    assert server.base_url is not None
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        yield client


def chat(**fields: Any) -> dict[str, Any]:
    """A small chat request (8 tokens, temperature 0) with ``fields`` added."""
    return {"model": MODEL, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}], **fields}


def assert_refused(response: httpx.Response, param: str, *words: str) -> dict[str, Any]:
    """A 400 in OpenAI's error shape naming ``param``, whose message contains ``words``."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error
    return dict(error)


async def stats(http: httpx.AsyncClient) -> dict[str, int]:
    response = await http.get(f"http://127.0.0.1:{http.base_url.port}{STATS_PATH}")
    assert response.status_code == 200
    return dict(response.json())


# ----------------------------------------------------------------------------- rendered, not refused


async def test_tool_call_follow_up_is_answered(http: httpx.AsyncClient) -> None:
    """The standard tool-calling follow-up: assistant content null with tool_calls, then a tool result."""
    messages = [
        {"role": "user", "content": "What is 6 times 7? Use the tool."},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    response = await http.post("/chat/completions", json=chat(messages=messages, tools=[TOOL], max_tokens=16))
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body["choices"][0]["message"]["content"], str)
    # The call and its result reached the prompt as text (a bare user turn is ~30 tokens).
    assert body["usage"]["prompt_tokens"] > 60


async def test_tool_results_and_text_parts_render_as_text(http: httpx.AsyncClient) -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Multiply"}, {"type": "text", "text": "6 by 7."}]},
        {"role": "assistant", "content": "Calling the tool.", "tool_calls": [TOOL_CALL, {**TOOL_CALL, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "42"},
        {"role": "assistant", "content": None, "function_call": {"name": "multiply", "arguments": "not json"}},
        {"role": "function", "name": "multiply", "content": "42"},
    ]
    response = await http.post("/chat/completions", json=chat(messages=messages))
    assert response.status_code == 200, response.text


async def test_json_schema_response_format_is_followed(http: httpx.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "number", "schema": schema, "strict": True}}
    response = await http.post("/chat/completions", json=chat(
        messages=[{"role": "user", "content": "Give me a number."}], response_format=response_format, max_tokens=40,
    ))
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert isinstance(json.loads(choice["message"]["content"])["answer"], int)


async def test_tools_without_parameters_and_a_named_tool_choice(http: httpx.AsyncClient) -> None:
    """``parameters`` is optional in OpenAI's API; a named tool_choice makes llama.cpp call that tool."""
    tool = {"type": "function", "function": {"name": "ping"}}
    choice = {"type": "function", "function": {"name": "ping"}}
    response = await http.post("/chat/completions", json=chat(tools=[tool], tool_choice=choice, max_tokens=16))
    assert response.status_code == 200, response.text
    calls = response.json()["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["ping"]


async def test_max_completion_tokens_is_honoured(http: httpx.AsyncClient) -> None:
    request = chat(max_completion_tokens=3, logit_bias={EOS: -100})
    del request["max_tokens"]
    response = await http.post("/chat/completions", json=request)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


# ----------------------------------------------------------------------------- refused with a 400


async def test_an_image_part_is_refused_naming_it(http: httpx.AsyncClient) -> None:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    response = await http.post("/chat/completions", json=chat(messages=[{"role": "user", "content": content}]))
    error = assert_refused(response, "messages[0].content[1]", "image_url", "text only")
    assert error["code"] == "unsupported_value"


@pytest.mark.parametrize(
    ("fields", "param", "word"),
    [
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"tools": "x"}, "tools", "valid list"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "json_object"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "valid string"),
        ({"stop": 3}, "stop", "valid string"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias", "token id"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias", "token id"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice",
         "'other'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
         "response_format.json_schema.schema", "schema"),
    ],
)
async def test_malformed_fields_are_400s_naming_the_field(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str, word: str
) -> None:
    assert_refused(await http.post("/chat/completions", json=chat(**fields)), param, word)


@pytest.mark.parametrize("stream", [False, True])
async def test_n_above_one_is_refused(http: httpx.AsyncClient, stream: bool) -> None:
    response = await http.post("/chat/completions", json=chat(n=2, stream=stream))
    assert_refused(response, "n", "one choice")
    ok = await http.post("/chat/completions", json=chat(n=1))
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"prompt": ["a", "b"]}, "prompt"),
     ({"echo": True, "logprobs": 1}, "echo"), ({"temperature": "hot"}, "temperature")],
)
async def test_text_completions_refuse_what_they_cannot_serve(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    request = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, **fields}
    assert_refused(await http.post("/completions", json=request), param)


async def test_a_body_that_is_not_an_object_is_a_400(http: httpx.AsyncClient) -> None:
    response = await http.post("/chat/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # llama.cpp cannot parse it: the stock server added a NULL sampler and died of SIGSEGV.
        ({"grammar": "root ::= garbage("}, "grammar"),
        # It parses, but no token can ever match: llama.cpp aborted on the first token.
        ({"grammar": "root ::= [^\\x00-\\U0010FFFF]"}, "grammar"),
        # Valid OpenAI: llama-cpp-python's schema converter writes this const as a NUL the model cannot produce.
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": "\u0000"}}}},
         "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "pattern": "^[]$"}}}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"const": "\u0000"}}, "required": ["a"]}}}],
          "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ],
)
async def test_grammars_that_would_crash_llama_cpp_are_400s(
    server: LocalModelServer, http: httpx.AsyncClient, fields: dict[str, Any], param: str, stream: bool
) -> None:
    pid = server.pid
    assert_refused(await http.post("/chat/completions", json=chat(stream=stream, **fields)), param, "grammar")
    assert server.pid == pid and server.running and server.restarts == 0
    assert (await http.post("/chat/completions", json=chat())).status_code == 200


async def test_a_conversation_the_template_cannot_render_is_a_400(http: httpx.AsyncClient) -> None:
    response = await http.post("/chat/completions", json=chat(messages=[{"role": "user", "content": None}]))
    assert_refused(response, "messages", "chat template")


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/completions", {"prompt": ""}, "prompt"),
        ("/embeddings", {"input": []}, "input"),
        ("/embeddings", {"input": ["fine", ""]}, "input"),
        ("/chat/completions", {"logit_bias": {EOS: 150}}, "logit_bias"),
    ],
)
async def test_inputs_the_stock_server_failed_on_are_400s(
    http: httpx.AsyncClient, path: str, fields: dict[str, Any], param: str
) -> None:
    request = {"model": MODEL, "max_tokens": 3, **({"messages": chat()["messages"]} if "chat" in path else {}),
               **fields}
    assert_refused(await http.post(path, json=request), param)


async def test_logprobs_without_top_logprobs_are_answered(http: httpx.AsyncClient) -> None:
    """OpenAI answers ``logprobs: true`` alone; llama-cpp-python needed top_logprobs too and sent none."""
    response = await http.post("/chat/completions", json=chat(logprobs=True, max_tokens=3))
    assert response.status_code == 200
    tokens = response.json()["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 3 and all(token["logprob"] <= 0 for token in tokens)


# ----------------------------------------------------------------------------- context overflow


@pytest.mark.parametrize(("path", "prompt_field"), [("/chat/completions", "messages"), ("/completions", "prompt")])
async def test_a_streamed_context_overflow_is_the_same_400_before_any_stream_bytes(
    http: httpx.AsyncClient, path: str, prompt_field: str
) -> None:
    text = "hello world " * 10_000  # ~20k tokens; n_ctx is 2048
    prompt: Any = [{"role": "user", "content": text}] if prompt_field == "messages" else text
    request = {"model": MODEL, "max_tokens": 8, prompt_field: prompt}
    plain = await http.post(path, json=request)
    assert plain.status_code == 400
    assert plain.json()["error"]["code"] == "context_length_exceeded"
    async with http.stream("POST", path, json={**request, "stream": True}) as streamed:
        assert streamed.status_code == 400
        assert streamed.headers["content-type"].startswith("application/json")
        body = json.loads(await streamed.aread())
    assert body == plain.json()
    # A stream that fits still streams.
    short: Any = [{"role": "user", "content": "Hi"}] if prompt_field == "messages" else "Hi"
    async with http.stream("POST", path, json={**request, prompt_field: short, "stream": True}) as fine:
        assert fine.status_code == 200
        assert fine.headers["content-type"].startswith("text/event-stream")
        assert (await fine.aread()).rstrip().endswith(b"data: [DONE]")


# ----------------------------------------------------------------------------- client disconnects


async def stats_when(
    http: httpx.AsyncClient, check: Callable[[dict[str, int]], bool], what: str, within: float = 60.0
) -> dict[str, int]:
    """Poll the child's counters until ``check`` holds (a generous deadline, not a timing claim)."""
    deadline = time.monotonic() + within
    while not check(now := await stats(http)):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {within}s: {what}; counters: {now}")
        await asyncio.sleep(0.02)
    return now


@pytest.mark.parametrize("stream", [False, True])
async def test_generation_stops_when_the_client_disconnects(http: httpx.AsyncClient, stream: bool) -> None:
    """700 tokens with end-of-turn suppressed would run to the end; the client leaves after a few."""
    before = await stats(http)
    request = chat(max_tokens=700, logit_bias={EOS: -100}, stream=stream,
                   messages=[{"role": "user", "content": "Write a very long story."}])
    # A client of its own, so that closing it really closes the connection.
    async with httpx.AsyncClient(base_url=http.base_url, timeout=120) as leaving:
        call = asyncio.create_task(leaving.post("/chat/completions", json=request))
        await stats_when(
            http, lambda now: now["tokens_generated"] - before["tokens_generated"] >= 5, "5 tokens generated"
        )
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    # The generation ends, stopped because its client left, short of its 700 tokens ...
    after = await stats_when(
        http, lambda now: now["generations_finished"] > before["generations_finished"], "the generation ended"
    )
    assert after["generations_stopped"] == before["generations_stopped"] + 1, after
    generated = after["tokens_generated"] - before["tokens_generated"]
    assert 5 <= generated < 700
    await asyncio.sleep(0.5)
    assert (await stats(http))["tokens_generated"] == after["tokens_generated"]  # ... and nothing generates since
    # The server is free for the next request.
    response = await http.post("/chat/completions", json=chat())
    assert response.status_code == 200


async def test_a_queued_request_whose_client_left_never_generates(http: httpx.AsyncClient) -> None:
    """Requests queue behind the one llama.cpp context; one abandoned while queued costs nothing."""
    before = await stats(http)
    long_one = asyncio.create_task(http.post("/chat/completions", json=chat(max_tokens=60, logit_bias={EOS: -100})))
    await stats_when(http, lambda now: now["generations_started"] > before["generations_started"], "a generation")
    async with httpx.AsyncClient(base_url=http.base_url, timeout=120) as leaving:
        queued = asyncio.create_task(leaving.post("/chat/completions", json=chat(max_tokens=60)))
        await asyncio.sleep(0.3)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
    assert (await long_one).json()["usage"]["completion_tokens"] == 60
    # The queued one may still start once the first is done, and must then stop before its first token.
    await asyncio.sleep(0.5)
    after = await stats_when(
        http, lambda now: now["generations_started"] == now["generations_finished"], "no generation running"
    )
    assert after["tokens_generated"] - before["tokens_generated"] == 60


async def test_stats_answer_while_a_generation_runs(http: httpx.AsyncClient) -> None:
    running = asyncio.create_task(http.post("/chat/completions", json=chat(max_tokens=200, logit_bias={EOS: -100})))
    try:
        # Answered mid-generation: llama.cpp's own endpoints (GET /v1/models) wait for it to end.
        await stats_when(http, lambda now: now["generations_started"] > now["generations_finished"], "mid-generation")
    finally:
        assert (await running).status_code == 200


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
async def test_a_stream_asking_for_usage_ends_with_the_usage_chunk(http: httpx.AsyncClient, path: str) -> None:
    # The stock server ignored stream_options: no usage chunk, so the decision record had no tokens.
    body = chat() if path == "/chat/completions" else {"model": MODEL, "prompt": "Say hello.", "max_tokens": 8,
                                                        "temperature": 0}
    body |= {"stream": True, "stream_options": {"include_usage": True}, "logit_bias": {EOS: -100}}
    events = []
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    *content, final = events
    assert final["choices"] == [] and final["id"] == content[0]["id"]
    # The same counts as the unstreamed answer's usage.
    plain = (await http.post(path, json={**body, "stream": False, "stream_options": None})).json()["usage"]
    assert final["usage"] == plain and plain["completion_tokens"] == 8
    assert all("usage" not in event for event in content)
    # Without the option, no usage chunk (as OpenAI).
    del body["stream_options"]
    async with http.stream("POST", path, json=body) as response:
        lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
    assert all(json.loads(line.removeprefix("data: "))["choices"] for line in lines)


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
async def test_a_streams_usage_counts_the_tokens_of_an_answer_ended_by_the_model(
    http: httpx.AsyncClient, path: str
) -> None:
    # The end-of-generation token (<|im_end|>) was counted as a completion token of the stream's usage
    # chunk, though it is not part of the answer and the unstreamed answer's usage leaves it out: every
    # streamed answer that ended by itself was billed (and quota-charged) one token more.
    body = chat(max_tokens=64) if path == "/chat/completions" else {
        "model": MODEL, "prompt": "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n",
        "max_tokens": 64, "temperature": 0}
    plain = (await http.post(path, json=body)).json()
    assert plain["choices"][0]["finish_reason"] == "stop", plain  # ended by the model, not by max_tokens
    events = []
    async with http.stream("POST", path, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    # One chunk a token, and the end-of-generation token ends the stream without one. Not compared with the
    # unstreamed answer's count: at temperature 0 the two generations can still differ (the second reuses
    # the first's cached prompt, whose numerics differ slightly), seen as 28 against 29 tokens.
    pieces = [(c.get("delta") or {}).get("content") or c.get("text") for e in events for c in e["choices"]]
    written = [piece for piece in pieces if piece]
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == len(written), (usage, written)
    assert usage["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
