"""The bounded text form of a whole request that the encoders see.

Routing on the last message alone misses what matters (a system prompt asking for code, a tool-using
agent loop, a long thread), while encoding everything is slow and unbounded. ``conversation_text``
renders a chat or completions request body into at most ``max_chars`` characters, deterministically:

1. **Last user turn first**, in full up to its share (60% of the budget, more if the other sections
   are short). It goes first because MiniLM reads only its first 256 word pieces: whatever else is
   present, the question being asked is always inside the encoder's window. If it is too long, its head
   and its tail are kept (questions often come after a long pasted document) around a ``[…]`` marker.
2. ``[system]`` — system/developer messages joined, truncated to 15% of the budget (plus leftovers).
3. ``[history]`` — every other message (earlier turns, assistant tool calls, tool results, including any
   after the last user turn) as ``role: text`` lines in chronological order, each capped at 400
   characters. The most recent are kept; older ones are dropped behind one ``[… N earlier messages]``
   marker. Share: 15% plus leftovers.
4. ``[tools]`` — ``name: description`` of each declared tool (description cut to 80 characters),
   share 10% plus leftovers.

Shares are guaranteed minimums for sections that need them; budget a section does not use goes to the
others in the order above. Text parts of multi-part content are kept; other parts become markers such
as ``[image]``. Assistant tool calls render as ``[call name(args)]`` with arguments cut to 120 chars.

A request that is just one user message renders as exactly that message's text (cut to ``max_chars``),
so a head trained on benchmark prompts sees the same text shape at serving time. Completions bodies
(``"prompt"``: a string or a list of strings) are treated as a single user turn.

Rendering walks every message: ~0.25 s for 200,000 tiny ones. Several readers of one request want the
text (the signal provider, conversation capture, workflow stages), so a body the gateway parsed is a
:class:`ParsedBody`, which keeps each text it was rendered to, per budget: the walk happens once per
request, and goes with the request (no cache shared between requests to bound or to leak through).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from classifiers.messages import (
    SYSTEM_ROLES,
    content_texts,
    iter_messages,
    last_user_index,
    message_list,
    tool_calls_of,
)

DEFAULT_MAX_CHARS = 2000
SECTION_SEPARATOR = "\n\n"
ELLIPSIS = "[…]"
# Guaranteed shares of the budget; they sum to 1. Leftovers are redistributed in this same order.
SHARES: tuple[tuple[str, float], ...] = (("last_user", 0.60), ("system", 0.15), ("history", 0.15), ("tools", 0.10))
HEADERS = {"last_user": "", "system": "[system] ", "history": "[history]\n", "tools": "[tools] "}
HISTORY_MESSAGE_CHARS = 400
TOOL_DESCRIPTION_CHARS = 80
TOOL_ARGUMENT_CHARS = 120


class ParsedBody(dict[str, Any]):
    """One request's parsed JSON body, which remembers the conversation texts rendered from it.

    A plain ``dict`` in every other respect (``orjson`` encodes it as one). Like every request body the
    routing layer reads, it must not be modified once parsed: a change would not be seen by the texts it
    keeps. Copies (``dict(body)``, a redaction's rewrite) are plain dicts, rendered afresh.
    """

    # No __init__: a Python one would cost every request ~2 us; the dict is made on first use.
    __slots__ = ("_texts",)
    _texts: dict[int, str]  # max_chars -> conversation_text

    @property
    def texts(self) -> dict[int, str]:
        """The conversation texts rendered so far, by ``max_chars``."""
        try:
            return self._texts
        except AttributeError:
            self._texts = {}
            return self._texts


def conversation_text(body: Mapping[str, Any], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """Render a chat-completions or completions request body as bounded text for encoding (once per
    :class:`ParsedBody` and budget: it is remembered).

    Args:
        body: The request body (``messages`` and optional ``tools``/``functions``, or ``prompt``).
            Malformed pieces are rendered as best as possible, never raised on: validation is the
            gateway's job, and routing must not fail on a shape the upstream would accept.
        max_chars: Upper bound on the length of the result (characters).

    Returns:
        The text; ``len(result) <= max_chars`` always holds. See the module docstring for the layout.
    """
    if type(body) is ParsedBody:
        text = body.texts.get(max_chars)
        if text is None:
            text = body.texts[max_chars] = _render(body, max_chars)
        return text
    return _render(body, max_chars)


def remembered_text(body: Mapping[str, Any], max_chars: int) -> str | None:
    """The :func:`conversation_text` ``body`` keeps for ``max_chars``, if it is a :class:`ParsedBody` that
    has been rendered to that budget; else None."""
    return body.texts.get(max_chars) if type(body) is ParsedBody else None


def remember_text(body: Mapping[str, Any], max_chars: int, text: str) -> None:
    """Keep ``text``, rendered elsewhere (in a scan worker, from ``body``'s bytes), as ``body``'s
    :func:`conversation_text` for ``max_chars``; a body that is not a :class:`ParsedBody` keeps nothing."""
    if type(body) is ParsedBody:
        body.texts[max_chars] = text


def _render(body: Mapping[str, Any], max_chars: int) -> str:
    if max_chars <= 0:
        return ""
    last_user, system, history, tools = _split(body)
    if not system and not history and not tools:
        return clip_middle(last_user, max_chars)

    sections: dict[str, Any] = {"last_user": last_user, "system": system, "history": history, "tools": tools}
    present = [name for name, _ in SHARES if sections[name]]
    overhead = sum(len(HEADERS[name]) for name in present) + len(SECTION_SEPARATOR) * (len(present) - 1)
    budget = max(max_chars - overhead, 0)
    needs = {name: _length(sections[name]) for name in present}
    alloc = _allocate(needs, budget)

    parts: list[str] = []
    for name in present:
        if alloc[name] <= 0:
            continue
        limit = alloc[name]
        rendered = _render_history(history, limit) if name == "history" else clip_middle(sections[name], limit)
        if rendered:
            parts.append(HEADERS[name] + rendered)
    text = SECTION_SEPARATOR.join(parts)
    return text[:max_chars]  # never needed when the arithmetic above is right; cheap insurance for the bound


def _allocate(needs: Mapping[str, int], budget: int) -> dict[str, int]:
    """Give each section min(need, share), then hand out what is left in priority order."""
    share = dict(SHARES)
    alloc = {name: min(need, int(budget * share[name])) for name, need in needs.items()}
    left = budget - sum(alloc.values())
    for name, _ in SHARES:
        if name in needs and left > 0:
            extra = min(needs[name] - alloc[name], left)
            alloc[name] += extra
            left -= extra
    return alloc


def _split(body: Mapping[str, Any]) -> tuple[str, str, list[str], str]:
    """Return (last user text, system text, other messages rendered one per entry, tools text)."""
    tools = _render_tools(body)
    if message_list(body) is None:
        return _prompt_text(body.get("prompt")), "", [], tools

    last_user_at = last_user_index(body)
    last_user = ""
    system_parts: list[str] = []
    history: list[str] = []
    for index, role, message in iter_messages(body):
        if index == last_user_at:
            last_user = _content_text(message.get("content"))
        elif role in SYSTEM_ROLES:
            text = _content_text(message.get("content"))
            if text:
                system_parts.append(text)
        else:
            rendered = _render_message(role or "unknown", message)
            if rendered:
                history.append(rendered)
    return last_user, "\n".join(system_parts), history, tools


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, bytes):
        if prompt and all(isinstance(p, int) for p in prompt):
            return "[tokens]"  # a pre-tokenised prompt: nothing readable to route on
        return "\n".join(_prompt_text(p) for p in prompt)
    return ""


def _content_text(content: Any) -> str:
    """Text of a message's content as a reader sees it: text parts, markers for the rest."""
    if isinstance(content, str):
        return content
    return "\n".join(text for _, text in content_texts(content, markers=True))


def _render_message(role: str, message: Mapping[str, Any]) -> str:
    """One history entry: ``role: text [call f(args)]…``, capped at HISTORY_MESSAGE_CHARS."""
    pieces = [_content_text(message.get("content"))]
    pieces.extend(_render_call(function) for _, function in tool_calls_of(message))
    text = " ".join(p for p in pieces if p).strip()
    if not text:
        return ""
    label = role
    if role in ("tool", "function") and isinstance(message.get("name"), str):
        label = f"{role} {message['name']}"
    return clip_middle(f"{label}: {text}", HISTORY_MESSAGE_CHARS)


def _render_call(function: Mapping[str, Any]) -> str:
    name = str(function.get("name") or "?")
    args = function.get("arguments")
    if not isinstance(args, str):
        args = json.dumps(args, sort_keys=True, ensure_ascii=False) if args is not None else ""
    return f"[call {name}({_head(args, TOOL_ARGUMENT_CHARS)})]"


def _render_tools(body: Mapping[str, Any]) -> str:
    declared: list[Any] = []
    for key in ("tools", "functions"):
        value = body.get(key)
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            declared.extend(value)
    lines: list[str] = []
    for tool in declared:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        spec: Mapping[str, Any] = function if isinstance(function, Mapping) else tool
        name = spec.get("name") or tool.get("type")
        if not name:
            continue
        description = spec.get("description")
        if isinstance(description, str) and description.strip():
            lines.append(f"{name}: {_head(' '.join(description.split()), TOOL_DESCRIPTION_CHARS)}")
        else:
            lines.append(str(name))
    return "; ".join(lines)


def _render_history(history: list[str], limit: int) -> str:
    """Keep the most recent entries that fit in ``limit``; mark how many older ones were dropped."""
    kept: list[str] = []  # newest first
    used = 0  # characters of the kept entries joined by newlines
    for entry in reversed(history):
        cost = len(entry) + (1 if kept else 0)
        if used + cost > limit:
            break
        kept.append(entry)
        used += cost
    if len(kept) == len(history):
        return "\n".join(reversed(kept))
    # Something was dropped: make room for the marker by giving up the oldest kept entries if needed.
    while kept and used + len(_dropped_marker(len(history) - len(kept))) + 1 > limit:
        removed = kept.pop()
        used -= len(removed) + (1 if kept else 0)
    marker = _dropped_marker(len(history) - len(kept))
    if not kept:
        # Not even the most recent entry fits whole: show as much of it as the budget allows.
        marker = _dropped_marker(len(history) - 1)
        room = limit - len(marker) - 1
        if room > len(ELLIPSIS) + 8:
            return (marker + "\n" if len(history) > 1 else "") + clip_middle(history[-1], room)
        return clip_middle(history[-1], limit)
    return "\n".join([marker, *reversed(kept)])


def _dropped_marker(count: int) -> str:
    return f"[… {count} earlier message{'s' if count != 1 else ''}]"


def _length(section: Any) -> int:
    if isinstance(section, list):
        return sum(len(entry) for entry in section) + max(len(section) - 1, 0)
    return len(section)


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def clip_middle(text: str, limit: int) -> str:
    """``text`` if it fits, else its head and tail (2:1) around ``[…]``; never longer than ``limit``."""
    if len(text) <= limit:
        return text
    room = limit - len(ELLIPSIS) - 2
    if room < 8:
        return text[:limit]
    head = (room * 2) // 3
    tail = room - head
    return f"{text[:head]} {ELLIPSIS} {text[len(text) - tail :]}"
