"""Rewriting text and chat requests with every finding replaced by a typed placeholder."""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from classifiers.messages import TextPiece, iter_message_texts, rewrite_message_texts
from classifiers.signals._text import SCOPES, iter_texts
from classifiers.signals.pii.findings import Finding
from classifiers.signals.pii.scan import find_across, find_in_texts, find_pii


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
    values inside tool-call ``arguments`` (redacted value by value, so the arguments stay valid JSON;
    arguments that are not JSON are redacted as text). Not
    redacted: roles, names, ids, tool definitions, images, ``refusal`` parts and every request
    parameter. The input is never modified; what holds no finding is shared with it, not copied.

    Every text is read with the words around it, as the ``pii`` signal reads the request
    (:func:`~classifiers.signals.pii.scan.find_in_texts`): a bare ``4155552671`` answering "What is your
    phone number?", or the value of an argument named ``phone``, is a phone number here as there. And
    as each of the signal's scopes reads it (``user``: the user turns one after another, ``last_user``,
    ``system``): a signal with ``scope: user`` reads "my phone number follows" right before a later
    turn's bare number, with the assistant's turn between them left out, and what it finds there is
    redacted too.
    """
    wanted = tuple(kinds) if kinds is not None else None
    pieces = list(iter_message_texts(body))
    across = _redact_across_parts(pieces, wanted)
    found: dict[tuple[int, str, int], list[Finding]] = {}
    for run in _scope_readings(body, pieces):
        for i, finding in find_in_texts([p.text for p in run], wanted):
            piece = run[i]
            found.setdefault((piece.message, piece.source, piece.part), []).append(finding)

    def redacted(piece: TextPiece) -> str:
        findings = _merged(found.get((piece.message, piece.source, piece.part), []))
        if piece.source == "tool_call":
            return _redact_arguments(piece.text, wanted, findings) if findings else piece.text
        edits = across.get((piece.message, piece.part), []) if piece.source == "content" else []
        return _edit(piece.text, [*edits, *((f.start, f.end, placeholder(f.kind)) for f in findings)])

    return rewrite_message_texts(body, redacted)


def _scope_readings(body: Mapping[str, Any], pieces: list[TextPiece]) -> Iterator[list[TextPiece]]:
    """The runs of texts the ``pii`` signal may read together: every text (``all``), then each narrower
    scope's texts, each run read once (a request of one user message is one run, not three)."""
    yield pieces
    seen = {tuple(_key(p) for p in pieces)}
    for scope in SCOPES:
        if scope == "all":
            continue
        run = list(iter_texts(body, scope))
        keys = tuple(_key(p) for p in run)
        if run and keys not in seen:
            seen.add(keys)
            yield run


def _key(piece: TextPiece) -> tuple[int, str, int]:
    return piece.message, piece.source, piece.part


def _merged(findings: list[Finding]) -> list[Finding]:
    """``findings`` of one text from several readings, overlapping ones made one (the union of their
    spans, the kind of the longest): a number one reading found whole and another in part is redacted
    whole, never leaving a fragment between two placeholders' edits."""
    if len(findings) < 2:
        return findings
    out: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.start, -(f.end - f.start))):
        if out and f.start < out[-1].end:
            last = out[-1]
            if f.end > last.end:
                longest = f if f.end - f.start > last.end - last.start else last
                out[-1] = replace(longest, start=last.start, end=f.end)
            continue
        out.append(f)
    return out


def _edit(text: str, edits: Iterable[tuple[int, int, str]]) -> str:
    """``text`` with each ``(start, end, replacement)`` made, an edit overlapping one before it left out."""
    # Kept spans sorted by start (they never overlap): an edit overlaps a kept one only if it overlaps its
    # neighbour on either side, found by bisection. Checking every kept span instead was quadratic: a 1 MB
    # text of card numbers (50k findings) took 47 s.
    starts: list[int] = []
    kept: list[tuple[int, int, str]] = []
    for start, end, replacement in edits:
        i = bisect_right(starts, start)
        if i and kept[i - 1][1] > start:  # the one starting at or before it runs into it
            continue
        if i < len(kept) and kept[i][0] < end:  # the next one starts inside it
            continue
        starts.insert(i, start)
        kept.insert(i, (start, end, replacement))
    if not kept:
        return text
    out, pos = [], 0
    for start, end, replacement in kept:
        out += [text[pos:start], replacement]
        pos = end
    return "".join(out) + text[pos:]


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


def _redact_across_parts(
    pieces: Iterable[TextPiece], kinds: tuple[str, ...] | None
) -> dict[tuple[int, int], list[tuple[int, int, str]]]:
    """``{(message, part): [(start, end, replacement)]}`` for the content parts holding a piece of a finding
    that runs on into the next part (``"john.smith"``, ``"@acme-corp.com"``): its first part gets the
    placeholder, the others lose their piece of it. Findings within one part are left to the part's own
    redaction."""
    edits: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for run in part_groups(pieces):
        for finding, spans in find_across([p.text for p in run], kinds):
            for n, (i, start, end) in enumerate(spans):
                key = (run[i].message, run[i].part)
                edits.setdefault(key, []).append((start, end, placeholder(finding.kind) if n == 0 else ""))
    return edits


#: A JSON string literal (what the arguments' findings are looked for in) and the characters of a number.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_NOT_JSON = object()
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def _redact_arguments(args: str, kinds: tuple[str, ...] | None, findings: list[Finding]) -> str:
    """Tool-call ``args`` (JSON, usually) with ``findings`` (spans in ``args``, found with their context)
    and every finding in their values redacted."""
    as_text = _edit(args, ((f.start, f.end, placeholder(f.kind)) for f in findings))
    try:
        json.loads(args)
    except (ValueError, RecursionError):  # not JSON, or nested beyond what can be walked: plain text
        return redact(as_text, kinds)[0]
    # The findings made in the text as sent (an argument named "phone" is read beside its number) first,
    # each turned into a JSON string; then every value on its own.
    parsed = _mark_json(args, findings)
    if parsed is _NOT_JSON:  # findings outside literals and numbers cannot be: never send them as they were
        return redact(as_text, kinds)[0]

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


def _mark_json(args: str, findings: list[Finding]) -> Any:
    """The JSON value of ``args`` with each finding's span replaced by its placeholder: within a string
    literal the span itself (the whole literal's text when the span touches an escape sequence, whose
    characters are not the value's), a number the finding covers becomes the placeholder as a string.
    :data:`_NOT_JSON` when a span lies elsewhere (no finding does) or the result is no JSON."""
    literals = [(m.start(), m.end()) for m in _JSON_STRING.finditer(args)]
    starts = [start for start, _ in literals]
    edits: list[tuple[int, int, str]] = []
    for f in findings:
        mark = placeholder(f.kind)
        k = bisect_right(starts, f.start) - 1
        if k >= 0 and literals[k][0] < f.start and f.end < literals[k][1]:
            start, end = literals[k]
            escaped = "\\" in args[f.start : f.end] or args[f.start - 1] == "\\"
            edits.append((start + 1, end - 1, mark) if escaped else (f.start, f.end, mark))
            continue
        start, end = f.start, f.end
        while start > 0 and args[start - 1] in _NUMBER_CHARS:
            start -= 1
        while end < len(args) and args[end] in _NUMBER_CHARS:
            end += 1
        if not _JSON_NUMBER.fullmatch(args, start, end):
            return _NOT_JSON
        edits.append((start, end, json.dumps(mark)))
    try:
        return json.loads(_edit(args, edits))
    except (ValueError, RecursionError):
        return _NOT_JSON
