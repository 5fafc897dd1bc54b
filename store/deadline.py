"""A deadline on a database call that does not wait for the cancelled call to wind down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

# Calls given up on, still winding down (a reference keeps them from being collected mid-way).
_ABANDONED: set[asyncio.Future[Any]] = set()


async def within(work: Awaitable[T], seconds: float) -> T:
    """``work``'s result, or ``TimeoutError`` after ``seconds`` without waiting for it to wind down.

    ``asyncio.timeout`` waits for the cancelled work to finish cancelling, and a cancelled asyncpg
    call does network I/O first (a cancel request on a new connection, a reset before the connection
    goes back to the pool): with the database partitioned away that took as long as the call the
    deadline was meant to cut short. The abandoned call finishes (or fails) in the background; a
    write given up on may still commit, which is why only idempotent writes go through here.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    _ABANDONED.add(task)
    task.add_done_callback(_wound_down)
    raise TimeoutError(f"no answer within {seconds:g}s")


def _wound_down(task: asyncio.Future[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned call's failure is not worth a log line
