"""An upstream that answers workflow sub-calls the way broken or unusual servers do: a real uvicorn
server on loopback. The model a request names is its script:

=================  =============================================================================
model              behaviour
=================  =============================================================================
say:<text>         answers ``text`` (one choice, whatever ``n`` is)
refuse-n           a 400 naming ``n`` when ``n`` > 1 (as the embedded local model and many small
                   servers do), else ``The answer is 42.``
blank              one choice per ``n`` whose message has ``content: null`` and no tool call
holes              choices ``[42, 7, 7]`` for ``n`` = 3: the first a real answer, the others not
                   even objects (one choice when ``n`` is not given)
refuse             a 400 in OpenAI's shape (``the request is refused``), whatever is asked
probabilities      the answer's tokens carry "logprobs" of 0.9 (a server sending probabilities
                   where log-probabilities belong)
n-honouring        ``n`` choices of ``The answer is 42.``
n-once             one choice of ``The answer is 42.`` for ``n`` > 1; a single call stalls 3 s first
escaped-bytes      ``ESCAPED_TEXT`` (an emoji first) with token logprobs as DeepSeek writes partial UTF-8 tokens
                   (``"\\xf0\\x9f\\x98"``, the bytes escaped): every token sure but `` 42`` (-2.0)
cr-stream          streams :data:`CR_TEXT` with bare-CR line endings (``data: ...\\r\\r``, legal SSE)
running-usage      streams :data:`CR_TEXT`; with ``stream_options.continuous_usage_stats`` every chunk
                   carries the usage so far, then the usage chunk (as vLLM does)
done-unended       streams :data:`CR_TEXT` with no usage chunk (whatever is asked), its last line
                   ``data: [DONE]`` with no line ending after it
=================  =============================================================================

Every answer's usage is 11 prompt and 7 completion tokens a choice. ``bodies`` keeps every request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.upstream import LoopbackServer

REFUSAL = "the request is refused"
CR_TEXT = "Carriage returns end these lines."
ESCAPED_TEXT = "\U0001F60A The answer is 42."


def _completion(body: dict[str, Any], choices: list[Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-hostile", "object": "chat.completion", "created": 1700000000,
        "model": body.get("model", ""), "choices": choices,
        "usage": {"prompt_tokens": 11, "completion_tokens": 7 * max(len(choices), 1),
                  "total_tokens": 11 + 7 * max(len(choices), 1)},
    }


def _choice(index: int, content: str | None, logprobs: Any = None) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": content}, "finish_reason": "stop",
            "logprobs": logprobs}


def _answer(body: dict[str, Any]) -> Response:
    model = str(body.get("model", ""))
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    if model.startswith("say:"):
        return JSONResponse(_completion(body, [_choice(0, model[4:])]))
    if model == "refuse-n" and n > 1:
        return JSONResponse({"error": {"message": "n > 1 is not supported", "type": "invalid_request_error",
                                       "param": "n", "code": None}}, status_code=400)
    if model == "n-once":
        return JSONResponse(_completion(body, [_choice(0, "The answer is 42.")]))
    if model in ("refuse-n", "n-honouring"):
        return JSONResponse(_completion(body, [_choice(i, "The answer is 42.") for i in range(n)]))
    if model == "blank":
        return JSONResponse(_completion(body, [_choice(i, None) for i in range(n)]))
    if model == "holes":
        return JSONResponse(_completion(body, [_choice(0, "42"), 7, 7][:n]))
    if model == "probabilities":
        tokens = [{"token": word, "logprob": 0.9, "top_logprobs": []} for word in ("The", " answer", ".")]
        return JSONResponse(_completion(body, [_choice(0, "The answer.", {"content": tokens})]))
    if model == "escaped-bytes":
        pieces = [("\\xf0\\x9f\\x98", [240, 159, 152], -0.01), ("\\x8a", [138], -0.01), (" The", None, -0.01),
                  (" answer", None, -0.01), (" is", None, -0.01), (" 42", None, -2.0), (".", None, -0.01)]
        tokens = [{"token": token, "logprob": logprob, "bytes": raw or list(token.encode()),
                   "top_logprobs": [{"token": token, "logprob": logprob}]} for token, raw, logprob in pieces]
        return JSONResponse(_completion(body, [_choice(0, ESCAPED_TEXT, {"content": tokens})]))
    return JSONResponse({"error": {"message": REFUSAL, "type": "invalid_request_error", "param": None,
                                   "code": None}}, status_code=400)


def _stream(body: dict[str, Any], *, end: bytes, done_end: bytes | None = None) -> Response:
    """A streamed answer (:data:`CR_TEXT`) whose events end with ``end``; with the usage chunk when
    asked for, and a running usage on every chunk too when ``continuous_usage_stats`` is (as vLLM does)."""
    head = {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "created": 1700000000,
            "model": body.get("model", "")}
    options = body.get("stream_options") or {}
    usage_asked = bool(options.get("include_usage"))
    running = usage_asked and bool(options.get("continuous_usage_stats"))
    words = CR_TEXT.split(" ")

    def usage(completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": 11, "completion_tokens": completion_tokens, "total_tokens": 11 + completion_tokens}

    def event(choices: list[dict[str, Any]], written: int) -> bytes:
        extra = {"usage": usage(written)} if running else {}
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + end

    events = [event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], 0)]
    events += [event([{"index": 0, "delta": {"content": (" " if i else "") + word}, "finish_reason": None}], i + 1)
               for i, word in enumerate(words)]
    events.append(event([{"index": 0, "delta": {}, "finish_reason": "stop"}], len(words)))
    if usage_asked:
        events.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage(len(words))}) + end)
    events.append(b"data: [DONE]" + (end if done_end is None else done_end))
    return Response(b"".join(events), media_type="text/event-stream")


class HostileUpstream(LoopbackServer):
    """The scripted hostile upstream on a loopback port; ``bodies`` holds every request it got."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

        async def chat(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.bodies.append(body)
            if body.get("model") == "n-once" and not (isinstance(body.get("n"), int) and body["n"] > 1):
                await asyncio.sleep(3)
            if body.get("model") in ("cr-stream", "running-usage") and body.get("stream"):
                return _stream(body, end=b"\r\r" if body["model"] == "cr-stream" else b"\n\n")
            if body.get("model") == "done-unended" and body.get("stream"):
                # a server that sends no usage chunk, whatever stream_options ask
                return _stream({**body, "stream_options": None}, end=b"\n\n", done_end=b"")
            return _answer(body)

        super().__init__(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
