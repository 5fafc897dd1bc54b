"""The slice of the OpenAI protocol the gateway itself reads; everything else is forwarded untouched.

Parsing is deliberately shallow: the gateway checks only what it needs to route and to fail fast
with a helpful 400 (model, the conversation's shape, stream flag). Unknown fields (tools,
response_format, logprobs, seed, ...) are never inspected or dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from classifiers.conversation import ParsedBody
from gateway.errors import InvalidRequestError, PayloadTooLargeError, RequestTimeoutError
from gateway.json_shape import MAX_JSON_DEPTH, check_json_shape, shape_problem
from policies.echo import client_echo

if TYPE_CHECKING:
    from classifiers.offload import ScanPool

__all__ = ["MAX_JSON_DEPTH"]  # re-exported: the limit belongs to the protocol a client sees

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

#: Bodies up to this many bytes are checked on the event loop; larger ones off it
#: (:func:`decode_body_off_loop`). The check's worst case, tiny values, walks ~30 MB/s: at most ~10 ms
#: here, while a text-heavy body of this size takes well under a millisecond.
INLINE_DECODE_BYTES = 256 * 1024


class ClientDisconnected(Exception):
    """The client went away before the request body was complete."""


@dataclass(slots=True, frozen=True)
class Endpoint:
    """An OpenAI endpoint the gateway proxies."""

    name: str  # recorded in decisions, e.g. "chat.completions"
    path: str  # upstream path below the backend's base URL
    streams: bool  # whether "stream": true is allowed


CHAT = Endpoint("chat.completions", "/chat/completions", streams=True)
COMPLETIONS = Endpoint("completions", "/completions", streams=True)
EMBEDDINGS = Endpoint("embeddings", "/embeddings", streams=False)


async def read_body(receive: Receive, content_length: str | None, limit: int, timeout: float = 60.0) -> bytes:  # noqa: ASYNC109
    """The request body, refusing more than ``limit`` bytes (by header or while reading, for chunked)
    and a body that has not fully arrived ``timeout`` seconds after its headers (408): a client
    trickling a body must not hold a connection and a request slot for ever."""
    # asyncio.timeout's semantics by hand, for their cost on every request (~6 us, against ~2.5 us for
    # the timer alone): the task is cancelled at the deadline, and that cancellation, only that one,
    # becomes the 408.
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await _read_body(receive, content_length, limit)
    except asyncio.CancelledError:
        if expired and task.uncancel() <= cancelling:
            raise RequestTimeoutError(f"the request body did not arrive within {timeout:g} seconds") from None
        raise
    finally:
        timer.cancel()


async def _read_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError as exc:
            raise InvalidRequestError("invalid Content-Length header") from exc
        if declared > limit:
            raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_request(raw: bytes, endpoint: Endpoint) -> dict[str, Any]:
    """Parse and minimally validate a request body for ``endpoint``; raises 400s naming the field."""
    return validate_request(decode_body(raw), endpoint)


def decode_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 when it is empty, not JSON (strict RFC 8259: no NaN,
    no invalid UTF-8), not an object, nested deeper than :data:`MAX_JSON_DEPTH`, or when an object
    repeats a key (the router would read one value while an upstream parser may read the other).

    The object is a :class:`~classifiers.conversation.ParsedBody`: its conversation text, which every
    reader of the request wants, is rendered once."""
    body = _parse(raw)
    check_json_shape(raw, body)
    return ParsedBody(body)


