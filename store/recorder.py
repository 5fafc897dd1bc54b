"""Batching writer between the request path and a decision store.

The request path calls :meth:`DecisionRecorder.record`, which only appends to an in-memory deque: it
never awaits, never does I/O and never raises. One background task writes batches; a failed batch
stays queued and is retried with exponential backoff, so a database outage costs memory (bounded by
``queue_limit`` records and ``queue_bytes_limit`` bytes of them, oldest records dropped first), not
requests. :meth:`DecisionRecorder.stop` writes
everything still queued before closing the store, so a graceful shutdown loses nothing it answered.

Fire-and-forget feedback (judge scores, implicit signals) goes through the same queue with
:meth:`DecisionRecorder.record_feedback`. Feedback a client waits for goes through
:class:`store.feedback_writer.FeedbackWriter` instead, which acknowledges only committed rows.
Every ``purge_interval`` seconds (and at start) the recorder deletes conversation text whose
retention ended (:meth:`DecisionStore.purge_expired_text`).

Logs name the failure (exception type, SQLSTATE or SQLite error name, errno) and counts, never the
exception's message: driver messages can quote row values, and rows can carry request text.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections import deque

from store.base import DecisionStore
from store.deadline import within
from store.records import DecisionRecord, FeedbackRecord

#: What the queue holds: a decision, a piece of feedback, or pieces of feedback that are written in one
#: transaction or not at all (a comparison's judge rows: one model's score alone would be a wrong label).
Queued = DecisionRecord | FeedbackRecord | tuple[FeedbackRecord, ...]

logger = logging.getLogger(__name__)

#: Minimum seconds between two "queue full, dropping" warnings.
_DROP_LOG_INTERVAL = 10.0
#: What a record costs in memory besides its conversation (its fields, signals, decision), roughly.
_RECORD_OVERHEAD_BYTES = 2048
#: Seconds :meth:`DecisionRecorder.stop` waits for a write (or purge) it cancelled at its deadline to wind
#: down. A cancelled asyncpg query talks to the server first and waits the driver's command timeout (30 s)
#: for it when the database stopped answering: past this, the write is left to finish in the background.
_CANCEL_GRACE = 1.0
#: Writes and purges given up on at stop, still winding down (referenced so they are not collected mid-way).
_ABANDONED: set[asyncio.Task[None]] = set()


def record_size(rec: Queued) -> int:
    """Roughly what a queued record holds in memory: a fixed overhead plus its conversation (the text a
    route keeps can be as large as the request body, megabytes)."""
    if isinstance(rec, tuple):
        return sum(record_size(item) for item in rec)
    if isinstance(rec, FeedbackRecord):
        return _RECORD_OVERHEAD_BYTES + len(rec.comment or "")
    size = _RECORD_OVERHEAD_BYTES + len(rec.error_message or "")
    conversation = rec.conversation
    if conversation is not None:
        size += len(conversation.text or "") + len(conversation.embedding or b"")
    return size


def _rows(rec: Queued) -> int:
    return len(rec) if isinstance(rec, tuple) else 1


def describe_error(exc: BaseException) -> str:
    """A log-safe name for a store failure: its type and code, never its message."""
    detail: object = getattr(exc, "sqlite_errorname", None) or getattr(exc, "sqlstate", None)
    if detail is None and isinstance(exc, OSError) and exc.errno is not None:
        detail = errno.errorcode.get(exc.errno, exc.errno)
    name = type(exc).__name__
    return f"{name}({detail})" if detail else name


def is_row_error(exc: BaseException) -> bool:
    """Whether a failed write was refused for the values in it (a number out of the column's range, a
    value the driver cannot encode) rather than because the store is unavailable: retrying the same
    rows can never succeed. Connection, timeout, locking and I/O failures are not row errors."""
    import sqlite3

    return isinstance(exc, OverflowError | ValueError | TypeError | sqlite3.DataError | sqlite3.IntegrityError) or (
        getattr(exc, "sqlstate", None) or ""
    ).startswith("22")  # PostgreSQL's class 22: data exception


class _Unwritten(Exception):
    """The records of a batch not yet written when the store failed part-way through one by one."""

    def __init__(self, left: list[Queued], cause: Exception) -> None:
        super().__init__(describe_error(cause))
        self.left, self.cause = left, cause


class DecisionRecorder:
    """Queues decision records and writes them to ``store`` in batches from a background task.

    A batch is written as soon as ``batch_size`` records wait, or ``flush_interval`` seconds after the
    previous flush, whichever comes first. At most ``queue_limit`` records are held; beyond that the
    oldest are dropped and counted in :attr:`dropped`, and so are they while the queued records hold more
    than ``queue_bytes_limit`` bytes (:func:`record_size`; the newest record is always kept): records
    that keep the conversation's text are as large as their requests, and during a database outage
    100 000 of them would exhaust the process's memory. Failed writes are retried after
    ``retry_initial`` seconds, doubling up to ``retry_max``. :meth:`stop` keeps retrying for at most
    ``drain_timeout`` seconds before giving up on what is left (counted as dropped).

    Use from one event loop: :meth:`record` must be called on the loop's thread.
    """

    def __init__(
        self,
        store: DecisionStore,
        batch_size: int = 256,
        flush_interval: float = 0.5,
        queue_limit: int = 100_000,
        *,
        queue_bytes_limit: int = 256 * 1024 * 1024,
        retry_initial: float = 0.1,
        retry_max: float = 5.0,
        drain_timeout: float = 20.0,
        purge_interval: float | None = 600.0,
    ) -> None:
        if batch_size < 1 or queue_limit < 1 or queue_bytes_limit < 1:
            raise ValueError("batch_size, queue_limit and queue_bytes_limit must be at least 1")
        if flush_interval <= 0 or retry_initial <= 0 or retry_max <= 0:
            raise ValueError("flush_interval, retry_initial and retry_max must be positive")
        if drain_timeout < 0:
            raise ValueError("drain_timeout must not be negative")
        if purge_interval is not None and purge_interval <= 0:
            raise ValueError("purge_interval must be positive (or None: never purge)")
        self.store = store
        # A batch larger than the queue could never fill up.
        self.batch_size = min(batch_size, queue_limit)
        self.flush_interval = flush_interval
        self.queue_limit = queue_limit
        self.queue_bytes_limit = queue_bytes_limit
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.drain_timeout = drain_timeout
        self.purge_interval = purge_interval

        self._queue: deque[Queued] = deque()
        self._sizes: deque[int] = deque()  # record_size() of each queued record, in step with _queue
        self._queued_bytes = 0  # sum of _sizes
        self._inflight = 0  # records taken off the queue by a write still in progress
        self._inflight_bytes = 0
        self._written = 0
        self._feedback_written = 0
        self._skipped = 0  # decisions the store left out: a tombstone covers them, or stored already
        self._feedback_skipped = 0
        self._purged = 0
        self._dropped = 0
        self._rejected = 0  # records the store refused for their values (also counted in dropped)
        self._write_errors = 0
        self._last_drop_log = float("-inf")

        self._wake = asyncio.Event()  # set when a full batch is waiting (or on stop)
        self._stop_event = asyncio.Event()  # cuts a retry backoff short
        self._write_lock = asyncio.Lock()  # one write at a time: keeps batches in order
        self._task: asyncio.Task[None] | None = None
        self._purge_task: asyncio.Task[None] | None = None
        self._opened = False
        self._stopping = False
        self._closed = False
        self._stopped = asyncio.Event()  # lets a second stop() wait for the first

    # --- counters (exported as metrics by the gateway) -----------------------------------------

    @property
    def written(self) -> int:
        """Decision records the store wrote."""
        return self._written

    @property
    def feedback_written(self) -> int:
        """Feedback records (from :meth:`record_feedback`) the store accepted."""
        return self._feedback_written

    @property
    def skipped(self) -> int:
        """Records the store left out: a forget's tombstone covers them (their request or tenant was
        forgotten while they waited), or their request id was stored already (a batch retried after part
        of it was written)."""
        return self._skipped

    @property
    def feedback_skipped(self) -> int:
        """Feedback records (from :meth:`record_feedback`) a forget's tombstone kept out."""
        return self._feedback_skipped

    @property
    def purged(self) -> int:
        """Conversations whose expired text was deleted since start."""
        return self._purged

    @property
    def dropped(self) -> int:
        """Records (decisions and feedback) given up on: queue over its limit, recorded after close,
        or unwritable at stop."""
        return self._dropped

    @property
    def pending(self) -> int:
        """Records queued or being written right now."""
        return len(self._queue) + self._inflight

    @property
    def write_errors(self) -> int:
        """Failed batch writes (each retried)."""
        return self._write_errors

    # --- request path --------------------------------------------------------------------------

    def record(self, rec: DecisionRecord) -> None:
        """Queue ``rec`` for writing. Never blocks, never raises."""
        self._enqueue(rec)

    def record_feedback(self, item: FeedbackRecord | tuple[FeedbackRecord, ...]) -> None:
        """Queue a piece of feedback for writing, batched with decisions, or a tuple of pieces that are
        written in one transaction or not at all (never split between batches, dropped whole). Never
        blocks, never raises; nothing tells the caller when (or whether) it was written: use
        :class:`~store.feedback_writer.FeedbackWriter` when a client waits for the acknowledgement."""
        self._enqueue(item[0] if isinstance(item, tuple) and len(item) == 1 else item)

    def _enqueue(self, rec: Queued) -> None:
        try:
            if self._closed:
                self._drop(_rows(rec), "recorder is stopped")
                return
            size = record_size(rec)
            self._queue.append(rec)
            self._sizes.append(size)
            self._queued_bytes += size
            self._trim()
            if len(self._queue) >= self.batch_size and not self._wake.is_set():
                self._wake.set()
        except Exception:  # the request path must never fail because of logging
            logger.exception("could not queue a decision record")

    def _trim(self) -> None:
        over = len(self._queue) + self._inflight - self.queue_limit
        n = rows = 0
        while self._queue and (
            n < over or (self._queued_bytes + self._inflight_bytes > self.queue_bytes_limit and len(self._queue) > 1)
        ):
            rows += _rows(self._popleft())
            n += 1
        if rows:
            self._drop(rows, "queue limit reached")

    def _popleft(self) -> Queued:
        self._queued_bytes -= self._sizes.popleft()
        return self._queue.popleft()

    def _clear(self) -> None:
        self._queue.clear()
        self._sizes.clear()
        self._queued_bytes = 0

    def _drop(self, n: int, why: str) -> None:
        self._dropped += n
        now = time.monotonic()
        if now - self._last_drop_log >= _DROP_LOG_INTERVAL:
            self._last_drop_log = now
            logger.warning("dropping decision records (%s); %d dropped so far", why, self._dropped)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store and start the background writer."""
        if self._closed or self._stopping:
            raise RuntimeError("a stopped DecisionRecorder cannot be restarted")
        if self._task is not None:
            return
        await self.store.open()
        self._opened = True
        self._task = asyncio.create_task(self._run(), name="pointsman-decision-recorder")
        if self.purge_interval is not None:
            self._purge_task = asyncio.create_task(self._purge_loop(self.purge_interval), name="pointsman-text-purge")

    async def stop(self) -> None:
        """Write everything still queued, then close the store.

        Records queued while stopping are written too. If the store keeps failing, retries go on
        for ``drain_timeout`` seconds; whatever is left then is counted as dropped and logged.
        """
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._stop_event.set()
        self._wake.set()
        deadline = time.monotonic() + self.drain_timeout
        if self._purge_task is not None:
            purge, self._purge_task = self._purge_task, None
            purge.cancel()
            await _wind_down(purge)
        if not self._opened and self._queue:
            # Never started, but records were queued: they still deserve a write.
            try:
                await self.store.open()
                self._opened = True
            except Exception as exc:
                logger.error("opening the decision store at shutdown failed: %s", describe_error(exc))
        if self._task is not None:
            task, self._task = self._task, None
            # The writer exits after its current write; a write hung past the deadline is
            # cancelled and its batch goes back to the queue (or, when the cancellation itself hangs,
            # is counted as lost below).
            _done, still_running = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
            if still_running:
                task.cancel()
                await _wind_down(task)
            elif not task.cancelled() and (died := task.exception()) is not None:
                logger.error("the decision recorder task had died: %s", describe_error(died))
        try:
            if self._opened:
                await self._drain(deadline)
        finally:
            self._closed = True
            # A write given up on still holds its batch (it may yet commit: writes are idempotent).
            left = len(self._queue) + self._inflight
            if left:
                self._clear()
                self._inflight, self._inflight_bytes = 0, 0
                self._dropped += left
                logger.error("decision store unavailable at shutdown: %d decision records lost", left)
            try:
                await self.store.close()
            except Exception as exc:
                logger.error("closing the decision store failed: %s", describe_error(exc))
            finally:
                self._stopped.set()

    async def flush(self) -> None:
        """Write every queued record now (and wait for a write in progress).

        Raises the store's error if a write fails; the failed batch stays queued.
        """
        while self._queue or self._inflight:
            async with self._write_lock:
                if self._queue:
                    await self._write_batch()

    # --- writing -------------------------------------------------------------------------------

    async def _write_batch(self) -> None:
        """Write the oldest batch_size records; on failure put them back at the front. Caller holds
        the write lock.

        A batch refused for what is in it (:func:`is_row_error`) is written again one record at a time,
        and a record the store refuses on its own is dropped and counted: retrying it could never
        succeed, and left at the front of the queue it would block every record behind it for good.
        """
        n = min(self.batch_size, len(self._queue))
        sizes = [self._sizes[i] for i in range(n)]
        batch = [self._popleft() for _ in range(n)]
        self._inflight, self._inflight_bytes = n, sum(sizes)
        try:
            try:
                self._count_written(batch, await self._write(batch))
            except Exception as exc:
                if not is_row_error(exc):
                    raise
                self._write_errors += 1
                await self._write_one_by_one(batch)
        except BaseException as exc:
            if self._closed:
                raise  # given up on at stop, which counted the batch as lost
            self._inflight, self._inflight_bytes = 0, 0
            unwritten = exc.left if isinstance(exc, _Unwritten) else batch
            self._queue.extendleft(reversed(unwritten))
            back = sizes[len(sizes) - len(unwritten):]  # the unwritten records are the batch's tail
            self._sizes.extendleft(reversed(back))
            self._queued_bytes += sum(back)
            # Records that arrived during the write may have pushed the total over the limit.
            self._trim()
            if isinstance(exc, _Unwritten):
                raise exc.cause from None
            if isinstance(exc, Exception):
                self._write_errors += 1
            raise
        self._inflight, self._inflight_bytes = 0, 0

    async def _write(self, batch: list[Queued]) -> tuple[int, int]:
        """Write ``batch``; how many of its decisions and of its feedback rows the store left out."""
        decisions = [r for r in batch if isinstance(r, DecisionRecord)]
        feedback = [f for r in batch if not isinstance(r, DecisionRecord)
                    for f in (r if isinstance(r, tuple) else (r,))] if len(decisions) < len(batch) else []
        # Both writes are idempotent, so a batch retried after the second failed is harmless.
        skipped = skipped_feedback = 0
        if decisions:
            skipped = await self.store.write_batch(decisions) or 0
        if feedback:
            skipped_feedback = len(await self.store.write_feedback(feedback) or ())
        return skipped, skipped_feedback

    async def _write_one_by_one(self, batch: list[Queued]) -> None:
        for i, record in enumerate(batch):
            try:
                skipped = await self._write([record])
            except Exception as exc:
                if not is_row_error(exc):  # the store went away meanwhile: the rest waits for it
                    self._write_errors += 1
                    raise _Unwritten(batch[i:], exc) from exc
                self._reject(record, exc)
            else:
                self._count_written([record], skipped)

    def _count_written(self, batch: list[Queued], skipped: tuple[int, int]) -> None:
        """Count ``batch`` as written but for what the store left out (``skipped``: decisions, feedback rows)."""
        self._written += sum(isinstance(r, DecisionRecord) for r in batch) - skipped[0]
        self._feedback_written += sum(_rows(r) for r in batch if not isinstance(r, DecisionRecord)) - skipped[1]
        self._skipped += skipped[0]
        self._feedback_skipped += skipped[1]

    def _reject(self, record: Queued, exc: Exception) -> None:
        self._dropped += _rows(record)
        self._rejected += 1
        logger.error(
            "the decision store refused %s %s (%s); dropped it, %d refused so far",
            "decision record" if isinstance(record, DecisionRecord) else "feedback for",
            (record[0] if isinstance(record, tuple) else record).request_id,
            describe_error(exc),
            self._rejected,
        )

    async def _purge_loop(self, interval: float) -> None:
        """Delete expired conversation text now and every ``interval`` seconds."""
        while True:
            try:
                purged = await self.store.purge_expired_text(time.time())
            except Exception as exc:
                logger.warning("purging expired conversation text failed: %s", describe_error(exc))
            else:
                self._purged += purged
                if purged:
                    logger.info("deleted the text of %d conversations past their retention", purged)
            await asyncio.sleep(interval)

    def _backoff(self, failures: int) -> float:
        return float(min(self.retry_max, self.retry_initial * 2 ** min(failures - 1, 30)))

    def _log_failure(self, exc: Exception, delay: float) -> None:
        logger.warning(
            "decision store write failed: %s; %d records pending, retrying in %.2fs",
            describe_error(exc),
            self.pending,
            delay,
        )

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            if len(self._queue) < self.batch_size:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_interval):
                        await self._wake.wait()
            self._wake.clear()
            while self._queue and not self._stopping:
                try:
                    async with self._write_lock:
                        if self._queue:
                            await self._write_batch()
                    failures = 0
                except Exception as exc:
                    failures += 1
                    delay = self._backoff(failures)
                    self._log_failure(exc, delay)
                    # Woken early only by stop(), which then drains on its own.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._stop_event.wait()

    async def _drain(self, deadline: float) -> None:
        failures = 0
        while self._queue:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                # within, not asyncio.timeout: that waits for the cancelled write to wind down, which
                # for a database that stopped answering is the driver's command timeout.
                await within(self._write_next(), remaining)
                failures = 0
            except Exception as exc:
                if isinstance(exc, TimeoutError) and time.monotonic() >= deadline:
                    return  # the write given up on is counted as lost by stop
                failures += 1
                delay = min(self._backoff(failures), max(0.0, deadline - time.monotonic()))
                self._log_failure(exc, delay)
                await asyncio.sleep(delay)

    async def _write_next(self) -> None:
        async with self._write_lock:
            if self._queue:
                await self._write_batch()


async def _wind_down(task: asyncio.Task[None]) -> None:
    """Wait for a cancelled task to end, for at most :data:`_CANCEL_GRACE` seconds; past that it is left
    to end in the background."""
    await asyncio.wait({task}, timeout=_CANCEL_GRACE)
    if not task.done():
        _ABANDONED.add(task)
        task.add_done_callback(_ended)
    elif not task.cancelled():
        task.exception()  # retrieved: a failure at stop is not worth a second log line


def _ended(task: asyncio.Task[None]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()
