"""A failing Redis is logged at most every 30 s per user, and a user with a back-off skips Redis meanwhile."""

from __future__ import annotations

import logging

import pytest

from gateway import redis_failures
from gateway.redis_failures import RedisFailures, redis_errors


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_warn_once_per_interval_and_back_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(redis_failures.time, "monotonic", clock)
    failures = RedisFailures(logging.getLogger("pointsman.test"), "response cache", "serving without the cache", 1.0)
    from redis.exceptions import ConnectionError as RedisConnectionError

    assert not failures.skipping()
    with caplog.at_level(logging.WARNING, logger="pointsman.test"):
        for _ in range(5):  # a burst of failing requests: one warning
            failures.failed(RedisConnectionError("down"), "read")
        assert failures.skipping()
        clock.now += 1.5  # the back-off is over: Redis is tried again
        assert not failures.skipping()
        clock.now += 29.0  # 30 s after the first warning: the next failure warns again
        failures.failed(TimeoutError(), "write")
    assert [r.getMessage() for r in caplog.records] == [
        "response cache: Redis read failed (ConnectionError); serving without the cache",
        "response cache: Redis write failed (TimeoutError); serving without the cache",
    ]
    assert all(isinstance(e, redis_errors()) for e in (RedisConnectionError(), TimeoutError(), OSError()))


def test_without_a_back_off_redis_is_always_tried() -> None:
    failures = RedisFailures(logging.getLogger("pointsman.test"), "session store", "deciding without stickiness")
    failures.failed(OSError("refused"), "claim")
    assert not failures.skipping()


async def test_stopping_a_loop_that_swallows_its_cancellation_is_bounded() -> None:
    # redis-py can swallow the cancellation of a call in flight; shutdown must not wait for ever.
    import asyncio
    import contextlib
    import time

    from gateway.redis_failures import STOP_TIMEOUT_S, stop_task

    stop = False

    async def stubborn() -> None:
        while not stop:
            with contextlib.suppress(asyncio.CancelledError):  # a swallowed cancellation, as the loop sees it
                await asyncio.sleep(0.01)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await stop_task(task)
    assert time.monotonic() - started < STOP_TIMEOUT_S + 1.0
    stop = True  # the loop's own flag ends it
    await asyncio.wait_for(task, 1.0)
    assert task.done()
