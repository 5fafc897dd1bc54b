"""Where the text of a chat request lives, shared by every text-scanning signal.

OpenAI chat requests carry text in several places: ``content`` as a string or as a list of parts
(only ``text`` parts are text; images and audio are not), assistant ``tool_calls`` (the function
arguments, a JSON string), legacy ``function_call`` arguments, and tool/function result messages.
Legacy completions requests carry a ``prompt`` string (or list of strings) instead of messages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal, NamedTuple

Scope = Literal["all", "user", "last_user", "system"]
SCOPES: tuple[str, ...] = ("all", "user", "last_user", "system")

#: Roles whose messages come from the operator rather than the end user or the outside world.
SYSTEM_ROLES = frozenset({"system", "developer"})


class TextPiece(NamedTuple):
    """One run of text in a request: which message it is in (-1 for a legacy ``prompt``)."""

    message: int
    role: str
    source: str  # "content" | "tool_call" | "prompt"
    text: str


def messages_of(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The request's messages, tolerating a missing or malformed ``messages`` field."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return []
    return [m for m in msgs if isinstance(m, Mapping)]


def content_texts(content: Any) -> Iterator[str]:
    """Text runs of one message ``content`` (a string, or a list of typed parts)."""
    if isinstance(content, str):
        if content:
            yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str) and text:
                    yield text
            elif isinstance(part, str) and part:
                yield part


def _call_arguments(message: Mapping[str, Any]) -> Iterator[str]:
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, Mapping) else None
            args = fn.get("arguments") if isinstance(fn, Mapping) else None
            if isinstance(args, str) and args:
                yield args
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        args = legacy.get("arguments")
        if isinstance(args, str) and args:
            yield args


def iter_texts(body: Mapping[str, Any], scope: str = "all") -> Iterator[TextPiece]:
    """Every text run of the request within ``scope``.

    Scopes: ``all`` (every message, tool-call arguments, legacy prompt), ``user`` (user messages),
    ``last_user`` (the last user message only), ``system`` (system and developer messages).
    """
    msgs = messages_of(body)
    if scope == "last_user":
        for idx in range(len(msgs) - 1, -1, -1):
            if msgs[idx].get("role") == "user":
                for text in content_texts(msgs[idx].get("content")):
                    yield TextPiece(idx, "user", "content", text)
                return
        # A legacy completions request: its prompt is the user's turn.
        yield from _prompt_pieces(body)
        return
    for idx, msg in enumerate(msgs):
        role = str(msg.get("role") or "")
        if scope == "system" and role not in SYSTEM_ROLES:
            continue
        if scope == "user" and role != "user":
            continue
        for text in content_texts(msg.get("content")):
            yield TextPiece(idx, role, "content", text)
        if scope == "all":
            for args in _call_arguments(msg):
                yield TextPiece(idx, role, "tool_call", args)
    if scope in ("all", "user"):
        yield from _prompt_pieces(body)


def _prompt_pieces(body: Mapping[str, Any]) -> Iterator[TextPiece]:
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        yield TextPiece(-1, "user", "prompt", prompt)
    elif isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, str) and item:
                yield TextPiece(-1, "user", "prompt", item)


def text_chars(body: Mapping[str, Any], stop_after: int | None = None) -> int:
    """Characters of text in the request (every scope), counting stopped once past ``stop_after``."""
    total = 0
    for piece in iter_texts(body, "all"):
        total += len(piece.text)
        if stop_after is not None and total > stop_after:
            break
    return total
