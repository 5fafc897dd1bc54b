"""Non-learned signals of the routing brain: keywords, length, tools, PII, jailbreak.

Each signal reads the whole OpenAI chat request and returns a :class:`Signal` (name, value,
confidence, detail). :data:`BUILTIN_SIGNALS` maps the config name of each signal type to a factory
taking the signal's config parameters as keyword arguments::

    sig = BUILTIN_SIGNALS["keywords"](name="legal", keywords=["contract", "NDA"], scope="last_user")
    sig.extract(body).value   # -> ["contract"]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from classifiers.signals.base import Signal, SignalExtractor
from classifiers.signals.jailbreak import DEFAULT_THRESHOLD as JAILBREAK_THRESHOLD
from classifiers.signals.jailbreak import JailbreakSignal
from classifiers.signals.keywords import KeywordSignal
from classifiers.signals.length import LengthSignal, estimate_tokens
from classifiers.signals.pii import PII_CATEGORIES, PII_KINDS, PIISignal, find_pii, redact, redact_body
from classifiers.signals.tools import ToolsSignal

SignalFactory = Callable[..., SignalExtractor]

#: The labels the ``domain`` signal can take: the classes every domain head is trained on
#: (``evals/data/domains.py`` derives them from the data sets' metadata).
DOMAIN_LABELS: tuple[str, ...] = ("math", "code", "reasoning", "knowledge", "writing", "chat", "extraction")

#: Signal type name (as written in policy configs) -> factory(**params) -> extractor.
BUILTIN_SIGNALS: dict[str, SignalFactory] = {
    "keywords": KeywordSignal,
    "length": LengthSignal,
    "tools": ToolsSignal,
    "pii": PIISignal,
    "jailbreak": JailbreakSignal,
}


def build_signal(kind: str, **params: Any) -> SignalExtractor:
    """Construct a built-in signal by type name; ``ValueError`` names the unknown type or bad param."""
    try:
        factory = BUILTIN_SIGNALS[kind]
    except KeyError:
        raise ValueError(f"unknown signal type {kind!r}; known: {', '.join(sorted(BUILTIN_SIGNALS))}") from None
    try:
        return factory(**params)
    except TypeError as exc:  # unexpected / missing keyword: say which signal it was for
        raise ValueError(f"signal type {kind!r}: {exc}") from exc


__all__ = [
    "BUILTIN_SIGNALS",
    "DOMAIN_LABELS",
    "JAILBREAK_THRESHOLD",
    "PII_CATEGORIES",
    "PII_KINDS",
    "JailbreakSignal",
    "KeywordSignal",
    "LengthSignal",
    "PIISignal",
    "Signal",
    "SignalExtractor",
    "SignalFactory",
    "ToolsSignal",
    "build_signal",
    "estimate_tokens",
    "find_pii",
    "redact",
    "redact_body",
]
