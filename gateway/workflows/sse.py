"""Server-sent events for workflow answers: a buffered answer written as a stream, and a live final
stage's stream with the workflow's totals put in.

A client that streams sees one coherent OpenAI stream whichever stage answered: chunks with the
answer, a chunk with ``finish_reason``, the usage chunk when it asked for one
(``stream_options.include_usage``), then ``data: [DONE]``. The workflow's ``pointsman`` extension
field rides on the last chunk before ``[DONE]``: the usage chunk when there is one, else the
``finish_reason`` chunk (never an extra chunk with no choices, which clients that read
``choices[0]`` of every chunk would trip on).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.sse_frames import SSEFramer, event_data
from gateway.workflows.confidence import first_choice

DONE = b"data: [DONE]\n\n"
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
#: The message fields :func:`render` writes as chunks of their own; every other one rides on one delta.
_RENDERED_FIELDS = frozenset({"role", "content", "refusal", "tool_calls"})


def _event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def render(completion: Mapping[str, Any], *, include_usage: bool) -> bytes:
    """A complete chat completion (its first choice; usage and ``pointsman`` as given) as the SSE
    stream an OpenAI server would have sent for it."""
    head: dict[str, Any] = {
        "id": completion.get("id") or "chatcmpl-pointsman",
        "object": "chat.completion.chunk",
        "created": completion.get("created") or 0,
        "model": completion.get("model") or "",
    }
    if completion.get("system_fingerprint") is not None:
        head["system_fingerprint"] = completion["system_fingerprint"]
    choice = first_choice(completion) or {}
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    others = {k: v for k, v in message.items() if k not in _RENDERED_FIELDS and v is not None}
    if others:
        # reasoning_content, annotations, audio, a legacy function_call: a streaming client would lose
        # them otherwise; one delta carries each whole (the SDK merges deltas into the message).
        events.append(chunk(others))
    content = message.get("content")
    if isinstance(content, str) and content:
        events.append(chunk({"content": content}, logprobs=choice.get("logprobs")))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        events.append(chunk({"refusal": refusal}))
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        if isinstance(call, Mapping):
            events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    finish = chunk({}, finish=choice.get("finish_reason") or "stop")
    extension = completion.get("pointsman")
    if include_usage:
        tail = {**head, "choices": [], "usage": completion.get("usage")}
        if extension is not None:
            tail["pointsman"] = extension
        events += [finish, tail]
    else:
        if extension is not None:
            finish["pointsman"] = extension
        events.append(finish)
    return b"".join(_event(e) for e in events) + DONE


Closer = Callable[[Mapping[str, Any] | None], tuple[dict[str, Any], dict[str, Any]]]


class LiveRewriter:
    """Rewrites a live final stage's stream event by event for the client.

    Chunks with the answer pass through byte for byte (a running usage on them too). The
    ``finish_reason`` chunk is held until the usage chunk (which the gateway asked for: no choices)
    or ``[DONE]`` arrives; then ``close(usage of this
    stage)`` returns the workflow's usage totals and its ``pointsman`` extension: with
    ``client_usage`` the usage chunk carries them, otherwise the usage chunk is dropped (the client
    did not ask for one) and the held finish chunk carries the extension.
    """

    def __init__(self, *, client_usage: bool, close: Closer) -> None:
        self._client_usage = client_usage
        self._close = close
        self._framer = SSEFramer()
        self._held: dict[str, Any] | None = None
        self._closed = False

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send the client for ``chunk`` (b"" while an event is incomplete or held).

        Events end as the SSE specification allows (a blank line after LF, CRLF or bare-CR line
        endings: the framer the gateway relays with cuts the same way), and each passes through as it
        came unless it is rewritten. (The relay hands over whole events, each within its size limit.)"""
        events = self._framer.feed(chunk)
        return b"".join(self._rewrite(event) for event in events)

    def _rewrite(self, event: bytes) -> bytes:
        data = event_data(event)
        if data is None:
            return event  # comments, keep-alives: as they came
        data = data.strip()
        if data == b"[DONE]":
            return self._release(None) + event
        if self._closed or (_USAGE.search(data) is None and _FINISHED.search(data) is None):
            return event
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(payload, dict):
            return event
        choices = payload.get("choices")
        if isinstance(payload.get("usage"), Mapping) and not choices:
            return self._release(payload)  # the usage chunk
        if not (isinstance(choices, list) and any(isinstance(c, Mapping) and c.get("finish_reason") is not None
                                                  for c in choices)):
            # A running usage on a chunk of the answer (vLLM's continuous_usage_stats): the stage's
            # own count so far, passed on; the workflow's totals ride on the stream's last chunk.
            return event
        if self._held is None:
            self._held = payload
            return b""
        return event

    def _release(self, usage_chunk: dict[str, Any] | None) -> bytes:
        """Close the stream: the held finish chunk and the usage chunk, with the totals put in."""
        if self._closed:
            return b""
        self._closed = True
        if usage_chunk is None and self._held is not None and isinstance(self._held.get("usage"), Mapping):
            usage_chunk, self._held = self._held, None  # a backend that put its usage on its finish chunk
        usage, extension = self._close(usage_chunk.get("usage") if usage_chunk is not None else None)
        out = b""
        held = self._held
        if usage_chunk is not None and self._client_usage:
            if held is not None:
                out += _event(held)
            usage_chunk["usage"] = usage
            usage_chunk["pointsman"] = extension
            return out + _event(usage_chunk)
        if held is None and usage_chunk is not None and usage_chunk.get("choices"):
            held = {**usage_chunk, "usage": None}  # a backend that put usage on its finish chunk
        if held is not None:
            held["pointsman"] = extension
            if self._client_usage:
                held["usage"] = usage
            out += _event(held)
        return out

