"""Upgrading a database written by the first released schema (v1) to the current one.

The v1 DDL below is a literal copy of what the first release created, kept here independently of
``store/schema.py``: the test builds a v1 database with it (SQLite and PostgreSQL), fills it with
rows the way that release did, opens it with today's store and checks that every row survived and
the new features work on it.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import asyncpg
import pytest

from store import (
    COLUMNS,
    SCHEMA_VERSION,
    ConversationRecord,
    DecisionRecord,
    FeedbackRecord,
    PostgresDecisionStore,
    SQLiteDecisionStore,
)
from store.base import DecisionStore
from store.schema import migrations

pytestmark = pytest.mark.asyncio(loop_scope="session")

# fmt: off
V1_SQLITE = [
    """CREATE TABLE IF NOT EXISTS decisions (
    request_id TEXT NOT NULL PRIMARY KEY,
    created_at REAL NOT NULL,
    endpoint TEXT NOT NULL,
    route TEXT,
    requested_model TEXT,
    tenant TEXT,
    stream INTEGER NOT NULL,
    signals TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    model TEXT,
    backend TEXT,
    replica TEXT,
    status INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    error_type TEXT,
    error_message TEXT,
    attempts INTEGER NOT NULL,
    latency_ms REAL,
    ttft_ms REAL,
    overhead_ms REAL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cost_usd REAL,
    experiment_arm TEXT
)""",
    "CREATE INDEX IF NOT EXISTS idx_decisions_created_at ON decisions (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_decisions_route ON decisions (route)",
    "CREATE INDEX IF NOT EXISTS idx_decisions_model ON decisions (model)",
    "CREATE INDEX IF NOT EXISTS idx_decisions_tenant ON decisions (tenant)",
    """CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    score REAL,
    label TEXT,
    comment TEXT,
    metadata TEXT
)""",
    "CREATE INDEX IF NOT EXISTS idx_feedback_request_id ON feedback (request_id)",
    "CREATE INDEX IF NOT EXISTS idx_feedback_created_at ON feedback (created_at)",
]
V1_POSTGRES = [
    """CREATE TABLE IF NOT EXISTS decisions (
    request_id text NOT NULL PRIMARY KEY,
    created_at double precision NOT NULL,
    endpoint text NOT NULL,
    route text,
    requested_model text,
    tenant text,
    stream boolean NOT NULL,
    signals jsonb NOT NULL,
    decision jsonb NOT NULL,
    reason text NOT NULL,
    model text,
    backend text,
    replica text,
    status bigint NOT NULL,
    outcome text NOT NULL,
    error_type text,
    error_message text,
    attempts bigint NOT NULL,
    latency_ms double precision,
    ttft_ms double precision,
    overhead_ms double precision,
    prompt_tokens bigint,
    completion_tokens bigint,
    cost_usd double precision,
    experiment_arm text
)""",
    "CREATE INDEX IF NOT EXISTS idx_decisions_created_at ON decisions (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_decisions_route ON decisions (route)",
    "CREATE INDEX IF NOT EXISTS idx_decisions_model ON decisions (model)",
    "CREATE INDEX IF NOT EXISTS idx_decisions_tenant ON decisions (tenant)",
    """CREATE TABLE IF NOT EXISTS feedback (
    id bigserial PRIMARY KEY,
    request_id text NOT NULL,
    created_at double precision NOT NULL,
    score double precision,
    label text,
    comment text,
    metadata jsonb
)""",
    "CREATE INDEX IF NOT EXISTS idx_feedback_request_id ON feedback (request_id)",
    "CREATE INDEX IF NOT EXISTS idx_feedback_created_at ON feedback (created_at)",
]
# fmt: on

V1_VERSION_TABLE = {
    "sqlite": "CREATE TABLE IF NOT EXISTS schema_version (\n    version INTEGER PRIMARY KEY,\n"
              "    applied_at REAL NOT NULL\n)",
    "postgres": "CREATE TABLE IF NOT EXISTS schema_version (\n    version bigint PRIMARY KEY,\n"
                "    applied_at double precision NOT NULL\n)",
}
V1_DECISION_COLUMNS = (
    "request_id", "created_at", "endpoint", "route", "requested_model", "tenant", "stream", "signals", "decision",
    "reason", "model", "backend", "replica", "status", "outcome", "error_type", "error_message", "attempts",
    "latency_ms", "ttft_ms", "overhead_ms", "prompt_tokens", "completion_tokens", "cost_usd", "experiment_arm",
)


def v1_decision(i: int, tenant: str) -> tuple[Any, ...]:
    """A decision row as the v1 release wrote it (JSON columns as text)."""
    return (
        f"old-{i}", 1_700_000_000.0 + i, "chat.completions", "auto", "auto", tenant, i % 2 == 0,
        f'{{"p_strong": 0.{i}}}', '{"policy": "threshold"}', "because", "big", "fake", "http://r", 200, "ok",
        None, None, 1, 12.5, None, 0.5, 10 + i, 3, 0.001, None,
    )


# (request_id, created_at, score, label, comment, metadata): old-1 got feedback twice (the second
# is the newest and must win), old-2 once, and a row about a request that has no decision.
V1_FEEDBACK = [
    ("old-1", 1_700_000_100.0, 0.0, "bad", "first try", '{"n": 1}'),
    ("old-2", 1_700_000_101.0, 1.0, None, None, None),
    ("old-1", 1_700_000_102.0, 1.0, "good", "changed my mind", '{"n": 2}'),
    ("orphan", 1_700_000_103.0, 0.5, None, None, None),
]


async def test_step_one_is_frozen() -> None:
    """Step 1 must stay the literal v1 DDL whatever the record dataclass looks like today."""
    assert migrations("sqlite")[0] == (1, V1_SQLITE)
    assert migrations("postgres")[0] == (1, V1_POSTGRES)
    assert [v for v, _ in migrations("sqlite")] == list(range(1, SCHEMA_VERSION + 1))


def build_v1_sqlite(path: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in [V1_VERSION_TABLE["sqlite"], *V1_SQLITE]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (1, ?)", (time.time(),))
        marks = ", ".join("?" for _ in V1_DECISION_COLUMNS)
        conn.executemany(
            f"INSERT INTO decisions ({', '.join(V1_DECISION_COLUMNS)}) VALUES ({marks})",
            [v1_decision(i, "acme" if i < 3 else "globex") for i in range(5)],
        )
        conn.executemany(
            "INSERT INTO feedback (request_id, created_at, score, label, comment, metadata) VALUES (?, ?, ?, ?, ?, ?)",
            V1_FEEDBACK,
        )
        conn.commit()
    finally:
        conn.close()


async def build_v1_postgres(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for statement in [V1_VERSION_TABLE["postgres"], *V1_POSTGRES]:
                await conn.execute(statement)
            await conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (1, $1)", time.time())
            marks = ", ".join(f"${i}" for i in range(1, len(V1_DECISION_COLUMNS) + 1))
            await conn.executemany(
                f"INSERT INTO decisions ({', '.join(V1_DECISION_COLUMNS)}) VALUES ({marks})",
                [v1_decision(i, "acme" if i < 3 else "globex") for i in range(5)],
            )
            await conn.executemany(
                "INSERT INTO feedback (request_id, created_at, score, label, comment, metadata) "
                "VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
                V1_FEEDBACK,
            )
    finally:
        await conn.close()


async def check_upgraded(store: DecisionStore) -> None:
    """Every v1 row is there, readable through today's API, and the new features work."""
    assert await store.count() == 5
    old = await store.fetch("old-3")
    assert old is not None
    assert old.tenant == "globex" and old.signals == {"p_strong": 0.3} and old.prompt_tokens == 13
    assert old.router_version is None and old.propensity is None and old.stream is False
    # Duplicates from before the feedback key existed collapsed to the newest; tenants copied over.
    assert await store.feedback_count() == 3
    [kept] = await store.fetch_feedback("old-1")
    assert (kept.score, kept.label, kept.comment, kept.metadata) == (1.0, "good", "changed my mind", {"n": 2})
    assert (kept.metric, kept.source, kept.model, kept.tenant) == ("quality", "user", "", "acme")
    [orphan] = await store.fetch_feedback("orphan")
    assert orphan.tenant is None

    # New writes: a decision with the new columns and a conversation, keyed feedback.
    embedding = bytes(range(16))
    new = DecisionRecord(
        request_id="new-1", created_at=1_800_000_000.0, endpoint="chat.completions", route="auto",
        requested_model="auto", tenant="acme", router_version="v2", propensity=0.9,
        conversation=ConversationRecord("new-1", 1_800_000_000.0, "acme", "static:1", embedding, None, None),
    )
    await store.write_batch([new])
    await store.write_feedback([
        FeedbackRecord("old-2", 0.25, tenant="acme"),  # replaces the v1 row (same key)
        FeedbackRecord("old-2", 1.0, metric="quality", source="judge", model="big", tenant="acme"),
        FeedbackRecord("new-1", 0.75, tenant="acme"),
    ])
    assert await store.feedback_count() == 5
    assert [(f.source, f.score) for f in await store.fetch_feedback("old-2")] == [("judge", 1.0), ("user", 0.25)]
    fetched = await store.fetch("new-1")
    assert fetched is not None and (fetched.router_version, fetched.propensity) == ("v2", 0.9)

    logged = {item.record.request_id: item for item in await store.logged_requests(route="auto")}
    assert len(logged) == 6
    assert logged["new-1"].conversation is not None and logged["new-1"].conversation.embedding == embedding
    assert logged["old-0"].conversation is None and logged["old-0"].feedback == []

    counts = await store.forget(tenant="acme")
    assert counts == {"decisions": 4, "feedback": 4, "conversations": 1, "subcalls": 0}
    assert await store.count() == 2 and await store.feedback_count() == 1  # globex's rows and the orphan


