"""Evaluating condition trees over computed signals, and finding which signals they use."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from policies.config import Condition
from policies.signals import SignalLike, resolve, signal_name

_SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}


def comparisons(condition: Condition) -> Iterator[Condition]:
    """Every ``{signal, op, value}`` leaf of a condition tree."""
    if condition.signal is not None:
        yield condition
    for child in (*(condition.all or ()), *(condition.any or ())):
        yield from comparisons(child)
    if condition.not_ is not None:
        yield from comparisons(condition.not_)


def signals_used(condition: Condition | None) -> set[str]:
    """The names of the signals a condition reads (so only those are computed)."""
    if condition is None:
        return set()
    return {signal_name(leaf.signal) for leaf in comparisons(condition) if leaf.signal is not None}


def evaluate(
    condition: Condition | None,
    signals: Mapping[str, SignalLike],
    trace: list[dict[str, Any]] | None = None,
) -> bool:
    """Whether ``condition`` holds (``None`` always holds).

    With ``trace`` every comparison is evaluated (no short-circuit) and recorded as
    ``{signal, op, value, actual, result}``, which is what the explanation shows.
    """
    if condition is None:
        return True
    if condition.signal is not None:
        actual = resolve(signals, condition.signal)
        result = compare(condition.op or "truthy", actual, condition.value)
        if trace is not None:
            leaf: dict[str, Any] = {"signal": condition.signal, "op": condition.op, "actual": _plain(actual)}
            if condition.op != "truthy":
                leaf["value"] = _plain(condition.value)
            leaf["result"] = result
            trace.append(leaf)
        return result
    if condition.not_ is not None:
        return not evaluate(condition.not_, signals, trace)
    children = condition.all if condition.all is not None else condition.any or ()
    if trace is None:
        if condition.all is not None:
            return all(evaluate(child, signals) for child in children)
        return any(evaluate(child, signals) for child in children)
    results = [evaluate(child, signals, trace) for child in children]
    return all(results) if condition.all is not None else any(results)


def compare(op: str, actual: Any, expected: Any) -> bool:
    """Apply one operator. A missing value (``None``) satisfies no operator."""
    if actual is None:
        return False
    if op == "truthy":
        return bool(actual)
    if op in ("gt", "ge", "lt", "le"):
        if isinstance(actual, bool) or not isinstance(actual, int | float):
            return False
        if op == "gt":
            return bool(actual > expected)
        if op == "ge":
            return bool(actual >= expected)
        if op == "lt":
            return bool(actual < expected)
        return bool(actual <= expected)
    if op == "eq":
        return bool(actual == expected)
    if op == "ne":
        return bool(actual != expected)
    if op in ("in", "not_in"):
        found = _intersects(actual, expected)
        return found if op == "in" else not found
    if op == "contains":
        if isinstance(actual, str):
            return isinstance(expected, str) and expected in actual
        if isinstance(actual, Mapping):
            return bool(actual.get(expected))
        if isinstance(actual, Collection):
            return expected in actual
        return False
    raise ValueError(f"unknown op {op!r}")


def describe(condition: Condition | None) -> str:
    """A compact human-readable form, used in decision reasons: ``domain in [code] and not tools``."""
    if condition is None:
        return "always"
    if condition.signal is not None:
        op = condition.op or "truthy"
        if op == "truthy":
            return condition.signal
        if op in _SYMBOLS:
            return f"{condition.signal} {_SYMBOLS[op]} {condition.value}"
        value = condition.value
        shown = "[" + ", ".join(str(v) for v in value) + "]" if isinstance(value, list | tuple) else str(value)
        return f"{condition.signal} {op.replace('_', ' ')} {shown}"
    if condition.not_ is not None:
        return f"not {_wrapped(condition.not_)}"
    joiner = " and " if condition.all is not None else " or "
    children = condition.all if condition.all is not None else condition.any or ()
    return joiner.join(_wrapped(child) for child in children)


def _wrapped(condition: Condition) -> str:
    text = describe(condition)
    return f"({text})" if condition.signal is None and condition.not_ is None else text


def _intersects(actual: Any, expected: Any) -> bool:
    options = expected if isinstance(expected, list | tuple | set | frozenset) else (expected,)
    if isinstance(actual, str | int | float):
        return actual in options
    if isinstance(actual, Mapping):
        return any(actual.get(option) for option in options)
    if isinstance(actual, Collection):
        return any(item in options for item in actual)
    return False


def _plain(value: Any) -> Any:
    """JSON-friendly copy of a value for explanations."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value
