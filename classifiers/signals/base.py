"""The signal interface: one named, cheap, pure measurement of a chat request.

A signal is computed from the *whole* request body (every message, tool outputs, tool definitions),
never from the last message only, so a policy can react to e.g. a secret pasted three turns ago or a
prompt injection hidden in a tool result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Signal:
    """One measurement of a request.

    ``value`` is what policies compare against (a bool, a number, or a list of labels that is falsy
    when empty); ``confidence`` in [0, 1] says how much the extractor trusts that value; ``detail``
    holds JSON-safe explanation data (which rules or messages matched). ``detail`` never contains
    matched secret text: extractors mask it.
    """

    name: str
    value: Any
    confidence: float
    detail: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form, as it goes into ``/v1/route`` answers and decision records."""
        return {
            "name": self.name,
            "value": _jsonable(self.value),
            "confidence": round(float(self.confidence), 4),
            "detail": _jsonable(self.detail),
        }


@runtime_checkable
class SignalExtractor(Protocol):
    """Computes one signal from an OpenAI chat/completions request body.

    ``extract`` must be synchronous, pure (no I/O, no mutation of ``body``) and fast: well under a
    millisecond for a typical 2 KB conversation. Implementations precompile their patterns at
    construction so that one instance can be shared by every request and thread.
    """

    name: str

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Measure ``body`` and return the signal."""
        ...


# Exact types that pass through unchanged: tested first because ``isinstance(x, Mapping)`` is an ABC
# check, and every decision serialises a few dozen detail values (~40 us a decision here).
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _jsonable(obj: Any) -> Any:
    """Tuples/sets become lists and mappings plain dicts, so ``json.dumps`` accepts the result."""
    if type(obj) in _PLAIN_TYPES:
        return obj
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(_jsonable(v) for v in obj)
    return obj
