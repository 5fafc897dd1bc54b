"""Rewriting text and chat requests with every finding replaced by a typed placeholder."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from classifiers.messages import TextPiece, rewrite_message_texts
from classifiers.signals.pii.findings import Finding
from classifiers.signals.pii.scan import find_pii


def placeholder(kind: str) -> str:
    """The typed placeholder a finding is replaced with, e.g. ``[EMAIL]``."""
    return f"[{kind.upper()}]"


def redact(text: str, kinds: Iterable[str] | None = None) -> tuple[str, list[Finding]]:
    """Replace every finding in ``text`` with its typed placeholder; return the text and findings.

    Spans in the returned findings refer to the *original* text.
    """
    findings = find_pii(text, kinds)
    if not findings:
        return text, findings
    out: list[str] = []
    pos = 0
    for f in findings:
        out.append(text[pos : f.start])
        out.append(placeholder(f.kind))
        pos = f.end
    out.append(text[pos:])
    return "".join(out), findings


def redact_body(body: Mapping[str, Any], kinds: Iterable[str] | None = None) -> dict[str, Any]:
    """A copy of a chat request whose message texts are redacted; everything else is untouched.

    Redacted: string ``content``, ``text`` of content parts, the legacy ``prompt``, and the string
    values inside tool-call ``arguments`` (parsed as JSON, redacted value by value and re-serialised,
    so the arguments stay valid JSON; arguments that are not JSON are redacted as text). Not
    redacted: roles, names, ids, tool definitions, images, ``refusal`` parts and every request
    parameter. The input is never modified; what holds no finding is shared with it, not copied.
    """
    wanted = tuple(kinds) if kinds is not None else None

    def redacted(piece: TextPiece) -> str:
        if piece.source == "tool_call":
            return _redact_arguments(piece.text, wanted)
        return redact(piece.text, wanted)[0]

    return rewrite_message_texts(body, redacted)


def _redact_arguments(args: str, kinds: tuple[str, ...] | None) -> str:
    if not find_pii(args, kinds):
        return args  # keep the client's exact bytes when there is nothing to hide
    try:
        parsed = json.loads(args)
    except (ValueError, RecursionError):  # not JSON, or nested beyond what can be walked: plain text
        return redact(args, kinds)[0]

    def walk(obj: Any) -> Any:
        if isinstance(obj, str):
            return redact(obj, kinds)[0]
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, int) and not isinstance(obj, bool) and find_pii(str(obj), kinds):
            return placeholder(find_pii(str(obj), kinds)[0].kind)  # a card number sent as a JSON number
        return obj

    try:
        return json.dumps(walk(parsed), ensure_ascii=False)
    except RecursionError:  # arguments nested too deep to rebuild: redact them as text instead
        return redact(args, kinds)[0]
