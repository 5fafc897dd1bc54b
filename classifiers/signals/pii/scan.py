"""Scanning one text: which detectors run for the kinds wanted, and their findings merged."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from itertools import accumulate

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


#: What texts read together are joined with: a NUL stops every detector's pattern, so no finding runs from
#: one text into the next, while the words just before a text (the question in the turn before, the
#: label in the content part before) stay within a detector's context window, as a reader reads them.
TEXT_SEPARATOR = "\n\x00\n"


def find_in_texts(texts: Sequence[str], kinds: Iterable[str] | None = None) -> list[tuple[int, Finding]]:
    """Findings in ``texts`` read one after another, each with the words around it (one scan of the texts
    joined by :data:`TEXT_SEPARATOR`, far cheaper than one scan a text): ``(text index, finding)``, the
    finding's span in that text. ``"4155552671"`` after ``"What is your phone number?"`` is a phone number.
    """
    starts: list[int] = []
    pos = 0
    for text in texts:
        starts.append(pos)
        pos += len(text) + len(TEXT_SEPARATOR)
    out: list[tuple[int, Finding]] = []
    for f in find_pii(TEXT_SEPARATOR.join(texts), kinds):
        i = bisect_right(starts, f.start) - 1
        start = f.start - starts[i]
        if start >= len(texts[i]):
            continue  # inside a separator
        out.append((i, replace(f, start=start, end=min(f.end - starts[i], len(texts[i])))))
    return out


#: A finding across texts and its pieces ``(text index, start, end)`` in them.
Crossing = tuple[Finding, list[tuple[int, int, int]]]
#: Characters read on each side of a junction between two texts (an address or a number is shorter;
#: a private key cut in two is not looked for across texts).
JUNCTION_WINDOW = 256


def find_across(texts: Sequence[str], kinds: Iterable[str] | None = None) -> list[Crossing]:
    """Findings that only exist across texts read one after another (content parts of one message: a
    model reads ``"john.smith"`` and ``"@acme-corp.com"`` as one address, and ``"4111"``, ``" 1111"``,
    ``" 1111"``, ``" 1111"`` as one card number).

    The texts are read joined with nothing between them. Around each junction, :data:`JUNCTION_WINDOW`
    characters of each side (cut at a space, so that no token is read from its middle; a side may take
    in several short texts) are scanned; each finding that crosses a junction is returned once, with
    its pieces ``(text index, start, end)`` in every text it covers, in order. Findings within one text
    are not returned (scan each text for those). The cost is a scan of at most 512 characters a
    junction, whatever the texts' lengths.
    """
    whole = "".join(texts)
    starts = list(accumulate((len(t) for t in texts[:-1]), initial=0))
    crossing: list[Finding] = []
    # Empty texts put two junctions in one place: each place is read once.
    for junction in sorted({s for s in starts if 0 < s < len(whole)}):
        lo = max(0, junction - JUNCTION_WINDOW)
        if lo:
            space = whole.find(" ", lo, junction)
            lo = space + 1 if space >= 0 else lo
        hi = min(len(whole), junction + JUNCTION_WINDOW)
        if hi < len(whole):
            space = whole.rfind(" ", junction, hi)
            hi = space if space > junction else hi
        for f in find_pii(whole[lo:hi], kinds):
            if lo + f.start < junction < lo + f.end:
                crossing.append(replace(f, start=lo + f.start, end=lo + f.end))
    # A finding over three texts or more crosses two junctions or more: it was found from each.
    out: list[Crossing] = []
    for f in first_claims(crossing):
        first = bisect_right(starts, f.start) - 1
        pieces: list[tuple[int, int, int]] = []
        for i in range(first, len(texts)):
            begin, stop = starts[i], starts[i] + len(texts[i])
            if begin >= f.end:
                break
            if begin < stop:
                pieces.append((i, max(f.start, begin) - begin, min(f.end, stop) - begin))
        out.append((f, pieces))
    return out
