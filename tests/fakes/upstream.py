"""A scriptable OpenAI-compatible upstream for tests: a real uvicorn server on loopback.

The behaviour of each request is chosen by the ``model`` it names (the gateway maps its own model
names to these through ``upstream_name``), so one server covers every fault a test needs:

=================  =============================================================================
model              behaviour
=================  =============================================================================
ok                 a normal answer; streams when asked (tool-call deltas when tools are given,
                   a usage chunk when ``stream_options.include_usage``); echoes request fields
flaky-500          HTTP 500 for the first ``FAILS`` requests per key, then ``ok``
always-500         HTTP 500 every time
rate-limited       HTTP 429 with ``Retry-After: 1`` for the first request per key, then ``ok``
hang               never answers (sleeps until the client goes away)
hang-body          sends 200 headers for a stream, then never sends a byte
stall-midstream    streams two chunks, then stalls forever
reset-midstream    streams two chunks, then drops the connection without finishing
malformed          HTTP 200 with a body that is not JSON
slow-drip          streams 6 chunks 0.25 s apart, then finishes normally
bad-request        HTTP 400 in OpenAI's shape (must be passed through, never retried)
truncated-stream   streams two chunks, then ends the body cleanly (chunked terminator sent) with no
                   ``data: [DONE]``: a stream cut short that no transport error reveals
length             like ``ok`` (streamed or not), but the answer stops at the token limit
                   (``finish_reason: "length"``)
always-a           a judge with the strongest position bias: whatever it is shown, its verdict is
                   ``[[A]]`` (comparisons must cancel it by asking both orders)
error-event:X      streamed: two SSE comments (``: PROCESSING``, as aggregators keep a connection
                   open), then an error object as the first data event (X = 502: the provider
                   behind failed, ``{"code": 502}``; X = context: the request was refused,
                   ``invalid_request_error``), then the end
comments-first     streamed: two SSE comments, then a normal answer
=================  =============================================================================

Scripted answers, for workflows (the model name carries the script):

=================  =============================================================================
lp<x>              ``lp-0.30``: the normal answer; when the request asks for ``logprobs`` every token
                   of the text has logprob ``x`` (so exp(mean) = exp(x)) and ``top_logprobs``
                   alternatives 1.5, 3.0 … lower; streamed chunks carry them too. No logprobs
                   unless asked (as real servers do). With tools: a tool call only
say:<text>         answers ``text`` (its words are the tokens; logprob -0.01 each when asked)
cycle:<a>|<b>|…    answers ``a``, then ``b``, … per key, round and round; honours ``n`` (n answers)
cycle1:<a>|<b>|…   the same, but ignores ``n`` (a backend without it: one choice)
hang:<tag>         like ``hang`` (never answers); its cancellation is counted under the full name
usage:<p>,<c>      a normal answer (streamed or not) whose usage says ``p`` prompt and ``c`` completion
                   tokens, however absurd (negative, past 64 bits): an upstream's usage is not trusted
slow:<s>[#tag]     answers after ``s`` seconds (a cancellation while waiting is counted)
rater              a scoring judge: reads the first ``quality=<x>`` in its prompt, answers
                   ``[[round(1 + 9x)]]``
pairjudge          a pairwise judge: reads the ``quality=<x>`` markers in order (A then B) and
                   answers ``[[A]]``, ``[[B]]`` or ``[[tie]]``
echo               answers ``ECHO: `` and the text of the last user message
switch:<tag>       like ``ok`` (streamed or not) until the test adds ``tag`` to ``state.failing``,
                   then HTTP 500 every time: an upstream that starts failing at a moment the test picks
text-only          like ``echo`` (streamed or not), but it answers text even when tools are offered (a
                   model that chose not to call one)
multi              what a full OpenAI server does with ``n``, several tools and ``logprobs``: ``n``
                   choices (``Choice <i> says hi.``, indexed 0..n-1; streamed, the choices' deltas
                   interleave), with tools one call per tool in each choice (``call_<i>_<k>``,
                   arguments ``{"k": <k>}`` streamed in two pieces, the calls' pieces interleaved),
                   token logprobs -0.1 (with ``top_logprobs`` alternatives) when asked; usage 11
                   prompt tokens and one completion token per text token or tool-call piece. With
                   ``reasoning_effort`` each choice also carries ``reasoning_content`` (``Thinking.``),
                   as reasoning models served by vLLM or DeepSeek do (streamed: a delta before the text).
                   On ``/v1/completions`` it streams ``WORDS`` when asked (usage: 2 prompt tokens)
=================  =============================================================================

``length``, ``always-a`` and the scripted models are not in ``BEHAVIOURS`` (the faults every standard
model covers). Every answer's usage is 11 prompt tokens and 7 completion tokens per choice
(streams: one completion token per chunk of text). ``state.peak`` holds the most requests of one
key that were in flight at once.

"Per key" is the ``user`` field of the request, so tests do not interfere with one another.
``GET /stats`` reports requests seen per model and key; ``/v1/models`` lists the behaviours.

:class:`BrokenUpstream` is a replica that is up but broken whatever the model: every POST answers
HTTP 500 while ``GET /v1/models`` answers 200 (a bad replica beside good ones).
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any, Self

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FAILS = 2
BEHAVIOURS = (
    "ok", "flaky-500", "always-500", "rate-limited", "hang", "hang-body", "stall-midstream",
    "reset-midstream", "malformed", "slow-drip", "bad-request", "truncated-stream",
)
MIDSTREAM_FAULTS = ("stall-midstream", "reset-midstream", "truncated-stream")  # stream even when not asked


class UpstreamState:
    """What the fake has seen, for assertions."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.disconnects: Counter[str] = Counter()
        self.headers: list[dict[str, str]] = []
        self.active: Counter[str] = Counter()  # requests in flight per key
        self.peak: Counter[str] = Counter()  # the most in flight at once per key
        self.failing: set[str] = set()  # tags of the ``switch:<tag>`` models that answer HTTP 500 now


