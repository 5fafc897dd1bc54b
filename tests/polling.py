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


async def eventually_async(check: Callable[[], object], what: str = "condition", within: float = 5.0) -> None:
    """:func:`eventually` without blocking the event loop (for effects produced on the same loop)."""
    import asyncio

    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {within}s: {what}")
        await asyncio.sleep(0.01)
