"""Feedback, conversations, forgetting and retention in the store, plus the two feedback writers
(fire-and-forget through the recorder, durable through FeedbackWriter), on real SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import asyncpg
import pytest

from store import (
    ConversationRecord,
    DecisionRecord,
    DecisionRecorder,
    FeedbackRecord,
    FeedbackWriter,
    PostgresDecisionStore,
    SQLiteDecisionStore,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
    open_store_url,
)
from store.base import DecisionStore
from store.url import masked_store_url, opened_store
from tests.polling import eventually_async

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]


def conversation(request_id: str, *, tenant: str | None = None, text: str | None = None,
                 expires_at: float | None = None) -> ConversationRecord:
    return ConversationRecord(
        request_id=request_id, created_at=1_700_000_000.0, tenant=tenant, encoder_id="static:test",
        embedding=b"\x00\x00\x80?" * 4, text=text, expires_at=expires_at,
    )


# --- feedback rows -------------------------------------------------------------------------------


async def test_feedback_round_trips_and_repeats_replace(store: DecisionStore) -> None:
    first = FeedbackRecord("req-1", 0.0, label="down", comment="wrong answer", tenant="acme",
                           created_at=1.0, metadata={"kind": "thumbs"})
    await store.write_feedback([first])
    assert await store.fetch_feedback("req-1") == [first]
    # Same key (request, metric, source, model): replaced, not added; in one batch the last wins.
    second = FeedbackRecord("req-1", 1.0, label="up", tenant="acme", created_at=2.0)
    await store.write_feedback([second, second])
    assert await store.fetch_feedback("req-1") == [second]
    # Another metric, source or model is another row.
    others = [
        FeedbackRecord("req-1", 0.5, metric="helpfulness", tenant="acme", created_at=3.0),
        FeedbackRecord("req-1", 1.0, source="judge", model="big", created_at=3.0),
        FeedbackRecord("req-1", 0.0, source="judge", model="small", created_at=3.0),
    ]
    await store.write_feedback(others)
    got = await store.fetch_feedback("req-1")
    assert [(f.metric, f.source, f.model) for f in got] == [
        ("helpfulness", "user", ""), ("quality", "judge", "big"), ("quality", "judge", "small"),
        ("quality", "user", ""),
    ]
    assert await store.feedback_count() == 4
    assert await store.fetch_feedback("no-such-request") == []


async def test_feedback_text_with_nul_is_stored(store: DecisionStore) -> None:
    await store.write_feedback([FeedbackRecord("req-nul", 1.0, comment="a\x00b", label="x\x00")])
    [got] = await store.fetch_feedback("req-nul")
    assert got.comment in ("ab", "a\x00b") and got.label in ("x", "x\x00")



async def test_an_id_holding_nul_is_found_nowhere_on_either_store(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    # PostgreSQL text cannot hold U+0000: a lookup by such an id raised CharacterNotInRepertoireError
    # (the feedback endpoint answered it 503 store_unavailable) where SQLite found nothing.
    await store.write_batch([make_record(1)])
    await store.write_feedback([FeedbackRecord("req-000001", 1.0)])
    for odd in ("req-000001\x00", "req-\x00000001", "\x00"):
        assert await store.fetch(odd) is None
        assert await store.fetch_feedback(odd) == []
        assert await store.fetch_subcalls(odd) == []
    assert (await store.fetch("req-000001")) is not None

# --- conversations and logged requests ------------------------------------------------------------


async def test_logged_requests_join_decisions_conversations_and_feedback(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    records = [
        make_record(1, conversation=conversation("req-000001", text='[{"role":"user","content":"hi"}]')),
        make_record(2, route="other"),
        make_record(3, router_version="v7", propensity=0.25, conversation=conversation("req-000003")),
    ]
    await store.write_batch(records)
    await store.write_feedback([
        FeedbackRecord("req-000001", 1.0, created_at=5.0),
        FeedbackRecord("req-000001", 0.0, source="judge", model="small", created_at=5.0),
        FeedbackRecord("req-000002", 0.5, created_at=5.0),
        FeedbackRecord("never-logged", 0.5, created_at=5.0),
    ])
    # fetch() does not load the conversation; the decision itself round-trips.
    fetched = await store.fetch("req-000003")
    assert fetched is not None and fetched.conversation is None
    assert (fetched.router_version, fetched.propensity) == ("v7", 0.25)

    everything = await store.logged_requests()
    assert [item.record.request_id for item in everything] == ["req-000001", "req-000002", "req-000003"]
    auto = await store.logged_requests(route="auto")
    assert [item.record.request_id for item in auto] == ["req-000001", "req-000003"]
    one = auto[0]
    assert one.conversation == records[0].conversation and one.record.conversation == one.conversation
    assert [(f.source, f.score) for f in one.feedback] == [("judge", 0.0), ("user", 1.0)]
    assert auto[1].feedback == [] and auto[1].conversation is not None
    assert auto[1].conversation.embedding == b"\x00\x00\x80?" * 4 and auto[1].conversation.text is None
    late = await store.logged_requests(since=1_700_000_002.0)
    assert [item.record.request_id for item in late] == ["req-000002", "req-000003"]
    assert await store.logged_requests(route="auto", since=1_700_000_002.0) == [auto[1]]


async def test_logged_requests_with_feedback_reads_only_those_and_counts_the_rest(
    store: DecisionStore, make_record: MakeRecord
) -> None:
    # Training reads a busy store's few requests with feedback, not its millions of decisions.
    await store.write_batch([make_record(i, route="auto" if i % 2 else "other") for i in range(1, 9)])
    await store.write_feedback([
        FeedbackRecord("req-000001", 1.0, created_at=5.0),
        FeedbackRecord("req-000001", 0.0, source="judge", model="small", created_at=5.0),  # one request, two rows
        FeedbackRecord("req-000004", 0.5, metric="helpfulness", created_at=5.0),  # any metric counts as feedback
        FeedbackRecord("req-000007", 0.0, created_at=5.0),
        FeedbackRecord("never-logged", 0.5, created_at=5.0),
    ])
    labelled = await store.logged_requests(with_feedback=True)
    assert [item.record.request_id for item in labelled] == ["req-000001", "req-000004", "req-000007"]
    assert [len(item.feedback) for item in labelled] == [2, 1, 1]
    assert labelled == [item for item in await store.logged_requests() if item.feedback]
    assert await store.count_without_feedback() == 5
    auto = await store.logged_requests(route="auto", since=1_700_000_003.0, with_feedback=True)
    assert [item.record.request_id for item in auto] == ["req-000007"]
    assert await store.count_without_feedback(route="auto", since=1_700_000_003.0) == 2  # 3 and 5
    assert await store.count_without_feedback(route="nowhere") == 0


async def test_a_retried_decision_keeps_its_first_conversation(store: DecisionStore, make_record: MakeRecord) -> None:
    await store.write_batch([make_record(1, conversation=conversation("req-000001", text="first"))])
    await store.write_batch([make_record(1, conversation=conversation("req-000001", text="second"))])
    [item] = await store.logged_requests()
    assert item.conversation is not None and item.conversation.text == "first"


# --- forget and retention ------------------------------------------------------------------------


async def test_forget_a_request_and_a_tenant(store: DecisionStore, make_record: MakeRecord) -> None:
    await store.write_batch([
        make_record(i, tenant="acme" if i < 3 else "globex", conversation=conversation(f"req-{i:06d}"))
        for i in range(5)
    ])
    await store.write_feedback([
        FeedbackRecord("req-000000", 1.0, tenant="acme"),
        FeedbackRecord("req-000001", 1.0, tenant="acme"),
        FeedbackRecord("req-000001", 0.0, source="judge", model="x"),  # judge feedback carries no tenant
        FeedbackRecord("req-000004", 1.0, tenant="globex"),
    ])
    assert await store.forget(request_id="req-000000") == {
        "decisions": 1, "feedback": 1, "conversations": 1, "subcalls": 0}
    assert await store.fetch("req-000000") is None and await store.fetch_feedback("req-000000") == []
    assert await store.forget(tenant="acme") == {"decisions": 2, "feedback": 2, "conversations": 2, "subcalls": 0}
    assert await store.forget(tenant="acme") == {"decisions": 0, "feedback": 0, "conversations": 0, "subcalls": 0}
    assert [r.record.request_id for r in await store.logged_requests()] == ["req-000003", "req-000004"]
    assert await store.feedback_count() == 1
    with pytest.raises(ValueError, match="exactly one"):
        await store.forget()
    with pytest.raises(ValueError, match="exactly one"):
        await store.forget(tenant="acme", request_id="req-000003")


async def test_purge_deletes_only_expired_text(store: DecisionStore, make_record: MakeRecord) -> None:
    await store.write_batch([
        make_record(1, conversation=conversation("req-000001", text="old", expires_at=100.0)),
        make_record(2, conversation=conversation("req-000002", text="fresh", expires_at=300.0)),
        make_record(3, conversation=conversation("req-000003", text="kept for ever")),
        make_record(4, conversation=conversation("req-000004", expires_at=50.0)),  # no text to purge
    ])
    assert await store.purge_expired_text(200.0) == 1
    assert await store.purge_expired_text(200.0) == 0
    texts = {r.record.request_id: r.conversation.text for r in await store.logged_requests() if r.conversation}
    assert texts == {"req-000001": None, "req-000002": "fresh", "req-000003": "kept for ever", "req-000004": None}
    # The embedding outlives the text.
    assert all(r.conversation and r.conversation.embedding for r in await store.logged_requests())


async def test_recorder_purges_at_start_and_periodically(sqlite_path: str, make_record: MakeRecord) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    recorder = DecisionRecorder(store, flush_interval=0.02, purge_interval=0.05)
    await recorder.start()
    try:
        soon = time.time() + 0.3
        recorder.record(make_record(1, conversation=conversation("req-000001", text="secret", expires_at=soon)))
        await eventually_async(lambda: recorder.written == 1)
        [item] = await store.logged_requests()
        assert item.conversation is not None and item.conversation.text == "secret"
        await eventually_async(lambda: recorder.purged == 1)
        [item] = await store.logged_requests()
        assert item.conversation is not None and item.conversation.text is None
    finally:
        await recorder.stop()


# --- fire-and-forget feedback through the recorder ----------------------------------------------


async def test_recorder_batches_feedback_with_decisions(sqlite_path: str, make_record: MakeRecord) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    recorder = DecisionRecorder(store, batch_size=64, flush_interval=60)
    await recorder.start()
    for i in range(100):
        recorder.record(make_record(i))
        recorder.record_feedback(FeedbackRecord(f"req-{i:06d}", 0.5, source="judge", model="big"))
        recorder.record_feedback(FeedbackRecord(f"req-{i:06d}", 1.0, source="judge", model="big"))  # repeat
    await recorder.stop()
    assert (recorder.written, recorder.feedback_written, recorder.dropped) == (100, 200, 0)
    again = SQLiteDecisionStore(sqlite_path)
    await again.open()
    try:
        assert await again.count() == 100 and await again.feedback_count() == 100
        assert [f.score for f in await again.fetch_feedback("req-000042")] == [1.0]
    finally:
        await again.close()


async def test_feedback_recorded_together_is_written_in_one_transaction_or_dropped_whole(
    sqlite_path: str, make_record: MakeRecord
) -> None:
    """A comparison's judge rows (one per model) go in as one unit: a batch boundary never falls
    between them, and a queue over its limit drops them together. One model's score alone would be a
    label the judge never gave (it was the other's score that made it a comparison)."""
    store = FailingSQLiteStore(sqlite_path)
    recorder = DecisionRecorder(store, batch_size=2, flush_interval=60, queue_limit=3)

    def judged(i: int) -> tuple[FeedbackRecord, ...]:
        return tuple(FeedbackRecord(f"req-{i:06d}", 0.5, source="judge", model=m) for m in ("a", "b", "c"))

    recorder.record(make_record(1))
    recorder.record_feedback(judged(1))  # with the decision: batch_size 2 would have cut it after "a"
    recorder.record(make_record(2))
    recorder.record_feedback(judged(2))  # over the queue limit: the oldest item, decision 1, is dropped
    recorder.record_feedback(judged(3))  # and then request 1's three judge rows together
    assert recorder.dropped == 1 + 3
    await recorder.start()
    await recorder.stop()
    assert sorted(store.writes) == [3, 3]  # each request's rows in one write, never 1 + 2
    again = SQLiteDecisionStore(sqlite_path)
    await again.open()
    try:
        assert [len(await again.fetch_feedback(f"req-{i:06d}")) for i in (1, 2, 3)] == [0, 3, 3]
    finally:
        await again.close()


# --- durable feedback through FeedbackWriter -----------------------------------------------------


class FailingSQLiteStore(SQLiteDecisionStore):
    """A real SQLite store whose feedback writes fail while ``down`` and never return while ``hang``."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.down = False
        self.hang = False
        self.writes: list[int] = []

    async def write_feedback(self, items: Sequence[FeedbackRecord]) -> None:
        self.writes.append(len(items))
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise sqlite3.OperationalError("disk I/O error")
        await super().write_feedback(items)


async def test_a_thousand_concurrent_submits_are_batched_into_exactly_a_thousand_rows(store: DecisionStore) -> None:
    writer = FeedbackWriter(store, batch_size=128)
    await writer.start()
    try:
        items = [FeedbackRecord(f"req-{i}", (i % 11) / 10, tenant="acme") for i in range(1000)]
        await asyncio.gather(*(writer.submit(item) for item in items))
        # Every submit returned, so every row is committed already: no waiting here.
        assert await store.feedback_count() == 1000
        assert writer.written == 1000 and writer.failed == 0
        assert writer.batches < 1000  # group commit: submits arriving during a write share the next
        await asyncio.gather(*(writer.submit(item) for item in items[:100]))  # repeats add nothing
        assert await store.feedback_count() == 1000
    finally:
        await writer.stop()


async def test_every_waiting_submit_fails_when_the_store_write_fails(sqlite_path: str) -> None:
    store = FailingSQLiteStore(sqlite_path)
    await store.open()
    writer = FeedbackWriter(store, batch_size=10)
    await writer.start()
    try:
        store.down = True
        results = await asyncio.gather(
            *(writer.submit(FeedbackRecord(f"req-{i}", 1.0)) for i in range(25)), return_exceptions=True
        )
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        assert isinstance(results[0], StoreError)
        assert writer.failed == 25 and writer.written == 0 and sum(store.writes) == 25
        store.down = False
        await writer.submit(FeedbackRecord("req-after", 1.0))  # the next batch is written normally
        assert await store.feedback_count() == 1
    finally:
        await writer.stop()
        await store.close()


async def test_a_hung_write_times_out_as_unavailable(sqlite_path: str) -> None:
    store = FailingSQLiteStore(sqlite_path)
    await store.open()
    writer = FeedbackWriter(store, write_timeout=0.2)
    await writer.start()
    try:
        store.hang = True
        with pytest.raises(StoreUnavailable, match="timed out"):
            await writer.submit(FeedbackRecord("req-1", 1.0))
    finally:
        store.hang = False
        await writer.stop()
        await store.close()


async def test_submit_after_stop_or_before_start_is_unavailable(sqlite_path: str) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    await store.open()
    writer = FeedbackWriter(store)
    try:
        with pytest.raises(StoreUnavailable):
            await writer.submit(FeedbackRecord("req-1", 1.0))
        await writer.start()
        await writer.submit(FeedbackRecord("req-1", 1.0))
        await writer.stop()
        with pytest.raises(StoreUnavailable):
            await writer.submit(FeedbackRecord("req-2", 1.0))
        assert await store.feedback_count() == 1
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_table_lock_is_unavailable_then_recovers(pg_dsn: str) -> None:
    """A real outage: another session holds an exclusive lock on the feedback table."""
    store = PostgresDecisionStore(pg_dsn)
    await store.open()
    writer = FeedbackWriter(store, write_timeout=0.5)
    await writer.start()
    admin = await asyncpg.connect(pg_dsn)
    try:
        locked = admin.transaction()
        await locked.start()
        await admin.execute("LOCK TABLE feedback IN ACCESS EXCLUSIVE MODE")
        results = await asyncio.gather(
            *(writer.submit(FeedbackRecord(f"req-{i}", 1.0)) for i in range(20)), return_exceptions=True
        )
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        await locked.rollback()
        await writer.submit(FeedbackRecord("req-after", 1.0))
        # A write that timed out may commit after all once the lock is gone (idempotent upsert):
        # what matters is that no submit was acknowledged without its row.
        assert {f.request_id for f in await store.fetch_feedback("req-after")} == {"req-after"}
    finally:
        await admin.close()
        await writer.stop()
        await store.close()


# --- store URLs ----------------------------------------------------------------------------------


async def test_store_urls(tmp_path: Path, pg_dsn: str) -> None:
    assert str(tmp_path).startswith("/")
    absolute = open_store_url(f"sqlite://{tmp_path}/a.db")  # sqlite:///tmp/...: three slashes
    assert isinstance(absolute, SQLiteDecisionStore) and absolute.path == f"{tmp_path}/a.db"
    relative = open_store_url("sqlite://rel/b.db")
    assert isinstance(relative, SQLiteDecisionStore) and relative.path == "rel/b.db"
    bare = open_store_url(str(tmp_path / "c.db"))
    assert isinstance(bare, SQLiteDecisionStore) and bare.path == str(tmp_path / "c.db")
    for url in (pg_dsn, pg_dsn.replace("postgresql://", "postgres://", 1)):
        pg = open_store_url(url)
        assert isinstance(pg, PostgresDecisionStore)
        await pg.open()
        await pg.write_feedback([FeedbackRecord("r", 1.0)])
        assert await pg.feedback_count() == 1
        await pg.close()
    await absolute.open()
    await absolute.write_feedback([FeedbackRecord("r", 1.0)])
    await absolute.close()
    assert (tmp_path / "a.db").exists()
    for bad in ("", "mysql://x/y", "sqlite://"):
        with pytest.raises(ValueError):
            open_store_url(bad)


async def test_commands_open_only_a_store_that_exists_and_never_print_its_password(tmp_path: Path) -> None:
    # pointsman forget / --data logs: / ab report on a mistyped path: an error, not a new empty
    # database that "forgot" nothing and reported success.
    missing = tmp_path / "typo.db"
    with pytest.raises(StoreNotFound, match=r"no SQLite database at .*typo\.db"):
        async with opened_store(f"sqlite://{missing}"):
            pass
    assert not missing.exists()
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("hello")
    with pytest.raises(StoreUnavailable, match=r"notes\.db: DatabaseError"):
        async with opened_store(str(not_a_db)):
            pass
    with pytest.raises(StoreUnavailable) as caught:
        async with opened_store("postgresql://ops:s3cret@127.0.0.1:1/pointsman"):
            pass
    assert "postgresql://ops:***@127.0.0.1:1/pointsman" in str(caught.value) and "s3cret" not in str(caught.value)
    assert masked_store_url("postgresql://127.0.0.1/db") == "postgresql://127.0.0.1/db"
    assert masked_store_url("postgres://:pw@h:5/db") == "postgres://:***@h:5/db"
