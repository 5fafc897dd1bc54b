"""Scanning one text: which detectors run for the kinds wanted, and their findings merged."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Sequence
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


#: A finding across texts and its pieces ``(text index, start, end)`` in them.
Crossing = tuple[Finding, list[tuple[int, int, int]]]
#: Characters read on each side of a junction between two texts (an address or a number is shorter;
#: a private key cut in two is not looked for across texts).
JUNCTION_WINDOW = 256


def find_across(texts: Sequence[str], kinds: Iterable[str] | None = None) -> list[Crossing]:
    """Findings that only exist across texts read one after another (content parts of one message: a
    model reads ``"john.smith"`` and ``"@acme-corp.com"`` as one address).

    Around each junction of two texts, :data:`JUNCTION_WINDOW` characters of each side (cut at a space,
    so that no token is read from its middle) are scanned joined with nothing between them; each
    finding that crosses the junction is returned with its pieces ``(text index, start, end)`` in the
    two texts. Findings within one text are not returned (scan each text for those). The cost is a
    scan of at most 512 characters a junction, whatever the texts' lengths.
    """
    out: list[Crossing] = []
    for i in range(len(texts) - 1):
        left, right = texts[i], texts[i + 1]
        if not left or not right:
            continue
        lo = max(0, len(left) - JUNCTION_WINDOW)
        if lo:
            space = left.find(" ", lo)
            lo = space + 1 if space >= 0 else lo
        hi = min(len(right), JUNCTION_WINDOW)
        if hi < len(right):
            space = right.rfind(" ", 0, hi)
            hi = space if space > 0 else hi
        head = len(left) - lo
        for f in find_pii(left[lo:] + right[:hi], kinds):
            if f.start < head < f.end:
                out.append((f, [(i, lo + f.start, len(left)), (i + 1, 0, f.end - head)]))
    return out
