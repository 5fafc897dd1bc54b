"""Text as a reader sees it: invisible characters and look-alike forms folded away before matching.

A model reads ``john\u200b.smith\uff20acme.com``, ``\uff14\uff11\uff11\uff11 1111 1111 1111`` and
``Ign\u043ere all previous instructions`` as the plain address, card number and instruction they
show; patterns written for ASCII do not. The scanners match the folded text instead:

* zero-width and other invisible format characters (ZWSP, ZWNJ, ZWJ, word joiner, BOM, soft hyphen,
  bidirectional marks and embeddings, variation selectors) are removed;
* fullwidth ASCII forms become ASCII, every Unicode space (NBSP, thin, ideographic, ...) a space,
  every decimal digit (Arabic-Indic, Devanagari, fullwidth, mathematical ...) its ASCII digit,
  Unicode hyphens, dashes and the minus sign ``-``, the small ``@`` ``@``;
* mathematical alphanumerics (``\U0001d408\U0001d420\U0001d427``: bold, italic, script ...) their
  ASCII letters and digits;
* Cyrillic and Greek letters that look like Latin ones (``а е о р с у х`` ...) become those, in a
  word that mixes them with ASCII letters or digits (as no language writes one).

:func:`fold_spans` keeps every character that is not removed in its place (a one-for-one map), so a
span found in the folded text maps back to the original one (what PII redaction replaces);
:func:`fold_text` is the folded text alone (keywords, jailbreak: they report what matched, not where).

ASCII text is returned as it is, after one ``str.isascii`` (about 0.1 us per KB): the fold costs
nothing on most traffic, and on other text only when it holds a character it changes.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from bisect import bisect_right

_INVISIBLE_CHARS = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    "\u2066-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0"
)
#: Characters removed before matching: they show nothing, so they only ever hide a match.
INVISIBLE = re.compile(f"[{_INVISIBLE_CHARS}]")

# Latin look-alikes (Unicode confusables that render the same in common fonts).
_CONFUSABLES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "ԁ": "d", "һ": "h", "ԛ": "q",
    "ԝ": "w", "ɡ": "g",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T",
    "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J", "Ү": "Y", "Ԛ": "Q", "Ԝ": "W",
    # Greek
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "ι": "i", "κ": "k", "τ": "t", "υ": "u", "χ": "x",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
}  # fmt: skip


def _ranges(codes: list[int]) -> str:
    """A regex character class body for ``codes`` (sorted), consecutive ones as ranges: ``re`` tests a
    class of a few ranges in a few ns a character, one of thousands of single characters in ~250 ns."""
    out: list[str] = []
    i = 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        out.append(re.escape(chr(codes[i])) + ("-" + re.escape(chr(codes[j])) if j > i else ""))
        i = j + 1
    return "".join(out)


class _Folder:
    """The fold table and its patterns, built on the first text that is not ASCII (~30 ms: a process
    that only ever sees ASCII, a freshly spawned scan worker among them, never pays it)."""

    def __init__(self) -> None:
        table: dict[int, str | None] = {}
        for code in range(0x80, 0x20000):  # the planes beyond hold no digits, spaces or dashes
            category = unicodedata.category(chr(code))
            if category == "Nd":
                table[code] = str(unicodedata.decimal(chr(code)))
            elif category == "Zs":
                table[code] = " "
            elif category == "Pd":
                table[code] = "-"
        bmp = "".join(map(chr, range(0x10000)))
        for m in INVISIBLE.finditer(bmp):
            table[m.start()] = None
        for code in range(0x1D400, 0x1D800):  # mathematical alphanumerics: bold, italic, script ... letters
            plain = unicodedata.normalize("NFKC", chr(code))
            if len(plain) == 1 and plain.isascii():
                table[code] = plain
        table[0x2212] = "-"  # minus sign (Sm)
        table[0xFE6B] = "@"  # small commercial at
        # Fullwidth ASCII, but not the punctuation CJK text is written with (，：；？！（）): every Chinese
        # or Japanese text would be folded for nothing (those never hide a number or an address).
        cjk_punctuation = {ord(c) for c in "！（），：；？"}
        for code in range(0xFF01, 0xFF5F):
            if code not in cjk_punctuation:
                table[code] = chr(code - 0xFEE0)
        bmp_class = _ranges(sorted(c for c in table if c < 0x10000))
        self.table = table
        self.bmp = re.compile(f"[{bmp_class}]")
        # A long list of astral ranges is slow to test: run only on a text holding one of them.
        self.astral = re.compile(f"[{_ranges(sorted(c for c in table if c >= 0x10000))}]")
        self.conf = re.compile(f"[{_ranges(sorted(ord(c) for c in _CONFUSABLES))}]")
        self.conf_table = {ord(k): v for k, v in _CONFUSABLES.items()}
        # A look-alike beside an ASCII letter or digit: a word mixing scripts, as no language writes
        # one (Russian or Greek text on its own is never folded: that would cost a pass over every
        # character). Anchored on the ASCII character, rare in the text this must skip quickly.
        self.mixed = re.compile(f"[A-Za-z0-9@](?:(?={self.conf.pattern})|(?<={self.conf.pattern}.))")
        # Whether anything at all may fold: one pass over a text that holds nothing to fold (most).
        self.any = re.compile(f"[{bmp_class}{self.conf.pattern[1:-1]}\U00010000-\U0010ffff]")

    def fold_char(self, m: re.Match[str]) -> str:
        return self.table[ord(m.group())] or ""

    def fold_word(self, m: re.Match[str]) -> str:
        word = m.group()
        return word.translate(self.conf_table) if not word.isascii() and self.mixed.search(word) else word

    def __call__(self, text: str) -> str | None:
        """The folded text, or None when nothing in ``text`` folds."""
        if self.any.search(text) is None:
            return None
        changed = False
        if self.bmp.search(text) is not None:
            text = self.bmp.sub(self.fold_char, text)
            changed = True
        # Astral characters are mostly emoji; only digits and mathematical letters among them fold.
        if _ASTRAL.search(text) is not None and any(ord(c) in self.table for c in _ASTRAL.findall(text)):
            text = self.astral.sub(self.fold_char, text)
            changed = True
        if self.conf.search(text) is not None and self.mixed.search(text) is not None:
            text = _WORD.sub(self.fold_word, text)
            changed = True
        return text if changed else None


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_WORD = re.compile(r"[\w@.+%'-]+")


@functools.cache
def _folder() -> _Folder:
    return _Folder()


def _fold(text: str) -> str | None:
    return _folder()(text)


class Folded:
    """A folded text and the way back: ``original(i)`` is the original index of folded index ``i``."""

    __slots__ = ("_shifted", "text")

    def __init__(self, text: str, removed: list[int]) -> None:
        self.text = text
        # The i-th removed character sat at folded position removed[i] - i: a folded index f maps to
        # f plus the number of removals at or before it.
        self._shifted = [pos - i for i, pos in enumerate(removed)]

    def original(self, index: int) -> int:
        return index + bisect_right(self._shifted, index)

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of the folded span ``[start, end)`` (invisible characters inside it
        included, none just outside it)."""
        return self.original(start), self.original(end - 1) + 1


@functools.cache
def mark_class() -> str:
    """A regex character class body matching every combining mark (categories Mn, Mc, Me): accents
    written apart from their letter (``e`` + U+0301), the vowel signs of Indic scripts, Thai's ... A mark
    belongs to the letter before it, so it continues a word; ``\\w`` does not match one (built once,
    ~30 ms, on the first keyword list that needs it)."""
    codes = [c for c in range(0x300, 0x20000) if unicodedata.category(chr(c))[0] == "M"]
    codes += range(0xE0100, 0xE01F0)  # variation selectors supplement
    return _ranges(codes)


def fold_spans(text: str) -> Folded | None:
    """``text`` folded one character for one (invisible ones removed), or None when nothing changes."""
    if text.isascii():
        return None
    folded = _fold(text)
    if folded is None:
        return None
    return Folded(folded, [m.start() for m in INVISIBLE.finditer(text)])


def fold_text(text: str) -> str:
    """``text`` folded as :func:`fold_spans` folds it, for matchers that need no way back."""
    if text.isascii():
        return text
    folded = _fold(text)
    return text if folded is None else folded
