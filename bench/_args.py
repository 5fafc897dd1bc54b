"""Argument types shared by the benchmark scripts: comma-separated lists of numbers (``--concurrency 1,16``).

As argparse ``type=`` functions, a bad value (``--concurrency abc``, ``--sizes 0``) is a usage error naming
the option, exit 2, before the script starts any server or reads any data; parsed after ``parse_args`` with
a bare ``int()``, it was a traceback, sometimes only after a fake upstream and a gateway had been started.
Empty items are skipped (``1,,16`` is ``1,16``), as several scripts already did.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _items(text: str, allow_empty: bool) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items and not allow_empty:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least one value (comma-separated, e.g. 1,16)")
    return items


def int_list(
    *, minimum: int | None = 1, maximum: int | None = None, allow_empty: bool = False
) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated whole numbers in ``[minimum, maximum]`` (``None``: unbounded).
    ``allow_empty`` takes ``""`` as ``[]`` (for options whose empty value means "off" or "the default")."""

    def parse(text: str) -> list[int]:
        values = []
        for item in _items(text, allow_empty):
            try:
                value = int(item)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{item!r} is not a whole number (give comma-separated numbers, e.g. 1,16)"
                ) from None
            _check_range(item, value, minimum, maximum)
            values.append(value)
        return values

    parse.__name__ = "comma-separated whole numbers"  # argparse names the type in its own messages
    return parse


def float_list(
    *, minimum: float | None = None, maximum: float | None = None, allow_empty: bool = False
) -> Callable[[str], list[float]]:
    """An argparse ``type``: comma-separated finite numbers in ``[minimum, maximum]`` (``None``: unbounded)."""

    def parse(text: str) -> list[float]:
        values = []
        for item in _items(text, allow_empty):
            try:
                value = float(item)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{item!r} is not a number (give comma-separated numbers, e.g. 0.1,0.5)"
                ) from None
            if not math.isfinite(value):  # float() takes nan and inf; no benchmark setting means them
                raise argparse.ArgumentTypeError(f"{item!r} is not a finite number")
            _check_range(item, value, minimum, maximum)
            values.append(value)
        return values

    parse.__name__ = "comma-separated numbers"
    return parse


def _check_range(item: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise argparse.ArgumentTypeError(f"{item!r} is below the minimum {minimum:g}")
    if maximum is not None and value > maximum:
        raise argparse.ArgumentTypeError(f"{item!r} is above the maximum {maximum:g}")