async def test_sqlite_v1_database_is_upgraded_in_place(sqlite_path: str) -> None:
    build_v1_sqlite(sqlite_path)
    store = SQLiteDecisionStore(sqlite_path)
    await store.open()
    try:
        await check_upgraded(store)
    finally:
        await store.close()
    conn = sqlite3.connect(sqlite_path)
    try:
        assert tuple(row[1] for row in conn.execute("PRAGMA table_info(decisions)")) == COLUMNS
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1))
    finally:
        conn.close()
    # Opening again applies nothing twice.
    again = SQLiteDecisionStore(sqlite_path)
    await again.open()
    try:
        assert await again.count() == 2
    finally:
        await again.close()


@pytest.mark.postgres
async def test_postgres_v1_database_is_upgraded_in_place(pg_dsn: str) -> None:
    await build_v1_postgres(pg_dsn)
    stores = [PostgresDecisionStore(pg_dsn) for _ in range(2)]
    await stores[0].open()
    await stores[1].open()  # a second replica starting on the upgraded schema
    try:
        await check_upgraded(stores[0])
    finally:
        for store in stores:
            await store.close()
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'decisions' ORDER BY ordinal_position"
        )
        assert tuple(r["column_name"] for r in rows) == COLUMNS
        versions = await conn.fetchval("SELECT array_agg(version ORDER BY version) FROM schema_version")
        assert versions == list(range(1, SCHEMA_VERSION + 1))
    finally:
        await conn.close()
