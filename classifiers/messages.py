"""Where the text of an OpenAI request lives: the one walker over ``messages`` (and a legacy ``prompt``).

A chat request carries text in several places: ``content`` as a string or as a list of parts, assistant
``tool_calls`` (each function's ``arguments``, a JSON string), the legacy ``function_call``'s
``arguments``, and tool/function result messages (plain ``content``). A legacy completions request
carries a ``prompt`` string (or a list of strings) instead of messages, an embeddings request an
``input``: both read as "the prompt" (role ``user``, message -1, source ``prompt``).

Every reader of a request walks it here, and the ways the readers differ are options, not copies:

* :func:`iter_messages` — each message object with its position and role (``roles`` filters).
* :func:`iter_message_texts` — each run of text as a :class:`TextPiece`: which messages (``roles``,
  ``last_user``), whether tool-call arguments and the legacy prompt count (``tool_calls``,
  ``prompt``), and how content parts read (``markers``, below).
* :func:`rewrite_message_texts` — a copy of the request with some texts replaced, copy-on-write.

Content parts read in one of two ways:

* ``markers=False`` (a scanner: signals, redaction, size estimates): the text of string parts and of
  every part object with a string ``text``, whatever its ``type``. Nothing else is text: images,
  audio, files, and ``refusal`` parts are skipped.
* ``markers=True`` (a reader: the encoder's :func:`classifiers.conversation.conversation_text`): the
  text of ``text``/``input_text``/``output_text`` parts and of ``refusal`` parts; every other typed
  part becomes a marker such as ``[image]``; untyped part objects are skipped. Content that is neither
  a string nor a list (malformed) reads as ``str(content)``.

Both skip empty texts. Messages are counted by their position in ``messages``; entries that are not
objects carry no text (the gateway answers 400 before any of this runs on them). ``messages`` may be
a list or a tuple; anything else means "no messages".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple

#: Roles whose messages come from the operator rather than the end user or the outside world.
SYSTEM_ROLES = frozenset({"system", "developer"})
#: Content part types whose ``text`` a reader (``markers=True``) takes as text.
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
#: How a reader (``markers=True``) shows a part that is not text; other types show as ``[type]``.
PART_MARKERS = {"image_url": "[image]", "input_image": "[image]", "input_audio": "[audio]", "file": "[file]"}

# ``type(x) is dict or isinstance(x, Mapping)`` below: parsed JSON is made of dicts and lists, and
# the ABC check costs ~10x the type check, on every message, part and call of every request.


class TextPiece(NamedTuple):
    """One run of text in a request, and where it is.

    ``message`` is the position in ``messages`` (-1 for the legacy ``prompt``); ``source`` and
    ``part`` say where in it the text is:

    * ``("content", -1)``: ``content`` is this string; ``("content", j)``: ``content[j]`` (a string
      part, or the part object's ``text``; with ``markers=True`` possibly a marker).
    * ``("tool_call", k)``: ``tool_calls[k]["function"]["arguments"]``; ``("tool_call", -1)``: the
      legacy ``function_call["arguments"]``.
    * ``("prompt", -1)``: ``prompt`` is this string; ``("prompt", j)``: ``prompt[j]``.
    """

    message: int
    role: str
    source: str  # "content" | "tool_call" | "prompt"
    text: str
    part: int = -1


def message_list(body: Mapping[str, Any]) -> list[Any] | tuple[Any, ...] | None:
    """The request's ``messages`` as given (entries unchecked), or ``None`` if absent or not a list."""
    msgs = body.get("messages")
    return msgs if type(msgs) is list or isinstance(msgs, tuple) else None


def messages_of(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The request's message objects, tolerating a missing or malformed ``messages`` field."""
    msgs = message_list(body)
    if msgs is None:
        return []
    return [m for m in msgs if type(m) is dict or isinstance(m, Mapping)]


def iter_messages(
    body: Mapping[str, Any], roles: Collection[str] | None = None
) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    """``(position, role, message)`` of each message object whose role is in ``roles`` (all if None).

    The role is ``str(role or "")``: ``""`` for a message without one.
    """
    msgs = message_list(body)
    if msgs is None:
        return
    for index, message in enumerate(msgs):
        if type(message) is dict or isinstance(message, Mapping):
            role = str(message.get("role") or "")
            if roles is None or role in roles:
                yield index, role, message


def last_user_index(body: Mapping[str, Any]) -> int:
    """Position of the last message whose role is ``user``; -1 if there is none."""
    msgs = message_list(body)
    if msgs is not None:
        for index in range(len(msgs) - 1, -1, -1):
            message = msgs[index]
            if (type(message) is dict or isinstance(message, Mapping)) and message.get("role") == "user":
                return index
    return -1


def content_texts(content: Any, *, markers: bool = False) -> Iterator[tuple[int, str]]:
    """``(part, text)`` of each non-empty text run of one ``content`` (part -1: the whole string).

    ``markers`` chooses how parts read (see the module docstring).
    """
    if isinstance(content, str):
        if content:
            yield -1, content
    elif type(content) is list or isinstance(content, tuple):
        for index, part in enumerate(content):
            if isinstance(part, str):
                if part:
                    yield index, part
            elif type(part) is dict or isinstance(part, Mapping):
                if not markers:
                    text = part.get("text")
                    if isinstance(text, str) and text:
                        yield index, text
                    continue
                kind = str(part.get("type") or "")
                if not kind:
                    continue
                field = "text" if kind in TEXT_PART_TYPES else "refusal" if kind == "refusal" else None
                value = part.get(field) if field else None
                if isinstance(value, str):
                    if value:
                        yield index, value
                else:
                    yield index, PART_MARKERS.get(kind, f"[{kind}]")
    elif markers and content is not None:
        text = str(content)
        if text:
            yield -1, text


def tool_calls_of(message: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(k, function)`` of each call the message makes: ``tool_calls[k]["function"]``, then the
    legacy ``function_call`` (k = -1). Calls whose function is not an object are skipped."""
    calls = message.get("tool_calls")
    if type(calls) is list or isinstance(calls, tuple):
        for index, call in enumerate(calls):
            function = call.get("function") if type(call) is dict or isinstance(call, Mapping) else None
            if type(function) is dict or isinstance(function, Mapping):
                yield index, function
    legacy = message.get("function_call")
    if type(legacy) is dict or isinstance(legacy, Mapping):
        yield -1, legacy


def iter_message_texts(
    body: Mapping[str, Any],
    *,
    roles: Collection[str] | None = None,
    last_user: bool = False,
    tool_calls: bool = True,
    prompt: bool = True,
    markers: bool = False,
) -> Iterator[TextPiece]:
    """Every non-empty text run of the request, in order: message by message (content, then
    tool-call arguments), then the legacy prompt.

    Args:
        body: The request body. Malformed pieces carry no text; nothing here raises on them.
        roles: Only messages with these roles (all if None).
        last_user: Only the last ``user`` message; when there is none, the legacy prompt stands for
            the user's turn (if ``prompt``). Excludes ``roles``.
        tool_calls: Include tool-call and legacy function-call ``arguments`` (source ``tool_call``).
        prompt: Include the legacy ``prompt`` or an embeddings ``input`` (role ``user``, message -1):
            a string or the string items of a list (a list of token ids has no text).
        markers: Read content parts as a reader does (see the module docstring).
    """
    if last_user and roles is not None:
        raise ValueError("last_user and roles exclude each other")
    msgs = message_list(body) or ()
    selected: Any = enumerate(msgs)
    if last_user:
        index = last_user_index(body)
        if index < 0:
            if prompt:
                yield from _prompt_pieces(body)
            return
        selected = ((index, msgs[index]),)
    for index, message in selected:
        if not (type(message) is dict or isinstance(message, Mapping)):
            continue
        role = str(message.get("role") or "")
        if roles is not None and role not in roles:
            continue
        content = message.get("content")
        if isinstance(content, str):  # the common case, without a generator
            if content:
                yield TextPiece(index, role, "content", content)
        elif content is not None:
            for part, text in content_texts(content, markers=markers):
                yield TextPiece(index, role, "content", text, part)
        if tool_calls and ("tool_calls" in message or "function_call" in message):
            for call, function in tool_calls_of(message):
                args = function.get("arguments")
                if isinstance(args, str) and args:
                    yield TextPiece(index, role, "tool_call", args, call)
    if prompt and not last_user:
        yield from _prompt_pieces(body)


def _prompt_key(body: Mapping[str, Any]) -> str:
    """Where the request's text is when it has no messages: a completions ``prompt``, else an
    embeddings ``input`` (both a string or a list of strings; lists of token ids hold no text)."""
    return "prompt" if "prompt" in body else "input"


def _prompt_pieces(body: Mapping[str, Any]) -> Iterator[TextPiece]:
    prompt = body.get(_prompt_key(body))
    if isinstance(prompt, str):
        if prompt:
            yield TextPiece(-1, "user", "prompt", prompt)
    elif isinstance(prompt, list):
        for index, item in enumerate(prompt):
            if isinstance(item, str) and item:
                yield TextPiece(-1, "user", "prompt", item, index)


def text_chars(body: Mapping[str, Any], stop_after: int | None = None) -> int:
    """Characters of text in the request (every message, tool-call arguments, the legacy prompt),
    counting stopped once past ``stop_after``."""
    total = 0
    for piece in iter_message_texts(body):
        total += len(piece.text)
        if stop_after is not None and total > stop_after:
            break
    return total


def rewrite_message_texts(
    body: Mapping[str, Any],
    fn: Callable[[TextPiece], str],
    *,
    roles: Collection[str] | None = None,
    tool_calls: bool = True,
    prompt: bool = True,
) -> dict[str, Any]:
    """A copy of ``body`` where each text run ``piece`` (as :func:`iter_message_texts` yields them,
    read as a scanner) is replaced by ``fn(piece)``.

    Copy-on-write: ``body`` is never modified. Only what leads to a changed text is copied (the
    ``messages`` list, that message, its ``content`` list and part, its ``tool_calls`` list, call
    and function, the ``prompt`` list); everything else is shared with ``body``, including every
    message whose texts ``fn`` returned unchanged. The result is always a new top-level dict.
    """
    new = dict(body)
    msgs: Any = body.get("messages")  # a list or tuple whenever a piece comes from it
    copies: dict[int, dict[str, Any]] = {}
    for piece in iter_message_texts(body, roles=roles, tool_calls=tool_calls, prompt=False):
        text = fn(piece)
        if text == piece.text:
            continue
        original = msgs[piece.message]
        message = copies.get(piece.message)
        if message is None:
            message = copies[piece.message] = dict(original)
        if piece.source == "content":
            if piece.part < 0:
                message["content"] = text
                continue
            parts = message["content"]
            if parts is original["content"]:
                parts = message["content"] = list(parts)
            part = parts[piece.part]
            parts[piece.part] = text if isinstance(part, str) else {**part, "text": text}
        elif piece.part < 0:
            message["function_call"] = {**original["function_call"], "arguments": text}
        else:
            calls = message["tool_calls"]
            if calls is original["tool_calls"]:
                calls = message["tool_calls"] = list(calls)
            call = calls[piece.part]
            calls[piece.part] = {**call, "function": {**call["function"], "arguments": text}}
    if copies:
        new_msgs = list(msgs)
        for index, message in copies.items():
            new_msgs[index] = message
        new["messages"] = new_msgs
    if prompt:
        items: list[Any] | None = None
        for piece in _prompt_pieces(body):
            text = fn(piece)
            if text == piece.text:
                continue
            key = _prompt_key(body)
            if piece.part < 0:
                new[key] = text
                break
            if items is None:
                items = new[key] = list(body[key])
            items[piece.part] = text
    return new