def _completion(body: dict[str, Any], text: str, finish: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if body.get("tools"):
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": body["tools"][0]["function"]["name"], "arguments": '{"city": "Paris"}'},
                }
            ],
        }
        finish = "tool_calls"
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "ok"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        "system_fingerprint": "fp_fake",
    }


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": body.get("model", "ok"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def stream_events(
    body: dict[str, Any], words: list[str], finish: str = "stop", usage: dict[str, Any] | None = None
) -> list[bytes]:
    """The SSE events the fake sends for a normal streamed answer (tests compare bytes against this);
    ``usage`` replaces the usage chunk's counts."""
    events = [_chunk(body, {"role": "assistant", "content": ""})]
    if body.get("tools"):
        name = body["tools"][0]["function"]["name"]
        events.append(_chunk(body, {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                    "function": {"name": name, "arguments": ""}}]}))
        events.append(_chunk(body, {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}))
        events.append(_chunk(body, {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}))
        events.append(_chunk(body, {}, finish="tool_calls"))
    else:
        events += [_chunk(body, {"content": w}) for w in words]
        events.append(_chunk(body, {}, finish=finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage_chunk = {
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000,
            "model": body.get("model", "ok"), "choices": [],
            "usage": usage or {"prompt_tokens": 11, "completion_tokens": len(words), "total_tokens": 11 + len(words)},
        }
        events.append(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


WORDS = ["Hello", " from", " the", " fake", " upstream", "."]
_QUALITY = re.compile(r"quality=([0-9.]+)")
SCRIPTED = ("lp", "say:", "cycle:", "cycle1:", "hang:", "slow:", "rater", "pairjudge", "echo")


def _scripted(model: str) -> bool:
    return model.startswith(SCRIPTED)


def _last_user(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def _words(text: str) -> list[str]:
    """``text`` as tokens: its words, each but the first with its leading space."""
    parts = text.split(" ")
    return [parts[0], *(" " + p for p in parts[1:])] if text else []


def scripted_texts(model: str, body: dict[str, Any], seen: int) -> list[str]:
    """The answer texts (one per choice) a scripted model gives to its ``seen``-th request of a key."""
    prompt = " ".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
    if model.startswith("say:"):
        return [model[4:]]
    if model.startswith(("cycle:", "cycle1:")):
        script = model.split(":", 1)[1].split("|")
        n = int(body.get("n") or 1) if model.startswith("cycle:") else 1
        start = (seen - 1) * n
        return [script[(start + i) % len(script)] for i in range(n)]
    if model == "rater":
        found = _QUALITY.findall(prompt)
        return [f"[[{round(1 + 9 * float(found[0]))}]]" if found else "I cannot rate this."]
    if model == "pairjudge":
        found = [float(x) for x in _QUALITY.findall(prompt)]
        if len(found) < 2:
            return ["no verdict"]
        return ["[[tie]]" if found[0] == found[1] else "[[A]]" if found[0] > found[1] else "[[B]]"]
    if model == "echo":
        return ["ECHO: " + _last_user(body)]
    return ["".join(WORDS)]


def _logprobs(model: str, words: list[str], top: int) -> dict[str, Any]:
    value = float(model[2:]) if model.startswith("lp") else -0.01
    return {"content": [
        {"token": w, "logprob": value, "bytes": list(w.encode()),
         "top_logprobs": [{"token": w if i == 0 else f"alt{i}", "logprob": value - 1.5 * i, "bytes": None}
                          for i in range(top)]}
        for w in words
    ]}


def scripted_completion(model: str, body: dict[str, Any], seen: int) -> dict[str, Any]:
    """A scripted model's whole answer (usage: 11 prompt tokens, 7 completion tokens a choice)."""
    texts = scripted_texts(model, body, seen)
    completion = _completion(body, texts[0])
    choices = []
    for i, text in enumerate(texts):
        choice = {**completion["choices"][0], "index": i}
        if choice["message"].get("content") is not None:
            choice["message"] = {"role": "assistant", "content": text}
            if body.get("logprobs"):
                choice["logprobs"] = _logprobs(model, _words(text), int(body.get("top_logprobs") or 0))
        choices.append(choice)
    completion["choices"] = choices
    used = 7 * len(texts)
    completion["usage"] = {"prompt_tokens": 11, "completion_tokens": used, "total_tokens": 11 + used}
    return completion


class MultiAnswer:
    """The ``multi`` model's answer to one request: ``n`` choices, each text or one call per tool."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.n = int(body.get("n") or 1)
        self.tools = [t["function"]["name"] for t in body.get("tools") or []]
        self.logprobs = bool(body.get("logprobs"))
        self.top = int(body.get("top_logprobs") or 0)

    def words(self, index: int) -> list[str]:
        return _words(f"Choice {index} says hi.")

    def calls(self, index: int) -> list[dict[str, Any]]:
        return [{"id": f"call_{index}_{k}", "type": "function",
                 "function": {"name": name, "arguments": orjson.dumps({"k": k}).decode()}}
                for k, name in enumerate(self.tools)]

    def usage(self) -> dict[str, int]:
        completion = sum(2 * len(self.tools) if self.tools else len(self.words(i)) for i in range(self.n))
        return {"prompt_tokens": 11, "completion_tokens": completion, "total_tokens": 11 + completion}

    def completion(self) -> dict[str, Any]:
        """The whole answer as one chat.completion object."""
        choices = []
        for i in range(self.n):
            choice: dict[str, Any] = {"index": i, "finish_reason": "stop", "logprobs": None}
            if self.tools:
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": self.calls(i)}
                choice["finish_reason"] = "tool_calls"
            else:
                choice["message"] = {"role": "assistant", "content": "".join(self.words(i))}
                if self.body.get("reasoning_effort"):
                    choice["message"]["reasoning_content"] = "Thinking."
                if self.logprobs:
                    choice["logprobs"] = _logprobs("lp-0.1", self.words(i), self.top)
            choices.append(choice)
        return {"id": "chatcmpl-multi", "object": "chat.completion", "created": 1700000000,
                "model": self.body.get("model"), "choices": choices, "usage": self.usage(),
                "system_fingerprint": "fp_fake"}

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": "chatcmpl-multi", "object": "chat.completion.chunk", "created": 1700000000,
                 "model": self.body.get("model"), "choices": choices, **extra}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _deltas(self, index: int) -> list[dict[str, Any]]:
        """Choice ``index``'s streamed deltas after its role delta (finish not included)."""
        if self.tools:
            calls = self.calls(index)
            heads = [{"index": k, "id": c["id"], "type": "function",
                      "function": {"name": c["function"]["name"], "arguments": ""}} for k, c in enumerate(calls)]
            pieces = [[{"index": k, "function": {"arguments": c["function"]["arguments"][:3]}}
                       for k, c in enumerate(calls)],
                      [{"index": k, "function": {"arguments": c["function"]["arguments"][3:]}}
                       for k, c in enumerate(calls)]]
            return [{"delta": {"tool_calls": [h]}} for h in heads] + [
                {"delta": {"tool_calls": [p]}} for round_ in pieces for p in round_]
        deltas: list[dict[str, Any]] = []
        if self.body.get("reasoning_effort"):
            deltas.append({"delta": {"reasoning_content": "Thinking."}})
        for word in self.words(index):
            delta: dict[str, Any] = {"delta": {"content": word}}
            if self.logprobs:
                delta["logprobs"] = _logprobs("lp-0.1", [word], self.top)
            deltas.append(delta)
        return deltas

    def events(self) -> list[bytes]:
        """The streamed answer: every choice's role delta, then the choices' deltas interleaved, then
        each choice's finish, the usage chunk when asked, ``[DONE]``."""
        events = [self._event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]) for i in range(self.n)]
        per_choice = [self._deltas(i) for i in range(self.n)]
        for step in range(max(len(d) for d in per_choice)):
            for i, deltas in enumerate(per_choice):
                if step < len(deltas):
                    events.append(self._event([{"index": i, "logprobs": None, "finish_reason": None,
                                                **deltas[step]}]))
        finish = "tool_calls" if self.tools else "stop"
        events += [self._event([{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}])
                   for i in range(self.n)]
        if (self.body.get("stream_options") or {}).get("include_usage"):
            events.append(self._event([], usage=self.usage()))
        events.append(b"data: [DONE]\n\n")
        return events


def multi_answer(body: dict[str, Any]) -> MultiAnswer:
    """The ``multi`` model's answer to ``body``."""
    return MultiAnswer(body)


def legacy_stream_events(body: dict[str, Any]) -> list[bytes]:
    """The ``multi`` model's streamed legacy completion (``/v1/completions``): ``WORDS`` as text
    chunks, a finish chunk, the usage chunk when asked, ``[DONE]``."""
    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": "cmpl-multi", "object": "text_completion", "created": 1700000000,
                 "model": body.get("model"), "choices": choices, **extra}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    events = [event([{"index": 0, "text": w, "logprobs": None, "finish_reason": None}]) for w in WORDS]
    events.append(event([{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 2, "completion_tokens": len(WORDS), "total_tokens": 2 + len(WORDS)}
        events.append(event([], usage=usage))
    return [*events, b"data: [DONE]\n\n"]


def build_app(state: UpstreamState) -> Starlette:
    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        model, key = body.get("model", "ok"), str(body.get("user", ""))
        state.active[key] += 1
        state.peak[key] = max(state.peak[key], state.active[key])
        try:
            return await answer(request, body, model, key)
        finally:
            state.active[key] -= 1

    async def answer(request: Request, body: dict[str, Any], model: str, key: str) -> Response:
        state.requests[(model, key)] += 1
        state.bodies.append(body)
        state.headers.append(dict(request.headers))
        seen = state.requests[(model, key)]
        stream = bool(body.get("stream"))
        if model.startswith("switch:") and model[7:] in state.failing:
            return JSONResponse({"error": {"message": "switched off", "type": "server_error"}}, status_code=500)
        if model == "text-only":
            plain = {k: v for k, v in body.items() if k != "tools"}
            if stream:
                return StreamingResponse(_scripted_stream(plain, "echo", seen), media_type="text/event-stream")
            return JSONResponse(scripted_completion("echo", plain, seen))
        if model.startswith("hang:"):
            await _sleep_until_disconnect(request, model)
            return Response(status_code=204)
        if model.startswith("slow:"):
            delay = float(model[5:].split("#")[0])
            deadline = time.monotonic() + delay
            try:
                while time.monotonic() < deadline:
                    if await request.is_disconnected():
                        state.disconnects[model] += 1
                        return Response(status_code=204)
                    await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                state.disconnects[model] += 1
                raise
            return JSONResponse(_completion(body, f"slow answer {model}"))
        if model == "multi":
            answer = multi_answer(body)
            if stream:
                return StreamingResponse(iter(answer.events()), media_type="text/event-stream")
            return JSONResponse(answer.completion())
        if _scripted(model):
            if stream:
                return StreamingResponse(_scripted_stream(body, model, seen), media_type="text/event-stream")
            return JSONResponse(scripted_completion(model, body, seen))
        if model.startswith("usage:"):  # a normal answer whose usage reports the given (broken) counts
            prompt_tokens, completion_tokens = (int(n) for n in model[6:].split(","))
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": 0}
            if stream:
                events = stream_events(body, WORDS, usage=usage)
                return Response(b"".join(events), media_type="text/event-stream")
            return JSONResponse({**_completion(body, "an answer"), "usage": usage})
        if model.startswith("error-event:") and stream:
            return StreamingResponse(_error_event_stream(model[12:]), media_type="text/event-stream")
        if model == "comments-first" and stream:
            return StreamingResponse(_comments_first(body), media_type="text/event-stream")
        if model == "bad-request":
            return JSONResponse({"error": {"message": "bad tool schema", "type": "invalid_request_error",
                                           "param": "tools", "code": None}}, status_code=400)
        if model == "always-500" or (model == "flaky-500" and seen <= FAILS):
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if model == "rate-limited" and seen == 1:
            return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error"}},
                                status_code=429, headers={"Retry-After": "1"})
        if model == "hang":
            await _sleep_until_disconnect(request, model)
            return Response(status_code=204)
        if model == "malformed":
            return Response(b'{"id": "chatcmpl-x", "choices": [', media_type="application/json")
        if model == "always-a" and not stream:
            return JSONResponse(_completion(body, "[[A]]"))
        if stream or model == "hang-body" or model in MIDSTREAM_FAULTS:
            return StreamingResponse(_stream(request, body, model), media_type="text/event-stream")
        return JSONResponse(_completion(body, "".join(WORDS), "length" if model == "length" else "stop"))

    async def _scripted_stream(body: dict[str, Any], model: str, seen: int) -> AsyncIterator[bytes]:
        words = _words(scripted_texts(model, body, seen)[0])
        if body.get("tools") or not body.get("logprobs"):
            for event in stream_events(body, words):
                yield event
            return
        top = int(body.get("top_logprobs") or 0)
        yield _chunk(body, {"role": "assistant", "content": ""})
        for word in words:
            chunk = orjson.loads(_chunk(body, {"content": word})[6:])
            chunk["choices"][0]["logprobs"] = _logprobs(model, [word], top)
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        for event in stream_events(body, [])[1:]:
            yield event

    async def _stream(request: Request, body: dict[str, Any], model: str) -> AsyncIterator[bytes]:
        events = stream_events(body, WORDS, "length" if model == "length" else "stop")
        if model == "hang-body":
            await _sleep_until_disconnect(request, model)
            return
        for index, event in enumerate(events):
            if model in MIDSTREAM_FAULTS and index == 2:
                if model == "reset-midstream":
                    raise ConnectionResetError("fake upstream drops the connection")
                if model == "truncated-stream":
                    return  # the body ends normally (0-length chunk), just without [DONE]
                await _sleep_until_disconnect(request, model)
                return
            if model == "slow-drip" and index:
                await asyncio.sleep(0.25)
            yield event

    def _error_event_stream(kind: str) -> AsyncIterator[bytes]:
        error = ({"code": 502, "message": "provider returned error"} if kind == "502" else
                 {"type": "invalid_request_error", "code": "context_length_exceeded", "message": "too long"})
        return _after_comments([b"data: " + orjson.dumps({"error": error}) + b"\n\n"])

    def _comments_first(body: dict[str, Any]) -> AsyncIterator[bytes]:
        return _after_comments(stream_events(body, WORDS))

    async def _after_comments(events: Iterable[bytes]) -> AsyncIterator[bytes]:
        """Two SSE comments, as an aggregator keeps a connection open while its provider works, then ``events``."""
        for _ in range(2):
            yield b": PROCESSING\n\n"
            await asyncio.sleep(0.05)
        for event in events:
            yield event

    async def _sleep_until_disconnect(request: Request, model: str) -> None:
        try:
            while not await request.is_disconnected():  # noqa: ASYNC110 - Starlette offers no event for it
                await asyncio.sleep(0.05)
        finally:
            state.disconnects[model] += 1

    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        state.requests[(body.get("model", "ok"), str(body.get("user", "")))] += 1
        state.bodies.append(body)
        state.headers.append(dict(request.headers))  # bodies[i] and headers[i] are the same request
        if body.get("model") == "multi" and body.get("stream"):
            return StreamingResponse(iter(legacy_stream_events(body)), media_type="text/event-stream")
        return JSONResponse({
            "id": "cmpl-fake", "object": "text_completion", "created": 1700000000, "model": body["model"],
            "choices": [{"index": 0, "text": " world", "finish_reason": "length", "logprobs": None}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        })

    async def embeddings(request: Request) -> Response:
        body = orjson.loads(await request.body())
        state.requests[(body.get("model", "ok"), str(body.get("user", "")))] += 1
        state.bodies.append(body)
        state.headers.append(dict(request.headers))  # kept in step with bodies
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [0.1 * (i + 1), 0.2, 0.3]} for i in range(len(inputs))]
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in BEHAVIOURS]})

    async def stats(request: Request) -> Response:
        return JSONResponse({f"{m}|{k}": n for (m, k), n in state.requests.items()})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
    ])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackServer:
    """Runs an ASGI app with uvicorn on a free loopback port in a background thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self._server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
            timeout_graceful_shutdown=1,
        ))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{type(self).__name__} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class FakeUpstream(LoopbackServer):
    """The behaviour-by-model fake on a loopback port; ``state`` records what it saw."""

    def __init__(self, port: int | None = None) -> None:
        self.state = UpstreamState()
        super().__init__(build_app(self.state), port)


class BrokenUpstream(LoopbackServer):
    """A replica that answers HTTP 500 to every POST (``state.requests`` counts them) and 200 to GET /models."""

    def __init__(self, port: int | None = None) -> None:
        self.state = UpstreamState()

        async def fail(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.state.requests[(body.get("model", ""), str(body.get("user", "")))] += 1
            return JSONResponse({"error": {"message": "replica broken", "type": "server_error"}}, status_code=500)

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": []})

        super().__init__(Starlette(routes=[
            Route("/v1/chat/completions", fail, methods=["POST"]),
            Route("/v1/completions", fail, methods=["POST"]),
            Route("/v1/embeddings", fail, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]), port)

    @property
    def seen(self) -> int:
        return sum(self.state.requests.values())
