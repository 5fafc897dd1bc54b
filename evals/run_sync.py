"""Running a store coroutine to completion from the synchronous command-line code of ``evals``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]], *, name: str = "pointsman-run-sync") -> T:
    """Run the coroutine ``factory()`` makes to completion and return its result (or raise its error).

    Outside an event loop this is ``asyncio.run``. Inside one (a test, a notebook) the loop cannot be
    re-entered, so the coroutine runs on a loop of its own in a thread named ``name``, and the caller
    blocks until it is done.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    result: list[T] = []
    errors: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=runner, name=name)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
