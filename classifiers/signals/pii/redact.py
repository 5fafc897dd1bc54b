"""Rewriting text and chat requests with every finding replaced by a typed placeholder."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from classifiers.messages import TextPiece, iter_message_texts, rewrite_message_texts
from classifiers.signals.pii.findings import Finding
from classifiers.signals.pii.scan import find_across, find_pii


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

    Redacted: string ``content``, ``text`` of content parts (also what runs from one part into the
    next: a model reads them as one text), the legacy ``prompt``, and the string
    values inside tool-call ``arguments`` (parsed as JSON, redacted value by value and re-serialised,
    so the arguments stay valid JSON; arguments that are not JSON are redacted as text). Not
    redacted: roles, names, ids, tool definitions, images, ``refusal`` parts and every request
    parameter. The input is never modified; what holds no finding is shared with it, not copied.
    """
    wanted = tuple(kinds) if kinds is not None else None
    across = _redact_across_parts(iter_message_texts(body, tool_calls=False, prompt=False), wanted)

    def redacted(piece: TextPiece) -> str:
        if piece.source == "tool_call":
            return _redact_arguments(piece.text, wanted)
        text = across.get((piece.message, piece.part), piece.text) if across else piece.text
        return redact(text, wanted)[0]

    return rewrite_message_texts(body, redacted)


def part_groups(pieces: Iterable[TextPiece]) -> Iterator[list[TextPiece]]:
    """Runs of two or more text parts of one message's ``content``, which a model reads as one text."""
    run: list[TextPiece] = []
    for piece in pieces:
        if piece.source != "content" or piece.part < 0:
            continue
        if run and run[-1].message != piece.message:
            if len(run) > 1:
                yield run
            run = []
        run.append(piece)
    if len(run) > 1:
        yield run


def _redact_across_parts(pieces: Iterable[TextPiece], kinds: tuple[str, ...] | None) -> dict[tuple[int, int], str]:
    """``{(message, part): text}`` for the content parts holding a piece of a finding that runs on into
    the next part (``"john.smith"``, ``"@acme-corp.com"``): its first part gets the placeholder, the
    others lose their piece of it. Findings within one part are left to the part's own redaction."""
    edits: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    texts: dict[tuple[int, int], str] = {}
    for run in part_groups(pieces):
        for finding, spans in find_across([p.text for p in run], kinds):
            for n, (i, start, end) in enumerate(spans):
                key = (run[i].message, run[i].part)
                texts[key] = run[i].text
                edits.setdefault(key, []).append((start, end, placeholder(finding.kind) if n == 0 else ""))
    out: dict[tuple[int, int], str] = {}
    for key, changes in edits.items():
        text, pos, parts = texts[key], 0, []
        for start, end, replacement in sorted(changes):
            parts += [text[pos:start], replacement]
            pos = end
        out[key] = "".join(parts) + text[pos:]
    return out


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
