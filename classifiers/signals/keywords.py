"""Keyword and regular-expression matching over a chosen part of the conversation."""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import regex

from classifiers.signals._fold import fold_text, mark_class
from classifiers.signals._text import SCOPES, iter_texts
from classifiers.signals.base import Signal

log = logging.getLogger("pointsman.signals")

#: Seconds all of a signal's patterns may spend on one request. Patterns run on the event loop, and a
#: backtracking one (``(a|aa)+$``) on a 40-character prompt once froze the whole gateway; ``regex``
#: can stop a search, ``re`` cannot.
PATTERN_BUDGET = 0.05


def compile_pattern(pattern: str, flags: int = 0) -> Any:
    """``pattern`` compiled as keyword signals run it (the ``regex`` module, ``re``-compatible syntax);
    ``ValueError`` saying why when it is not a valid pattern."""
    try:
        return regex.compile(pattern, flags | regex.VERSION0)
    except regex.error as exc:
        raise ValueError(str(exc)) from None


class KeywordSignal:
    """Which of a configured set of keywords / regexes occur in the request.

    ``value`` is the list of matched keywords (as configured) followed by the matched patterns (as
    configured), in configuration order, so it is falsy when nothing matched. Keywords match on word
    boundaries — ``(?<!\\w)`` / ``(?!\\w)`` rather than ``\\b``, so keywords that start or end with
    punctuation (``c++``, ``.net``) work, on the text as a reader sees it: zero-width characters do not
    split a keyword, fullwidth letters, Unicode spaces and Latin look-alikes match their plain forms,
    a keyword's words may be apart by any whitespace, and a combining mark belongs to its letter
    (``cafe`` + U+0301 is ``café``, composed or not; a Hindi vowel sign continues its word). Patterns
    are Python regexes used as given, on the text as sent and on that folded form. Confidence is
    1.0: a literal match is certain. ``detail["messages"]`` maps each match to the message indices it
    was found in.
    """

    def __init__(
        self,
        name: str,
        keywords: Sequence[str] | None = None,
        patterns: Sequence[str] | None = None,
        *,
        case_sensitive: bool = False,
        scope: str = "all",
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        kws = [k for k in (keywords or []) if k and k.strip()]
        pats = list(patterns or [])
        if not kws and not pats:
            raise ValueError(f"keyword signal {name!r} needs at least one keyword or pattern")
        self.name = name
        self.scope = scope
        self.case_sensitive = case_sensitive
        self._keywords = kws
        # One alternation for all keywords (longest first, so "machine learning" beats "machine"):
        # a single scan of the text instead of one per keyword. Case-insensitive matching scans the
        # lower-cased text with lower-cased keywords rather than using re.IGNORECASE, and the
        # left word boundary is checked in Python: both keep the engine's fast literal-prefix scan
        # (about 3x faster on a 2 KB conversation).
        # Texts and keywords are matched folded (classifiers.signals._fold: zero-width characters
        # removed, fullwidth forms, Unicode spaces and Latin look-alikes made plain), and the words of
        # a keyword may be apart by any whitespace: "project\u00a0blue\u200bbird" or "project\n
        # bluebird" is the keyword "project bluebird" as a reader sees it.
        self._kw_lookup = {_spaced(self._fold(k)): k for k in kws}
        self._kw_re: re.Pattern[str] | None = None
        if kws:
            alts = "|".join(
                r"\s+".join(re.escape(word) for word in self._fold(k).split())
                for k in sorted(kws, key=len, reverse=True)
            )
            # A combining mark after the last letter continues the word ('cafe' + U+0301 is 'café').
            self._kw_re = re.compile(rf"(?:{alts})(?![\w{mark_class()}])")
        self._patterns: list[tuple[str, Any]] = []
        pattern_flags = 0 if case_sensitive else regex.IGNORECASE
        for pat in pats:
            try:
                self._patterns.append((pat, compile_pattern(pat, pattern_flags)))
            except ValueError as exc:
                raise ValueError(f"keyword signal {name!r}: bad pattern {pat!r}: {exc}") from exc

    def _fold(self, text: str) -> str:
        text = fold_text(text)
        if not text.isascii():
            # Composed as a reader sees it: 'cafe' + U+0301 is the 'café' a keyword list holds, and back.
            text = unicodedata.normalize("NFC", text)
        return text if self.case_sensitive else text.lower()

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Scan the scoped text and list what matched."""
        where: dict[str, list[int]] = {}
        timed_out: list[str] = []
        deadline = time.monotonic() + PATTERN_BUDGET
        for piece in iter_texts(body, self.scope):
            if self._kw_re is not None:
                text = self._fold(piece.text)
                for m in self._kw_re.finditer(text):
                    start = m.start()
                    if start and _in_word(text[start - 1]):
                        continue  # inside a longer word
                    _note(where, self._kw_lookup[_spaced(m.group(0))], piece.message)
            if not self._patterns:
                continue
            # Patterns read the text as sent and, when folding changes it, as a reader sees it.
            folded = fold_text(piece.text)
            texts = (piece.text,) if folded is piece.text else (piece.text, folded)
            for pat, rx in self._patterns:
                if pat in timed_out:
                    continue
                try:
                    found = any(
                        rx.search(text, timeout=max(deadline - time.monotonic(), 0.001)) for text in texts
                    )
                except TimeoutError:
                    timed_out.append(pat)  # counted as not matched; said in the detail and the log
                    continue
                if found:
                    _note(where, pat, piece.message)
        order = [*self._keywords, *(p for p, _ in self._patterns)]
        matched = [k for k in order if k in where]
        detail: dict[str, Any] = {"scope": self.scope, "messages": {k: where[k] for k in matched}}
        if timed_out:
            detail["timed_out"] = timed_out
            log.warning(
                "keyword signal %s: patterns %s ran past %.0f ms on a request and count as not matched",
                self.name,
                timed_out,
                PATTERN_BUDGET * 1000,
            )
        return Signal(self.name, matched, 1.0, detail)


def _in_word(char: str) -> bool:
    """Whether a match right after ``char`` would start inside a word: a letter, digit or ``_``, or a
    combining mark (it belongs to the letter before it: a Hindi vowel sign, an accent written apart)."""
    return char.isalnum() or char == "_" or (not char.isascii() and unicodedata.category(char)[0] == "M")


def _spaced(text: str) -> str:
    """``text`` with each run of whitespace one space (how a matched keyword is looked up)."""
    return " ".join(text.split())


def _note(where: dict[str, list[int]], key: str, message: int) -> None:
    seen = where.setdefault(key, [])
    if message not in seen:
        seen.append(message)
