"""Reading the text files people hand the commands (configs, probes, labelled data): UTF-8, a
byte-order mark allowed (spreadsheets and Windows editors write one), and a file in another encoding
named by its first bad line and byte instead of a decoder's traceback.

It sits in ``policies`` because the gateway (configs, probes) and ``evals`` (labelled files) both
depend on this package and on nothing shared below it.
"""

from __future__ import annotations

from pathlib import Path


class NotUtf8(ValueError):
    """The file is not UTF-8 text; the message names where."""


def read_utf8(path: str | Path) -> str:
    """The text of ``path`` (UTF-8, BOM allowed). ``OSError`` when it cannot be read, :class:`NotUtf8`
    naming the file, line and byte when it is not UTF-8."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise NotUtf8(f"{path}: {first_non_utf8(data)}; save the file as UTF-8") from None


def first_non_utf8(data: bytes) -> str:
    """Where the first byte that is not UTF-8 is (a decoder reading in chunks only knows its chunk)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return f"line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
    return "not UTF-8 text"
