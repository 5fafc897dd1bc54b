"""The tables the stores create, as seen by the database itself, and migration idempotence."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable

import asyncpg
import pytest

from store import (
    COLUMNS,
    SCHEMA_VERSION,
    DecisionRecord,
    NullDecisionStore,
    PostgresDecisionStore,
    SQLiteDecisionStore,
    open_store,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]
FEEDBACK_COLUMNS = [
    "id", "request_id", "created_at", "score", "label", "comment", "metadata", "metric", "source", "model", "tenant",
]
CONVERSATION_COLUMNS = ["request_id", "created_at", "tenant", "encoder_id", "embedding", "text", "expires_at"]
SUBCALL_COLUMNS = [
    "request_id", "idx", "workflow", "step", "model", "backend", "status", "prompt_tokens", "completion_tokens",
    "cost_usd", "latency_ms", "confidence", "outcome", "error", "created_at", "tenant",
]
INDEXED = {"created_at", "route", "model", "tenant"}


# --- SQLite --------------------------------------------------------------------------------------


async def test_sqlite_tables_indexes_and_wal(sqlite_path: str) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    await store.open()
    await store.close()

    conn = sqlite3.connect(sqlite_path)
    try:
        cols = [row[1] for row in conn.execute("PRAGMA table_info(decisions)")]
        assert tuple(cols) == COLUMNS
        pk = [row[1] for row in conn.execute("PRAGMA table_info(decisions)") if row[5]]
        assert pk == ["request_id"]
        json_types = {row[1]: row[2] for row in conn.execute("PRAGMA table_info(decisions)")}
        assert json_types["signals"] == "TEXT" and json_types["decision"] == "TEXT"

        indexed = {
            conn.execute(f"PRAGMA index_info({name!r})").fetchone()[2]
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='decisions' "
                "AND name NOT LIKE 'sqlite_autoindex%'"
            )
        }
        # (experiment, created_at): an A/B report's rows; shadow_of (shadow rows only): forget --request-id
        assert indexed == INDEXED | {"experiment", "shadow_of"}

        assert [row[1] for row in conn.execute("PRAGMA table_info(feedback)")] == FEEDBACK_COLUMNS
        assert [row[1] for row in conn.execute("PRAGMA table_info(conversations)")] == CONVERSATION_COLUMNS
        assert [row[1] for row in conn.execute("PRAGMA table_info(subcalls)")] == SUBCALL_COLUMNS
        assert [row[1] for row in conn.execute("PRAGMA table_info(subcalls)") if row[5]] == ["request_id", "idx"]
        versions = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
        # WAL is a property of the file: a fresh connection sees it.
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


async def test_sqlite_migrate_is_idempotent_and_data_survives_reopen(sqlite_path: str, make_record: MakeRecord) -> None:
    store = SQLiteDecisionStore(sqlite_path)
    await store.open()
    await store.write_batch([make_record(1), make_record(2)])
    await store.migrate()
    await store.close()
    await store.close()  # closing twice is harmless

    again = SQLiteDecisionStore(sqlite_path)
    await again.open()
    try:
        assert await again.count() == 2
        assert await again.fetch("req-000002") == make_record(2)
    finally:
        await again.close()
    conn = sqlite3.connect(sqlite_path)
    try:
        assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


async def test_sqlite_creates_missing_directory(tmp_path: object, make_record: MakeRecord) -> None:
    path = f"{tmp_path}/nested/dir/decisions.db"
    store = SQLiteDecisionStore(path)
    await store.open()
    try:
        await store.write_batch([make_record(1)])
        assert await store.count() == 1
    finally:
        await store.close()


async def test_sqlite_store_refuses_use_before_open(make_record: MakeRecord, sqlite_path: str) -> None:
    with pytest.raises(RuntimeError, match="not open"):
        await SQLiteDecisionStore(sqlite_path).write_batch([make_record(1)])


# --- PostgreSQL ----------------------------------------------------------------------------------


@pytest.mark.postgres
async def test_postgres_tables_types_and_indexes(pg_dsn: str) -> None:
    store = PostgresDecisionStore(pg_dsn)
    await store.open()
    await store.close()

    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'decisions' ORDER BY ordinal_position"
        )
        assert tuple(r["column_name"] for r in rows) == COLUMNS
        types = {r["column_name"]: r["data_type"] for r in rows}
        assert types["signals"] == types["decision"] == "jsonb"
        assert types["created_at"] == "double precision"
        assert types["stream"] == types["compared"] == "boolean"

        index_defs = await conn.fetch(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'decisions'"
        )
        text = " ".join(r["indexdef"] for r in index_defs)
        for col in INDEXED:
            assert f"({col})" in text
        assert "UNIQUE INDEX decisions_pkey" in text and "(request_id)" in text
        assert "(experiment, created_at)" in text

        feedback = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'feedback' ORDER BY ordinal_position"
        )
        assert [r["column_name"] for r in feedback] == FEEDBACK_COLUMNS
        assert dict((r["column_name"], r["data_type"]) for r in feedback)["metadata"] == "jsonb"
        conversations = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'conversations' ORDER BY ordinal_position"
        )
        assert [r["column_name"] for r in conversations] == CONVERSATION_COLUMNS
        assert dict((r["column_name"], r["data_type"]) for r in conversations)["embedding"] == "bytea"
        subcalls = await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'subcalls' ORDER BY ordinal_position"
        )
        assert [r["column_name"] for r in subcalls] == SUBCALL_COLUMNS
        assert types["workflow"] == "jsonb"
        versions = await conn.fetchval("SELECT array_agg(version ORDER BY version) FROM schema_version")
        assert versions == list(range(1, SCHEMA_VERSION + 1))
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_postgres_replicas_starting_together_migrate_once(pg_dsn: str, make_record: MakeRecord) -> None:
    """Several replicas opening on an empty schema at once must all succeed (advisory lock)."""
    stores = [PostgresDecisionStore(pg_dsn) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        await stores[0].write_batch([make_record(1)])
        assert await stores[3].count() == 1
        await stores[1].migrate()
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_version") == SCHEMA_VERSION
    finally:
        await conn.close()


# --- factory -------------------------------------------------------------------------------------


async def test_open_store_builds_each_kind(sqlite_path: str, make_record: MakeRecord) -> None:
    sqlite_store = open_store("sqlite", path=sqlite_path, dsn=None)
    assert isinstance(sqlite_store, SQLiteDecisionStore)
    assert isinstance(open_store("postgres", path="", dsn="postgresql://x@127.0.0.1/db"), PostgresDecisionStore)

    null = open_store("none", path="", dsn=None)
    assert isinstance(null, NullDecisionStore)
    await null.open()
    await null.write_batch([make_record(1)])
    assert await null.count() == 0 and await null.fetch("req-000001") is None and await null.recent() == []
    await null.close()


async def test_open_store_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dsn"):
        open_store("postgres", path="", dsn=None)
    with pytest.raises(ValueError, match="unknown decision store kind"):
        open_store("mysql", path="", dsn=None)  # type: ignore[arg-type]
