"""``evals.run_sync``: the commands' store reads work from plain code and from inside an event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from evals.run_sync import run_sync


async def _where() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


async def _fail() -> None:
    await asyncio.sleep(0)
    raise KeyError("missing")


def test_outside_a_loop_it_runs_in_the_calling_thread() -> None:
    assert run_sync(_where) == threading.current_thread().name
    with pytest.raises(KeyError, match="missing"):
        run_sync(_fail)


def test_inside_a_running_loop_it_runs_on_a_thread_of_its_own() -> None:
    async def caller() -> str:
        return run_sync(_where, name="reader")  # asyncio.run here would raise "cannot be called from a running loop"

    assert asyncio.run(caller()) == "reader"

    async def failing() -> None:
        run_sync(_fail)

    with pytest.raises(KeyError, match="missing"):
        asyncio.run(failing())
