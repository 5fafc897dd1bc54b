"""Scanning one text: which detectors run for the kinds wanted, and their findings merged."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import replace

from classifiers.signals._fold import fold_spans
from classifiers.signals.pii.detectors import DETECTORS
from classifiers.signals.pii.findings import Finding
from classifiers.signals.pii.spans import first_claims

_DIGIT = re.compile(r"\d")


def find_pii(text: str, kinds: Iterable[str] | None = None) -> list[Finding]:
    """Validated findings in ``text``, sorted by position, without overlaps.

    The detectors read ``text`` folded (:func:`classifiers.signals._fold.fold_spans`: zero-width
    characters removed, fullwidth forms, Unicode digits and spaces and Latin look-alikes made ASCII),
    as the model reads it; the spans are the original text's, invisible characters inside included.
    """
    wanted = set(kinds) if kinds is not None else None
    folded = fold_spans(text)
    if folded is None:
        return first_claims(_candidates(text, wanted))
    found = first_claims(_candidates(folded.text, wanted))
    return [replace(f, start=s, end=e) for f in found for s, e in (folded.original_span(f.start, f.end),)]


def _candidates(text: str, wanted: Collection[str] | None) -> Iterator[Finding]:
    """Every validated finding of the selected detectors, detector by detector in registry order."""
    has_digit = _DIGIT.search(text) is not None
    lowered: str | None = None  # computed once, when the first case-insensitive gate needs it
    for det in DETECTORS:
        if wanted is not None and det.kind not in wanted:
            continue
        if det.needs_digit and not has_digit:
            continue
        if det.gate:
            if det.gate_lower:
                if lowered is None:
                    lowered = text.lower()
                haystack = lowered
            else:
                haystack = text
            for needle in det.gate:  # a loop, not any(<generator>): this runs for every detector on every scan
                if needle in haystack:
                    break
            else:
                continue
        check = det.check
        for m in det.pattern.finditer(text):
            f = check(m, text)
            if f is not None:
                yield f
