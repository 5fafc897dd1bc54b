"""How the gateway's Redis users (sessions, knob windows, quotas, the response cache, replica hints) fail.

One place for which errors mean "Redis failed" (redis-py's own, socket errors, timeouts: every call is
bounded by ``shared_state.timeout``), for a warning at most every :data:`WARN_EVERY_S` seconds per user (a
failing Redis would otherwise log once per request), and for an optional back-off: after a failure the
user skips Redis for ``retry_after`` seconds, so a Redis that hangs costs one timeout per interval, not
one per request. Each user translates the failure into its own exception at its boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

WARN_EVERY_S = 30.0
#: Seconds a background Redis loop gets to stop after it is cancelled.
STOP_TIMEOUT_S = 2.0


def redis_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the Redis call failed (redis is imported only when Redis is configured)."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


class RedisFailures:
    """A Redis user's failure bookkeeping: rate-limited warnings and an optional skip window."""

    __slots__ = ("_down_until", "_warned_at", "consequence", "log", "retry_after", "user")

    def __init__(self, log: logging.Logger, user: str, consequence: str, retry_after: float = 0.0) -> None:
        self.log = log
        self.user = user  # e.g. "response cache"
        self.consequence = consequence  # what happens instead, e.g. "serving without the cache"
        self.retry_after = retry_after
        self._down_until = float("-inf")
        self._warned_at = float("-inf")

    def skipping(self) -> bool:
        """Whether Redis failed less than ``retry_after`` seconds ago (then do not call it)."""
        return time.monotonic() < self._down_until

    def failed(self, exc: BaseException, what: str) -> None:
        """Note a failed call (``what``: read, write, ...): start the skip window, warn if not lately."""
        now = time.monotonic()
        if self.retry_after > 0:
            self._down_until = now + self.retry_after
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            self.log.warning("%s: Redis %s failed (%s); %s", self.user, what, type(exc).__name__, self.consequence)


async def stop_task(task: asyncio.Task[None]) -> None:
    """Cancel a background Redis loop and wait for it, at most :data:`STOP_TIMEOUT_S` seconds.

    Bounded because redis-py can swallow the cancellation of a call in flight (seen under load): the
    loop then goes on, and an unbounded wait would hold up shutdown for ever. Loops should also check a
    stop flag of their own between calls, so that such a task still ends by itself.
    """
    task.cancel()
    # asyncio.wait, not wait_for: on timeout wait_for cancels the task again and waits for *that*,
    # which never ends when the cancellation is swallowed.
    await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
    if task.done() and not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()  # retrieved, so a failed loop is not reported as never retrieved
