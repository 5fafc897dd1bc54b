"""Waiting for an effect a test expects, with a deadline instead of a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], object], what: str = "condition", timeout: float = 5.0) -> None:
    """Poll ``check`` until it is truthy; fail naming ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {what}")
        time.sleep(0.02)
