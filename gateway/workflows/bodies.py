"""What each workflow sub-call sends: request bodies built from the client's (already redacted) one.

Every body starts from the request as it would have been forwarded (block and redact rules have run,
the gateway's own ``pointsman`` field is gone), so a sub-call never carries text the route would not
have sent upstream. Buffered calls are non-streamed; only a final stage streams, and then asks for
the usage chunk (the workflow's token and cost totals need it; it is dropped again when the client
did not ask for it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from classifiers.messages import content_texts, iter_message_texts, iter_messages, message_list
from gateway.compare import transcript
from gateway.errors import InvalidRequestError

#: Fields of the client's request that never go to a buffered sub-call.
_STREAM_FIELDS = ("stream", "stream_options")
#: Fields a graph step or a judge does not inherit from the client's request: they describe the
#: client's conversation and answer format, not the step's own prompt.
_CONVERSATION_FIELDS = (
    "messages", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
    "response_format", "logprobs", "top_logprobs", "n", *_STREAM_FIELDS,
)


@dataclass(frozen=True, slots=True)
class ClientAsk:
    """What the client asked for that the gateway may change on sub-calls and must restore."""

    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int | None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ClientAsk:
        """Read it from the request; 400 for what a workflow cannot serve (``n`` > 1)."""
        n = body.get("n")
        if n is not None and n != 1:
            raise InvalidRequestError("a workflow answers with one choice: n must be 1", param="n")
        options = body.get("stream_options")
        top = body.get("top_logprobs")
        return cls(
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(options, Mapping) and options.get("include_usage")),
            logprobs=body.get("logprobs") is True,
            top_logprobs=top if isinstance(top, int) and not isinstance(top, bool) else None,
        )


def buffered(body: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The client's request as a non-streamed call, with ``extra`` fields set."""
    request = {k: v for k, v in body.items() if k not in _STREAM_FIELDS}
    request["stream"] = False
    request.update(extra)
    return request


def final(body: Mapping[str, Any], ask: ClientAsk) -> dict[str, Any]:
    """The client's request for the stage whose answer is the workflow's: streamed when the client
    streams (with the usage chunk asked for), else buffered."""
    if not ask.stream:
        return buffered(body)
    options = body.get("stream_options")
    return {**body, "stream": True, "stream_options": {**(options if isinstance(options, Mapping) else {}),
                                                       "include_usage": True}}


def with_logprobs(request: dict[str, Any], top: int) -> dict[str, Any]:
    """``request`` asking for token logprobs with at least ``top`` alternatives per token."""
    current = request.get("top_logprobs")
    current = current if isinstance(current, int) and not isinstance(current, bool) else 0
    return {**request, "logprobs": True, "top_logprobs": max(current, top)}


def templated(
    body: Mapping[str, Any], prompt: str, *, system: str | None = None, keep_format: bool = False, **extra: Any
) -> dict[str, Any]:
    """A request whose conversation is one user message, ``prompt``, after an optional ``system``
    one; sampling fields (temperature, max_tokens, seed, user …) come from the client's request.
    ``keep_format`` keeps the client's response_format and logprob fields (the step that answers)."""
    kept = {"response_format", "logprobs", "top_logprobs"} if keep_format else set()
    request = {k: v for k, v in body.items() if k not in _CONVERSATION_FIELDS or k in kept}
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    request.update(messages=messages, stream=False, **extra)
    return request


def judge_request(body: Mapping[str, Any], prompt: str, max_tokens: int) -> dict[str, Any]:
    """A judge's or verifier's request: the prompt, deterministic, short; on behalf of the client's
    end user (``user``) when it named one."""
    request: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                               "max_tokens": max_tokens, "stream": False}
    if isinstance(body.get("user"), str):
        request["user"] = body["user"]
    return request


def with_system(body: Mapping[str, Any], system: str) -> dict[str, Any]:
    """The client's request with ``system`` as a first, extra system message (a fuser's references)."""
    return {**body, "messages": [{"role": "system", "content": system}, *(message_list(body) or ())]}


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text of the last user message, its text parts joined by spaces (``{input}`` in a graph
    step's prompt)."""
    return " ".join(piece.text for piece in iter_message_texts(body, last_user=True, tool_calls=False, prompt=False))


def conversation_text(body: Mapping[str, Any]) -> str:
    """The conversation as ``role: text`` lines (``{conversation}``; the most recent part when long)."""
    return transcript(body)


def estimate_prompt_tokens(request: Mapping[str, Any]) -> int:
    """A rough token count of what a request sends (4 characters a token, 4 tokens a message), for
    budget reservations only; settled from the upstream's usage."""
    chars, count = 0, 0
    for _, _, message in iter_messages(request):
        count += 1
        for _, text in content_texts(message.get("content")):
            chars += len(text)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            chars += len(str(calls))
    tools = request.get("tools")
    if isinstance(tools, list):
        chars += len(str(tools))
    return chars // 4 + 4 * count + 1
