"""What the policy layer needs from signals: a provider, value types for validation, field access.

Signals themselves are computed in ``classifiers`` (``classifiers.signals.Signal``: ``name``,
``value``, ``confidence``, ``detail``). This module depends on their shape only structurally, so
tests and other providers may hand in any object with those attributes.

Conditions address a signal by name and, with dots, a field of it:

- ``difficulty`` or ``difficulty.value`` — the signal's value;
- ``domain.confidence`` — its confidence, a probability;
- ``domain.scores.code`` — a key inside the value when the value is a mapping, else inside ``detail``;
  a key may hold dots (``quality.gpt-4.1-mini``: the longest key that matches is read).

A missing signal or field resolves to ``None`` (conditions on it are false).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from policies.context import RequestContext


class SignalLike(Protocol):
    """The attributes of ``classifiers.signals.Signal`` the policy layer reads."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> Any: ...

    @property
    def confidence(self) -> float: ...

    def as_dict(self) -> dict[str, Any]: ...


class SignalProvider(Protocol):
    """Computes named signals for one request.

    A provider is built per route (it carries the route's ``signals:`` settings, such as keyword
    lists) and is called once per decision with the set of signals the route's policy uses. It
    should compute them concurrently and may omit a signal it cannot compute (conditions on it
    are then false).
    """

    async def compute(self, names: set[str], ctx: RequestContext) -> Mapping[str, SignalLike]:
        """Return the requested signals by name."""
        ...


class SignalKind(StrEnum):
    """The type of a signal's value, which decides the operators a condition may use on it."""

    PROBABILITY = "probability"  # float in [0, 1]
    NUMBER = "number"
    BOOL = "bool"
    LABEL = "label"  # one string
    LABELS = "labels"  # a collection of strings (PII kinds found, keyword lists matched …)
    MAPPING = "mapping"  # str -> value (per-model quality, per-label scores …)
    ANY = "any"  # unknown: every operator allowed, nothing checked


ORDER_OPS = frozenset({"gt", "ge", "lt", "le"})
OPS_BY_KIND: dict[SignalKind, frozenset[str]] = {
    SignalKind.PROBABILITY: frozenset({*ORDER_OPS, "eq", "ne", "truthy"}),
    SignalKind.NUMBER: frozenset({*ORDER_OPS, "eq", "ne", "truthy"}),
    SignalKind.BOOL: frozenset({"eq", "ne", "truthy"}),
    SignalKind.LABEL: frozenset({"eq", "ne", "in", "not_in", "truthy"}),
    SignalKind.LABELS: frozenset({"contains", "in", "not_in", "truthy"}),
    SignalKind.MAPPING: frozenset({"contains", "truthy"}),
    SignalKind.ANY: frozenset({*ORDER_OPS, "eq", "ne", "in", "not_in", "contains", "truthy"}),
}


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """The declared type of a signal (or of one of its fields), used to validate conditions.

    ``labels`` is the closed set of values a LABEL/LABELS signal can take (``None``: open).
    ``fields`` declares sub-fields reachable with dots; when it is non-empty, other sub-fields are
    errors, otherwise any sub-field is accepted as :attr:`SignalKind.ANY`.
    """

    kind: SignalKind = SignalKind.ANY
    labels: frozenset[str] | None = None
    fields: Mapping[str, SignalSpec] = field(default_factory=dict)

    def field_spec(self, name: str) -> SignalSpec | None:
        """The spec of sub-field ``name``, or ``None`` when the spec declares fields without it."""
        if name == "value":
            return self
        if name == "confidence":
            return SignalSpec(SignalKind.PROBABILITY)
        if name in self.fields:
            return self.fields[name]
        return None if self.fields else SignalSpec(SignalKind.ANY)


# The types of the signals ``classifiers`` provides (``classifiers.provider.PROVIDED_SIGNALS``), as
# far as the policy layer relies on them; keyword lists get theirs from their definition. The gateway
# may pass the provider's own specs to validation instead (for instance with the PII label set).
DEFAULT_SIGNAL_SPECS: dict[str, SignalSpec] = {
    "difficulty": SignalSpec(SignalKind.PROBABILITY),
    "jailbreak": SignalSpec(SignalKind.PROBABILITY),
    "domain": SignalSpec(SignalKind.LABEL),
    "pii": SignalSpec(SignalKind.LABELS),
    "tools": SignalSpec(SignalKind.BOOL),
    "length": SignalSpec(SignalKind.NUMBER),
    "quality": SignalSpec(SignalKind.MAPPING),
}


def signal_name(path: str) -> str:
    """The signal a dotted path refers to: ``domain.confidence`` -> ``domain``."""
    return path.split(".", 1)[0]


def resolve(signals: Mapping[str, SignalLike], path: str) -> Any:
    """The value at a dotted ``path`` (see the module docstring); ``None`` when absent.

    A key may hold dots itself (a model named ``gpt-4.1-mini`` in ``quality.gpt-4.1-mini``): at each
    mapping, the longest run of the path's remaining parts that is one of its keys is that key.
    """
    name, *rest = path.split(".")
    signal = signals.get(name)
    if signal is None:
        return None
    if not rest:
        return signal.value
    current: Any
    if rest[0] == "value":
        current, rest = signal.value, rest[1:]
    elif rest[0] == "confidence":
        current, rest = signal.confidence, rest[1:]
    elif isinstance(signal.value, Mapping) and _key_parts(signal.value, rest):
        current = signal.value
    else:
        current = getattr(signal, "detail", None)
    while rest:
        if not isinstance(current, Mapping):
            return None
        taken = _key_parts(current, rest)
        if not taken:
            return None
        current = current[".".join(rest[:taken])]
        rest = rest[taken:]
    return current


def _key_parts(mapping: Mapping[str, Any], parts: list[str]) -> int:
    """How many of ``parts``, joined by dots, make the longest key of ``mapping``; 0 when none does."""
    for taken in range(len(parts), 0, -1):
        if ".".join(parts[:taken]) in mapping:
            return taken
    return 0


def spec_for_path(specs: Mapping[str, SignalSpec], path: str) -> SignalSpec | None:
    """The spec of a dotted path, ``None`` if a declared spec has no such field.

    Signals without a declared spec are :attr:`SignalKind.ANY`.
    """
    name, *rest = path.split(".")
    spec: SignalSpec | None = specs.get(name, SignalSpec(SignalKind.ANY))
    for part in rest:
        if spec is None:
            return None
        spec = spec.field_spec(part)
    return spec
