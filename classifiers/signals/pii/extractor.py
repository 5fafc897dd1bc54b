"""The ``pii`` signal: one scan over a whole request, each finding mapped back to its message."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from classifiers.messages import messages_of
from classifiers.signals._text import SCOPES, iter_texts
from classifiers.signals.base import Signal
from classifiers.signals.pii.findings import PII_CATEGORIES, PII_KINDS
from classifiers.signals.pii.redact import part_groups
from classifiers.signals.pii.scan import find_across, find_in_texts


class PIISignal:
    """``value``: sorted list of PII kinds found anywhere in the request (falsy when none).

    ``detail``: ``findings`` (kind, subtype, message index, role, where in the message, confidence,
    masked preview — never the matched text), ``counts`` per kind and ``categories`` (contact,
    financial, national_id, secret, network). Confidence: the highest finding confidence, or 1.0
    when nothing was found. ``kinds`` limits detection to a subset of :data:`PII_KINDS`; ``scope``
    (``all`` by default: every message incl. the system prompt, tool results and tool-call
    arguments; or ``user``, ``last_user``, ``system``) limits where to look — e.g. ``user`` when the
    operator's own system prompt legitimately carries a support address.
    """

    def __init__(
        self, name: str = "pii", kinds: Iterable[str] | None = None, max_findings: int = 20, scope: str = "all"
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        self.name = name
        self.scope = scope
        self.kinds: tuple[str, ...] | None = None
        if kinds is not None:
            ks = tuple(kinds)
            unknown = [k for k in ks if k not in PII_CATEGORIES]
            if unknown:
                raise ValueError(f"unknown PII kind(s) {unknown}; known: {', '.join(PII_KINDS)}")
            self.kinds = ks
        self.max_findings = max_findings

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Scan every message (content, tool results, tool-call arguments) for personal data."""
        pieces = list(iter_texts(body, self.scope))
        findings: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        best = 0.0
        # What runs from one content part into the next (a model reads a message's parts as one text),
        # found first: a piece of it that reads as PII on its own ("john@acme.co" of "john@acme.co" + "m")
        # is that one finding, not a second.
        crossings = [(run, f, spans) for run in part_groups(pieces) for f, spans in find_across(
            [p.text for p in run], self.kinds)]
        covered: dict[int, list[tuple[int, int]]] = {}
        for run, _, spans in crossings:
            for index, start, end in spans:
                covered.setdefault(id(run[index]), []).append((start, end))
        # One scan over all texts, each finding mapped back to its message (redact_body reads the same).
        for i, f in find_in_texts([p.text for p in pieces], self.kinds):
            piece = pieces[i]
            start, end = f.start, f.end
            if any(start < c_end and c_start < end for c_start, c_end in covered.get(id(piece), ())):
                continue
            counts[f.kind] = counts.get(f.kind, 0) + 1
            best = max(best, f.confidence)
            if len(findings) < self.max_findings:
                findings.append(
                    {
                        "kind": f.kind,
                        "subtype": f.subtype,
                        "message": piece.message,
                        "role": piece.role,
                        "source": piece.source,
                        "span": [start, end],
                        "confidence": f.confidence,
                        "preview": f.preview,
                    }
                )
        for run, f, spans in crossings:
            first, start, end = spans[0]
            piece = run[first]
            counts[f.kind] = counts.get(f.kind, 0) + 1
            best = max(best, f.confidence)
            if len(findings) < self.max_findings:
                findings.append({
                    "kind": f.kind, "subtype": f.subtype, "message": piece.message, "role": piece.role,
                    "source": piece.source, "span": [start, end], "confidence": f.confidence,
                    "preview": f.preview,
                })
        kinds = sorted(counts)
        detail = {
            "findings": findings,
            "counts": counts,
            "categories": sorted({PII_CATEGORIES[k] for k in kinds}),
            "messages_scanned": len(messages_of(body)),
        }
        return Signal(self.name, kinds, best if kinds else 1.0, detail)
