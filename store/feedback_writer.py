"""Durable, batched feedback writes: a submit returns only once its row is committed.

``POST /v1/feedback`` must not answer 200 for feedback that is not stored (a lost acknowledgement
is worse than a 503 the client retries), yet one transaction per request would cap throughput at
the disk's commit rate. So submitters append to a list and wait on a future; one writer task takes
everything waiting (up to ``batch_size``), writes it in one transaction and resolves the futures:
batches form by themselves from the submits that arrive while the previous batch is committing
(group commit), with no timer adding latency when traffic is light.

A failed or timed-out write fails every future of its batch with :class:`StoreUnavailable`; nothing
is retried behind the caller's back, so each submit ends in exactly one of: committed, or raised.
(A write that timed out may still commit later: the write is an idempotent upsert, so the client's
retry after the 503 does no harm.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from store.base import DecisionStore
from store.deadline import within
from store.errors import RequestForgotten, StoreUnavailable
from store.recorder import describe_error
from store.records import FeedbackRecord

logger = logging.getLogger(__name__)

#: Minimum seconds between two "feedback write failed" warnings.
_FAIL_LOG_INTERVAL = 10.0


class FeedbackWriter:
    """Writes feedback to ``store`` in batches from one task; :meth:`submit` waits for the commit.

    The store must be open (the gateway's :class:`~store.recorder.DecisionRecorder` opens it) for as
    long as the writer runs. ``write_timeout`` bounds one batch's write; ``max_pending`` bounds the
    submits waiting at once (more are refused with :class:`StoreUnavailable` at once).
    """

    def __init__(
        self,
        store: DecisionStore,
        batch_size: int = 512,
        *,
        write_timeout: float = 10.0,
        max_pending: int = 100_000,
    ) -> None:
        if batch_size < 1 or max_pending < 1:
            raise ValueError("batch_size and max_pending must be at least 1")
        if write_timeout <= 0:
            raise ValueError("write_timeout must be positive")
        self.store = store
        self.batch_size = batch_size
        self.write_timeout = write_timeout
        self.max_pending = max_pending
        self._waiting: list[tuple[FeedbackRecord, asyncio.Future[None]]] = []
        self._inflight = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._written = 0
        self._failed = 0
        self._batches = 0
        self._last_fail_log = float("-inf")

    # --- counters (exported as metrics by the gateway) -----------------------------------------

    @property
    def written(self) -> int:
        """Feedback rows committed (and acknowledged to their submitters)."""
        return self._written

    @property
    def failed(self) -> int:
        """Submits that raised StoreUnavailable (write failed or timed out, refused, or stopped)."""
        return self._failed

    @property
    def batches(self) -> int:
        """Transactions committed."""
        return self._batches

    @property
    def pending(self) -> int:
        """Submits waiting for their commit right now."""
        return len(self._waiting) + self._inflight

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer task (the store must already be open)."""
        if self._closed:
            raise RuntimeError("a stopped FeedbackWriter cannot be restarted")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="pointsman-feedback-writer")

    async def stop(self, timeout: float = 20.0) -> None:  # noqa: ASYNC109 - a drain deadline, not an I/O timeout
        """Write what is waiting (for at most ``timeout`` seconds), then refuse further submits.
        Submits still waiting at the deadline raise StoreUnavailable."""
        self._closed = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            _done, running = await asyncio.wait({task}, timeout=timeout)
            if running:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        waiting, self._waiting = self._waiting, []
        self._fail([fut for _item, fut in waiting], "the feedback writer stopped before this was written")

    # --- submitting ----------------------------------------------------------------------------

    async def submit(self, item: FeedbackRecord) -> None:
        """Write ``item``; returns once the transaction holding it committed.

        Raises :class:`StoreUnavailable` when the write failed or timed out, when ``max_pending``
        submits are already waiting, or when the writer is stopped; :class:`RequestForgotten` (nothing
        written) when ``pointsman forget`` forgot the request.
        """
        if self._closed or self._task is None or self._task.done():
            self._failed += 1
            raise StoreUnavailable("the feedback writer is not running")
        if self.pending >= self.max_pending:
            self._failed += 1
            raise StoreUnavailable("too many feedback writes are waiting for the store")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._wake.set()
        await future

    # --- writing -------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                batch = self._waiting[: self.batch_size]
                del self._waiting[: self.batch_size]
                await self._write(batch)
            if self._closed:
                return

    async def _write(self, batch: list[tuple[FeedbackRecord, asyncio.Future[None]]]) -> None:
        self._inflight = len(batch)
        try:
            # Feedback rows are upserts keyed by (request id, metric, source, model): a write given up
            # on here that commits later is the same row the client's retry writes.
            skipped = await within(self.store.write_feedback([item for item, _future in batch]), self.write_timeout)
        except Exception as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else describe_error(exc)
            self._log_failure(why, len(batch))
            self._fail([fut for _item, fut in batch], f"the feedback store write failed ({why})")
            return
        except BaseException:
            # Cancelled (stop() past its deadline): these submits were not acknowledged.
            self._fail([fut for _item, fut in batch], "the feedback writer stopped during the write")
            raise
        finally:
            self._inflight = 0
        self._batches += 1
        covered = frozenset(skipped or ())
        for i, (_item, future) in enumerate(batch):
            if future.done():  # a submitter that went away (client disconnect) is cancelled
                continue
            if i in covered:
                future.set_exception(RequestForgotten("the request was forgotten; nothing about it is written"))
            else:
                future.set_result(None)
        self._written += len(batch) - len(covered)

    def _fail(self, futures: list[asyncio.Future[None]], message: str) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(StoreUnavailable(message))
        self._failed += len(futures)

    def _log_failure(self, why: str, n: int) -> None:
        # Names the failure, never the driver's message: it can quote row values (comments).
        now = time.monotonic()
        if now - self._last_fail_log >= _FAIL_LOG_INTERVAL:
            self._last_fail_log = now
            logger.warning("feedback write failed: %s; %d submits answered unavailable", why, n)
