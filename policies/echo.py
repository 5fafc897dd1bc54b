"""Client-supplied text made safe to echo in an error message or to store in a decision record.

Whatever a client puts where the gateway expects a name or a number (an unknown ``model``, a
malformed ``x-pointsman-threshold``, a repeated JSON key) may be anything: a pasted card number, a
whole prompt. Echoing it verbatim would put that text in responses, logs and the decision store, so
only a short prefix is kept and every digit in it is masked.
"""

from __future__ import annotations

import re

#: How many characters of client text an echo keeps.
ECHO_CHARS = 32

_DIGIT = re.compile(r"\d")  # Unicode digits too: a card number in full-width digits is still one


def masked_prefix(text: str, limit: int = ECHO_CHARS) -> str:
    """The first ``limit`` characters of ``text`` with every digit shown as ``#`` (what a decision
    record keeps of a client's unknown model name)."""
    return _DIGIT.sub("#", text[:limit])


def client_echo(text: object, limit: int = ECHO_CHARS) -> str:
    """``text`` quoted for a message: at most ``limit`` characters, digits shown as ``#``, with the
    full length noted when it was cut, e.g. ``'gpt-#o-minii' (digits masked)`` or
    ``'#### ####…' (4,096 chars, digits masked)``.
    Non-strings are named by their JSON type only."""
    if not isinstance(text, str):
        return _json_type(text)
    shown = masked_prefix(text, limit)
    notes = [f"{len(text):,} chars"] if len(text) > limit else []
    if shown != text[:limit]:
        notes.append("digits masked")
    return f"{shown!r}{'…' if len(text) > limit else ''}" + (f" ({', '.join(notes)})" if notes else "")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
