"""``pointsman forget`` leaves a tombstone, so what a running gateway still holds of a forgotten request is not
written after the forget: decision records (with their conversation and sub-calls) queued in its recorder,
judge and implicit feedback, a client's feedback on an id it still remembers.

A tenant's tombstone covers the requests issued up to the forget; the tenant's later traffic is kept. Step 7
of the schema adds the tombstone tables; a step-6 database keeps its rows when it is upgraded.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from store import (
    SCHEMA_VERSION,
    ConversationRecord,
    DecisionRecord,
    DecisionRecorder,
    FeedbackRecord,
    PostgresDecisionStore,
    SQLiteDecisionStore,
    SubCallRecord,
)
from store._codec import encode_row
from store.admin import forget
from store.base import DecisionStore
from store.schema import insert_decisions_sql, migrations, version_table_ddl
from tests.store.conftest import pg_schema

pytestmark = pytest.mark.asyncio(loop_scope="session")

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
MakeRecord = Callable[..., DecisionRecord]


def _with_children(record: DecisionRecord) -> DecisionRecord:
    record.conversation = ConversationRecord(record.request_id, record.created_at, record.tenant,
                                             text=f"the text of {record.request_id}")
    record.subcalls = [SubCallRecord(record.request_id, 0, "panel", "draft", created_at=record.created_at,
                                     tenant=record.tenant)]
    return record


async def _on_each(kind: str, tmp_path: Any, check: Callable[[str], Any]) -> None:
    if kind == "sqlite":
        await check(f"sqlite://{tmp_path}/decisions.db")
        return
    async with pg_schema() as dsn:
        await check(dsn)


def _store(url: str) -> DecisionStore:
    return SQLiteDecisionStore(url.removeprefix("sqlite://")) if url.startswith("sqlite://") else \
        PostgresDecisionStore(url)


async def _rows(store: DecisionStore, request_id: str) -> tuple[bool, int, int, bool]:
    """(decision stored, feedback rows, sub-calls, conversation stored) of ``request_id``."""
    logged = [r for r in await store.logged_requests() if r.record.request_id == request_id]
    return (await store.fetch(request_id) is not None, len(await store.fetch_feedback(request_id)),
            len(await store.fetch_subcalls(request_id)), bool(logged and logged[0].conversation))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_record_queued_before_a_forget_and_flushed_after_it_is_not_written(
    kind: str, make_record: MakeRecord, tmp_path: Any
) -> None:
    async def check(url: str) -> None:
        store = _store(url)
        # Nothing is flushed until stop(): the records wait in the queue while forget runs.
        recorder = DecisionRecorder(store, flush_interval=3600, batch_size=10_000)
        await recorder.start()
        try:
            now = time.time()
            recorder.record(_with_children(make_record(1, tenant="acme", created_at=now - 5)))
            recorder.record(_with_children(make_record(2, tenant="acme", created_at=now - 4)))
            recorder.record(_with_children(make_record(3, tenant="other", created_at=now - 3)))
            recorder.record(_with_children(make_record(4, tenant="other", created_at=now - 2)))
            recorder.record(make_record(5, tenant="other", created_at=now - 1, request_id="req-000004:shadow:b",
                                        shadow_of="req-000004"))
            recorder.record_feedback(FeedbackRecord("req-000001", 1.0, source="judge", tenant="acme",
                                                    created_at=now))
            recorder.record_feedback(FeedbackRecord("req-000004", 1.0, source="judge", tenant="other",
                                                    created_at=now))
            assert await forget(url, tenant="acme") is not None
            assert await forget(url, request_id="req-000004") is not None
            # Issued after the tenant's forget: new traffic, kept.
            recorder.record(_with_children(make_record(6, tenant="acme", created_at=time.time() + 1)))
        finally:
            await recorder.stop()
        assert recorder.dropped == 0
        # What the metrics say: 2 of 6 decisions and 0 of 2 feedback rows written (before: all 8 "written").
        assert (recorder.written, recorder.skipped) == (2, 4)
        assert (recorder.feedback_written, recorder.feedback_skipped) == (0, 2)
        await store.open()
        try:
            assert await _rows(store, "req-000001") == (False, 0, 0, False)
            assert await _rows(store, "req-000002") == (False, 0, 0, False)
            assert await _rows(store, "req-000004") == (False, 0, 0, False)
            assert await store.fetch("req-000004:shadow:b") is None
            assert await _rows(store, "req-000003") == (True, 0, 1, True)
            assert await _rows(store, "req-000006") == (True, 0, 1, True)
            assert await store.count() == 2
        finally:
            await store.close()

    await _on_each(kind, tmp_path, check)


@pytest.mark.parametrize("kind", KINDS)
async def test_feedback_written_after_a_forget_is_skipped_only_for_what_the_tombstone_covers(
    kind: str, make_record: MakeRecord, tmp_path: Any
) -> None:
    async def check(url: str) -> None:
        store = _store(url)
        await store.open()
        try:
            old = time.time() - 60
            await store.write_batch([make_record(1, tenant="acme", created_at=old),
                                     make_record(2, tenant="other", created_at=old)])
            await forget(url, tenant="acme")
            await forget(url, request_id="req-000002")
            later = make_record(3, tenant="acme", created_at=time.time() + 1)
            await store.write_batch([later])
            skipped = await store.write_feedback([
                FeedbackRecord("req-000001", 1.0, tenant="acme", created_at=time.time(), issued_at=old),
                FeedbackRecord("req-000003", 0.5, tenant="acme", created_at=time.time(), issued_at=later.created_at),
                FeedbackRecord("req-000002", 1.0, tenant="other", created_at=time.time(), issued_at=old),
                # Judge rows the recorder writes know no issue time: the decision's, or else their own.
                FeedbackRecord("req-000001", 1.0, source="judge", tenant="acme", created_at=old + 1),
                FeedbackRecord("req-000003", 1.0, source="judge", tenant="acme", created_at=time.time()),
            ])
            assert sorted(skipped) == [0, 2, 3]
            assert [len(await store.fetch_feedback(f"req-00000{i}")) for i in (1, 2, 3)] == [0, 0, 2]
        finally:
            await store.close()

    await _on_each(kind, tmp_path, check)


# --- step 7: upgrading a step-6 database keeps its rows ---------------------------------------------


V6_ROW = {"request_id": "v6-1", "created_at": 1_760_000_000.0, "endpoint": "chat.completions", "route": "auto",
          "tenant": "acme", "stream": False, "signals": "{}", "decision": "{}", "reason": "knob", "status": 200,
          "outcome": "ok", "attempts": 1}


def _build_v6_sqlite(path: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(version_table_ddl("sqlite"))
        for version, statements in migrations("sqlite")[:6]:
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))
        conn.execute(f"INSERT INTO decisions ({', '.join(V6_ROW)}) VALUES ({', '.join('?' for _ in V6_ROW)})",
                     tuple(V6_ROW.values()))
        conn.execute("INSERT INTO feedback (request_id, created_at, score, tenant) VALUES ('v6-1', 1, 1.0, 'acme')")
        conn.commit()
    finally:
        conn.close()


async def _build_v6_postgres(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(version_table_ddl("postgres"))
            for version, statements in migrations("postgres")[:6]:
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                                   version, time.time())
            marks = ", ".join(f"${n}::jsonb" if k in ("signals", "decision") else f"${n}"
                              for n, k in enumerate(V6_ROW, start=1))
            await conn.execute(f"INSERT INTO decisions ({', '.join(V6_ROW)}) VALUES ({marks})", *V6_ROW.values())
            await conn.execute(
                "INSERT INTO feedback (request_id, created_at, score, tenant) VALUES ('v6-1', 1, 1.0, 'acme')")
    finally:
        await conn.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_step6_database_upgraded_to_step7_keeps_its_rows_and_honours_tombstones(
    kind: str, make_record: MakeRecord, tmp_path: Any
) -> None:
    assert SCHEMA_VERSION == 7 and [v for v, _ in migrations("sqlite")] == [1, 2, 3, 4, 5, 6, 7]

    async def check(url: str) -> None:
        if kind == "sqlite":
            _build_v6_sqlite(url.removeprefix("sqlite://"))
        else:
            await _build_v6_postgres(url)
        store = _store(url)
        await store.open()
        try:
            assert store.schema_version == 7
            assert await store.count() == 1 and len(await store.fetch_feedback("v6-1")) == 1
        finally:
            await store.close()
        await forget(url, request_id="v6-1")
        store = _store(url)
        await store.open()
        try:
            await store.write_batch([make_record(1, request_id="v6-1", tenant="acme")])
            assert await store.count() == 0
        finally:
            await store.close()

    await _on_each(kind, tmp_path, check)


# --- PostgreSQL: a gateway's write in flight when the forget starts ---------------------------------


@pytest.mark.postgres
async def test_a_decision_write_in_flight_when_a_forget_starts_does_not_outlive_it(make_record: MakeRecord) -> None:
    """A gateway's batch that inserted its rows but has not committed when the forget begins: its statement
    ran before the tombstone existed, and the forget's deletes cannot see its uncommitted rows. The forget
    waits for that transaction (and new writes wait for the forget), so the row does not survive it."""
    async with pg_schema() as dsn:
        store = PostgresDecisionStore(dsn)
        await store.open()
        await store.close()
        schema = dsn.rsplit("search_path=", 1)[1]
        gateway = await asyncpg.connect(dsn)
        try:
            in_flight = gateway.transaction()
            await in_flight.start()
            await gateway.executemany(insert_decisions_sql("postgres"),
                                      [encode_row(make_record(1, tenant="acme", created_at=time.time() - 1))])
            forgetting = asyncio.create_task(forget(dsn, tenant="acme"))
            # Until the forget has done what it does while the write is open: finished, or waiting for a lock
            # (PostgreSQL signals neither to another session: pg_locks is read until it shows).
            deadline = time.monotonic() + 30
            while not forgetting.done() and not await gateway.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE NOT l.granted AND n.nspname = $1", schema,
            ):
                assert time.monotonic() < deadline, "the forget neither finished nor waited for the open write"
                await asyncio.sleep(0.01)
            await in_flight.commit()
            assert (await forgetting)["decisions"] == 1
        finally:
            await gateway.close()
        await store.open()
        try:
            assert await store.count() == 0
        finally:
            await store.close()


@pytest.mark.postgres
async def test_other_tenants_are_written_while_a_forget_deletes(make_record: MakeRecord) -> None:
    """The forget's table lock is held only until its tombstone commits, not through the deletes: a large
    tenant's deletes took that long, and every replica's decision and feedback writes of every other tenant
    waited behind them (feedback answered 503 once the store's deadline passed). Here one of the tenant's
    rows is locked by another session, so the forget's deletes wait on it for as long as the test likes."""
    async with pg_schema() as dsn:
        store = PostgresDecisionStore(dsn)
        await store.open()
        holder, watcher = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        try:
            await store.write_batch([make_record(1, request_id="big-1", tenant="big", created_at=time.time() - 1)])
            held = holder.transaction()
            await held.start()
            await holder.execute("SELECT 1 FROM decisions WHERE tenant = 'big' FOR UPDATE")
            forgetting = asyncio.create_task(forget(dsn, tenant="big"))
            deadline = time.monotonic() + 30
            while not await watcher.fetchval(  # until the forget's delete waits for the held row (outside a
                # transaction: one caches what pg_stat_activity showed at its first read)
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid'"
            ):
                assert not forgetting.done(), forgetting.result()
                assert time.monotonic() < deadline, "the forget's delete never waited for the held row"
                await asyncio.sleep(0.01)
            other = make_record(2, request_id="other-1", tenant="other", created_at=time.time())
            await asyncio.wait_for(store.write_batch([other]), timeout=20)
            await asyncio.wait_for(store.write_feedback([FeedbackRecord("other-1", 1.0, tenant="other")]), timeout=20)
            assert not forgetting.done()
            await held.commit()
            assert (await forgetting)["decisions"] == 1
            assert await store.fetch("big-1") is None and await store.fetch("other-1") is not None
            assert len(await store.fetch_feedback("other-1")) == 1
        finally:
            await holder.close()
            await watcher.close()
            await store.close()