async def decode_body_off_loop(raw: bytes, pool: ScanPool | None) -> dict[str, Any]:
    """:func:`decode_body`, with the structural check of a body over :data:`INLINE_DECODE_BYTES` done off
    the event loop: in ``pool``'s worker processes when the gateway has them (a full queue raises
    :class:`~classifiers.offload.ScanQueueFull`, a 503), else in a thread, which the loop preempts at
    least every few milliseconds. Smaller bodies are decoded as :func:`decode_body` does, with no hop."""
    if len(raw) <= INLINE_DECODE_BYTES:
        return decode_body(raw)
    # orjson holds the GIL while it parses (a thread would not free the loop), but it is several times
    # faster than the walk: ~0.1 s against ~0.3 s for 240,000 tiny messages.
    body = _parse(raw)
    if pool is None:
        await asyncio.to_thread(check_json_shape, raw, body)
    else:
        problem = await pool.call(shape_problem, raw)
        if problem is not None:
            raise InvalidRequestError(problem[0], code=problem[1])
    return ParsedBody(body)


def _parse(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidRequestError("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return body


def validate_request(body: dict[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """Check the fields the gateway itself needs for ``endpoint``; returns ``body`` unchanged."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean", param="stream")
    if stream and not endpoint.streams:
        raise InvalidRequestError(f"{endpoint.name} does not support streaming", param="stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):  # as OpenAI and vLLM refuse it
        raise InvalidRequestError("'stream_options' must be an object, and only with 'stream': true",
                                  param="stream_options")
    if endpoint in (CHAT, COMPLETIONS):
        _check_sampling(body)
    if endpoint is CHAT:
        _check_messages(body.get("messages"))
        _check_logprobs(body)
    elif endpoint is COMPLETIONS:
        if "prompt" not in body or not isinstance(body["prompt"], (str, list)):
            raise InvalidRequestError("'prompt' is required (a string or a list)", param="prompt")
    elif endpoint is EMBEDDINGS and ("input" not in body or not isinstance(body["input"], (str, list))):
        raise InvalidRequestError("'input' is required (a string or a list)", param="input")
    return body


#: Roles OpenAI's chat API takes ("function" is the deprecated form of "tool").
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: Roles whose ``content`` may be null: an assistant turn that only calls tools, a function result.
NULL_CONTENT_ROLES = frozenset({"assistant", "function"})


def _check_sampling(body: dict[str, Any]) -> None:
    """The shapes OpenAI itself refuses, refused here as a 400 rather than forwarded: a backend that does not
    check them (llama.cpp's server reads ``max_tokens: 0`` or ``-1`` as "no limit") would answer a 500
    (retried, then a 502), or generate for as long as its context allows."""
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidRequestError(f"'{name}' must be an integer of at least 1", param=name)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise InvalidRequestError(f"'{name}' must be a number", param=name)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequestError("'tools' must be an array of tool objects", param="tools")


def _check_logprobs(body: dict[str, Any]) -> None:
    """Chat's ``logprobs`` is a boolean and ``top_logprobs`` an integer 0-20 (a cascade reads the answer's
    log-probabilities: a backend reading ``"logprobs": "yes"`` its own way would change what it scores)."""
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidRequestError("'logprobs' must be a boolean", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        raise InvalidRequestError("'top_logprobs' must be an integer from 0 to 20", param="top_logprobs")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' is required and must be a non-empty array", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{index}] must be an object", param=f"messages.{index}")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequestError(
                f"messages[{index}].role is required and must be a string", param=f"messages.{index}.role"
            )
        if role not in CHAT_ROLES:
            raise InvalidRequestError(
                f"messages[{index}].role must be one of {', '.join(sorted(CHAT_ROLES))}, not {client_echo(role)}",
                param=f"messages.{index}.role",
            )
        content = message.get("content")
        # A list holds content parts; null is how an assistant turn that only calls tools is written, and
        # a legacy function result that returned nothing (OpenAI's spec and SDK type it Optional[str]).
        if not (isinstance(content, str) or (content is None and role in NULL_CONTENT_ROLES) or (
            isinstance(content, list) and all(isinstance(part, dict) for part in content)
        )):
            raise InvalidRequestError(
                f"messages[{index}].content must be a string or an array of content parts"
                + (" (null only for an assistant or function turn)" if content is None else ""),
                param=f"messages.{index}.content",
            )
