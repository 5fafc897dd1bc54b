"""DecisionRecorder against real stores.

The stores that fail are real SQLite stores whose write_batch raises while told to: the unit under
test is the recorder's batching, retry and shutdown behaviour, not the database.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence

import asyncpg
import pytest

from store import ConversationRecord, DecisionRecord, DecisionRecorder, PostgresDecisionStore, SQLiteDecisionStore
from tests.polling import eventually_async

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]
SECRET = "SECRET-PROMPT-TEXT"


class FlakySQLiteStore(SQLiteDecisionStore):
    """A real SQLite store whose first ``fail_first`` writes fail, and which fails while ``down``
    (or never returns while ``hang``)."""

    def __init__(self, path: str, fail_first: int = 0) -> None:
        super().__init__(path)
        self.fail_first = fail_first
        self.down = False
        self.hang = False
        self.calls = 0

    async def write_batch(self, records: Sequence[DecisionRecord]) -> None:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.calls <= self.fail_first or self.down:
            # Driver messages can quote row data; the recorder must not log them.
            raise sqlite3.OperationalError(f"disk I/O error near {SECRET}")
        await super().write_batch(records)


def stored_ids(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT request_id FROM decisions ORDER BY request_id")]
    finally:
        conn.close()


async def test_stop_writes_everything_recorded_just_before(sqlite_path: str, make_record: MakeRecord) -> None:
    recorder = DecisionRecorder(SQLiteDecisionStore(sqlite_path), batch_size=256, flush_interval=60)
    await recorder.start()
    for i in range(1000):  # not a multiple of the batch size: a partial batch is left at stop
        recorder.record(make_record(i))
    await recorder.stop()
    assert len(stored_ids(sqlite_path)) == 1000
    assert (recorder.written, recorder.pending, recorder.dropped) == (1000, 0, 0)


async def test_full_batch_is_written_without_waiting_for_the_interval(
    sqlite_path: str, make_record: MakeRecord
) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    recorder = DecisionRecorder(store, batch_size=50, flush_interval=60)
    await recorder.start()
    try:
        for i in range(50):
            recorder.record(make_record(i))
        await eventually_async(lambda: recorder.written == 50)
        assert await store.count() == 50
        # Less than a batch waits for the interval (60 s here), so it is still queued.
        for i in range(50, 60):
            recorder.record(make_record(i))
        await asyncio.sleep(0.2)
        assert recorder.pending == 10 and recorder.written == 50
    finally:
        await recorder.stop()
    assert len(stored_ids(sqlite_path)) == 60


async def test_interval_flushes_a_partial_batch(sqlite_path: str, make_record: MakeRecord) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    recorder = DecisionRecorder(store, batch_size=1000, flush_interval=0.05)
    await recorder.start()
    try:
        for i in range(3):
            recorder.record(make_record(i))
        await eventually_async(lambda: recorder.written == 3)
        assert await store.fetch("req-000002") == make_record(2)
    finally:
        await recorder.stop()


async def test_failed_writes_are_retried_and_logged_without_text(
    sqlite_path: str, make_record: MakeRecord, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakySQLiteStore(sqlite_path, fail_first=3)
    recorder = DecisionRecorder(store, batch_size=40, flush_interval=0.02, retry_initial=0.01, retry_max=0.05)
    caplog.set_level(logging.DEBUG, logger="store")
    await recorder.start()
    try:
        records = [make_record(i, reason=SECRET, error_message=SECRET) for i in range(100)]
        for rec in records:
            recorder.record(rec)
        await eventually_async(lambda: recorder.written == 100)
        assert recorder.write_errors == 3
        assert recorder.dropped == 0 and recorder.pending == 0
        assert await store.count() == 100
        assert await store.fetch("req-000000") == records[0]
    finally:
        await recorder.stop()
    failures = [r for r in caplog.records if "write failed" in r.getMessage()]
    assert len(failures) == 3
    assert "OperationalError" in failures[0].getMessage()
    assert SECRET not in caplog.text


async def test_outage_keeps_newest_records_up_to_the_queue_limit(sqlite_path: str, make_record: MakeRecord) -> None:
    store = FlakySQLiteStore(sqlite_path)
    store.down = True
    recorder = DecisionRecorder(
        store, batch_size=10, flush_interval=0.01, queue_limit=100, retry_initial=0.01, retry_max=0.02
    )
    await recorder.start()
    try:
        for i in range(250):
            recorder.record(make_record(i))
        assert (recorder.pending, recorder.dropped) == (100, 150)
        await eventually_async(lambda: recorder.write_errors >= 3)
        assert (recorder.pending, recorder.dropped, recorder.written) == (100, 150, 0)

        store.down = False
        await eventually_async(lambda: recorder.written == 100)
    finally:
        await recorder.stop()
    assert stored_ids(sqlite_path) == [f"req-{i:06d}" for i in range(150, 250)]


async def test_record_never_blocks(sqlite_path: str, make_record: MakeRecord) -> None:
    records = [make_record(i) for i in range(50_000)]
    recorder = DecisionRecorder(SQLiteDecisionStore(sqlite_path))
    await recorder.start()
    started = time.perf_counter()
    for rec in records:
        recorder.record(rec)
    elapsed = time.perf_counter() - started
    # Nothing was written inline: record() only queued (no await happened, so the writer never ran).
    assert recorder.written == 0 and recorder.pending == 50_000
    assert elapsed < 5.0, f"recording 50k records took {elapsed:.2f}s"
    await recorder.stop()
    assert recorder.written == 50_000 and recorder.dropped == 0
    assert len(stored_ids(sqlite_path)) == 50_000


async def test_flush_writes_now_and_raises_when_the_store_fails(sqlite_path: str, make_record: MakeRecord) -> None:
    store = FlakySQLiteStore(sqlite_path)
    await store.open()
    recorder = DecisionRecorder(store, batch_size=2)  # not started: only flush() writes
    try:
        for i in range(5):
            recorder.record(make_record(i))
        store.down = True
        with pytest.raises(sqlite3.OperationalError):
            await recorder.flush()
        assert recorder.pending == 5 and recorder.write_errors == 1
        store.down = False
        await recorder.flush()
        assert recorder.written == 5 and await store.count() == 5
    finally:
        await recorder.stop()


async def test_stop_gives_up_after_drain_timeout(sqlite_path: str, make_record: MakeRecord) -> None:
    store = FlakySQLiteStore(sqlite_path)
    store.down = True
    recorder = DecisionRecorder(store, batch_size=5, retry_initial=0.01, drain_timeout=0.3)
    await recorder.start()
    for i in range(20):
        recorder.record(make_record(i))
    started = time.monotonic()
    await recorder.stop()
    assert time.monotonic() - started < 3.0
    assert (recorder.written, recorder.pending, recorder.dropped) == (0, 0, 20)
    with pytest.raises(RuntimeError, match="not open"):
        await store.count()  # the store was closed all the same

    recorder.record(make_record(99))  # after stop: counted, never raised
    assert recorder.dropped == 21


async def test_stop_cancels_a_hung_write_at_the_deadline(sqlite_path: str, make_record: MakeRecord) -> None:
    store = FlakySQLiteStore(sqlite_path)
    store.hang = True
    recorder = DecisionRecorder(store, batch_size=5, flush_interval=0.01, drain_timeout=0.3)
    await recorder.start()
    for i in range(12):
        recorder.record(make_record(i))
    await eventually_async(lambda: store.calls >= 1)
    assert recorder.pending == 12  # the hung batch still counts as pending
    started = time.monotonic()
    await recorder.stop()
    assert time.monotonic() - started < 3.0
    assert (recorder.written, recorder.pending, recorder.dropped) == (0, 0, 12)


async def test_stop_without_start_still_writes_what_was_recorded(sqlite_path: str, make_record: MakeRecord) -> None:
    recorder = DecisionRecorder(SQLiteDecisionStore(sqlite_path))
    for i in range(3):
        recorder.record(make_record(i))
    await recorder.stop()
    assert len(stored_ids(sqlite_path)) == 3


async def test_records_queued_during_stop_are_written(sqlite_path: str, make_record: MakeRecord) -> None:
    store = FlakySQLiteStore(sqlite_path, fail_first=1)
    recorder = DecisionRecorder(store, batch_size=10, flush_interval=0.01, retry_initial=0.05)
    await recorder.start()
    for i in range(10):
        recorder.record(make_record(i))
    stopping = asyncio.create_task(recorder.stop())
    await asyncio.sleep(0)
    for i in range(10, 15):  # requests still finishing while the gateway shuts down
        recorder.record(make_record(i))
    await stopping
    assert len(stored_ids(sqlite_path)) == 15


@pytest.mark.postgres
async def test_recorder_with_postgres(pg_dsn: str, make_record: MakeRecord) -> None:
    recorder = DecisionRecorder(PostgresDecisionStore(pg_dsn), batch_size=256, flush_interval=0.05)
    await recorder.start()
    for i in range(2000):
        recorder.record(make_record(i, signals={"i": i}))
    await recorder.stop()
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM decisions") == 2000
        assert await conn.fetchval("SELECT signals->>'i' FROM decisions WHERE request_id = 'req-001999'") == "1999"
    finally:
        await conn.close()


async def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        DecisionRecorder(SQLiteDecisionStore(":memory:"), batch_size=0)
    with pytest.raises(ValueError):
        DecisionRecorder(SQLiteDecisionStore(":memory:"), flush_interval=0)


async def test_concurrent_stops_both_wait_for_the_drain(sqlite_path: str, make_record: MakeRecord) -> None:
    recorder = DecisionRecorder(SQLiteDecisionStore(sqlite_path), flush_interval=60)
    await recorder.start()
    for i in range(300):
        recorder.record(make_record(i))
    await asyncio.gather(recorder.stop(), recorder.stop())
    assert recorder.written == 300 and len(stored_ids(sqlite_path)) == 300


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_record_the_store_refuses_is_dropped_not_retried_forever(
    backend: str, sqlite_path: str, pg_dsn: str, make_record: MakeRecord, caplog: pytest.LogCaptureFixture
) -> None:
    # A token count past the 64-bit column (from an upstream's broken usage) once put its batch back at the
    # front of the queue on every retry: no later record was ever written.
    store = SQLiteDecisionStore(sqlite_path) if backend == "sqlite" else PostgresDecisionStore(pg_dsn)
    recorder = DecisionRecorder(store, batch_size=8, flush_interval=0.02, retry_initial=0.01, retry_max=0.05)
    caplog.set_level(logging.DEBUG, logger="store")
    await recorder.start()
    try:
        for i in range(20):
            overrides = {"prompt_tokens": 2**63 + 5, "reason": SECRET} if i == 3 else {}
            recorder.record(make_record(i, **overrides))
        await eventually_async(lambda: recorder.written == 19)
        assert recorder.dropped == 1 and recorder.pending == 0
    finally:
        await recorder.stop()
    if backend == "sqlite":
        ids = stored_ids(sqlite_path)
    else:
        conn = await asyncpg.connect(pg_dsn)
        try:
            ids = [r[0] for r in await conn.fetch("SELECT request_id FROM decisions ORDER BY request_id")]
        finally:
            await conn.close()
    assert ids == [f"req-{i:06d}" for i in range(20) if i != 3]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "req-000003" in refused[0]
    assert SECRET not in caplog.text


async def test_an_outage_during_the_one_by_one_retry_keeps_the_rest(sqlite_path: str, make_record: MakeRecord) -> None:
    class FailsAfterARowError(FlakySQLiteStore):
        async def write_batch(self, records: Sequence[DecisionRecord]) -> None:
            if any(r.request_id == "req-000001" for r in records):
                if len(records) == 1:  # refused on its own; right after, the store goes away
                    self.down = True
                raise OverflowError("Python int too large to convert to SQLite INTEGER")
            await super().write_batch(records)

    store = FailsAfterARowError(sqlite_path)
    recorder = DecisionRecorder(store, batch_size=4, flush_interval=0.02, retry_initial=0.01, retry_max=0.05)
    await recorder.start()
    try:
        for i in range(4):
            recorder.record(make_record(i))
        # req-000000 was written alone before the outage hit; req-000001 refused; the other two wait.
        await eventually_async(lambda: recorder.dropped == 1 and recorder.written == 1 and recorder.pending == 2)
        store.down = False
        await eventually_async(lambda: recorder.written == 3)
    finally:
        await recorder.stop()
    assert stored_ids(sqlite_path) == ["req-000000", "req-000002", "req-000003"]


async def test_an_outage_with_large_conversations_is_bounded_in_bytes(
    sqlite_path: str, make_record: MakeRecord
) -> None:
    # Routes that keep the conversation's text record requests as large as their bodies (megabytes):
    # an outage must cost bounded memory, not queue_limit such records.
    store = FlakySQLiteStore(sqlite_path)
    store.down = True
    mib = 1024 * 1024
    recorder = DecisionRecorder(
        store, batch_size=4, flush_interval=0.01, queue_bytes_limit=10 * mib, retry_initial=0.01, retry_max=0.02
    )
    await recorder.start()
    try:
        for i in range(40):
            text = chr(ord("a") + i % 26) * mib
            recorder.record(make_record(i, conversation=ConversationRecord(f"req-{i:06d}", 1.0, text=text)))
        await eventually_async(lambda: recorder.write_errors >= 2)
        assert recorder.pending < 10 and recorder.dropped == 40 - recorder.pending
        store.down = False
        kept = recorder.pending
        await eventually_async(lambda: recorder.written == kept)
    finally:
        await recorder.stop()
    # The newest records were kept, whole.
    assert stored_ids(sqlite_path) == [f"req-{i:06d}" for i in range(40 - kept, 40)]
    conn = sqlite3.connect(sqlite_path)
    try:
        assert conn.execute("SELECT length(text) FROM conversations").fetchall() == [(mib,)] * kept
    finally:
        conn.close()


async def test_one_record_larger_than_the_byte_limit_is_still_written(
    sqlite_path: str, make_record: MakeRecord
) -> None:
    recorder = DecisionRecorder(SQLiteDecisionStore(sqlite_path), flush_interval=0.01, queue_bytes_limit=1000)
    await recorder.start()
    try:
        recorder.record(make_record(1, conversation=ConversationRecord("req-000001", 1.0, text="x" * 5000)))
        await eventually_async(lambda: recorder.written == 1)
        assert recorder.dropped == 0
    finally:
        await recorder.stop()
