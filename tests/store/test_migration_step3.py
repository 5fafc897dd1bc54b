"""Upgrading a database written by the second released schema (step 2: the eval loop) to step 3
(workflows: the ``workflow`` tree on decisions and the ``subcalls`` table).

The step-2 DDL below is a literal copy of what that release ran, kept independently of
``store/schema.py`` (and checked against it: a released step never changes). The test builds a
step-2 database with rows (SQLite and PostgreSQL), opens it with today's store and checks that every
row survived, that old decisions read without a workflow, and that sub-calls are written, read and
forgotten with their decision.
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
    DecisionRecord,
    FeedbackRecord,
    PostgresDecisionStore,
    SQLiteDecisionStore,
    SubCallRecord,
)
from store.base import DecisionStore
from store.schema import migrations
from tests.store.test_migrations import V1_DECISION_COLUMNS, V1_POSTGRES, V1_SQLITE, V1_VERSION_TABLE

pytestmark = pytest.mark.asyncio(loop_scope="session")

# fmt: off
V2_SQLITE = [
    "ALTER TABLE decisions ADD COLUMN router_version TEXT",
    "ALTER TABLE decisions ADD COLUMN propensity REAL",
    "ALTER TABLE feedback ADD COLUMN metric TEXT NOT NULL DEFAULT 'quality'",
    "ALTER TABLE feedback ADD COLUMN source TEXT NOT NULL DEFAULT 'user'",
    "ALTER TABLE feedback ADD COLUMN model TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE feedback ADD COLUMN tenant TEXT",
    "DELETE FROM feedback WHERE id NOT IN (SELECT max(id) FROM feedback GROUP BY request_id, metric, source, model)",
    "UPDATE feedback SET tenant = (SELECT d.tenant FROM decisions d WHERE d.request_id = feedback.request_id) WHERE "
    "tenant IS NULL",
    "DROP INDEX IF EXISTS idx_feedback_request_id",
    "CREATE UNIQUE INDEX IF NOT EXISTS uq_feedback_key ON feedback (request_id, metric, source, model)",
    "CREATE INDEX IF NOT EXISTS idx_feedback_tenant ON feedback (tenant)",
    "CREATE TABLE IF NOT EXISTS conversations (\n"
    "    request_id TEXT NOT NULL PRIMARY KEY,\n"
    "    created_at REAL NOT NULL,\n"
    "    tenant TEXT,\n"
    "    encoder_id TEXT,\n"
    "    embedding BLOB,\n"
    "    text TEXT,\n"
    "    expires_at REAL\n"
    ")",
    "CREATE INDEX IF NOT EXISTS idx_conversations_tenant ON conversations (tenant)",
    "CREATE INDEX IF NOT EXISTS idx_conversations_expires_at ON conversations (expires_at)",
]
V2_POSTGRES = [
    "ALTER TABLE decisions ADD COLUMN IF NOT EXISTS router_version text",
    "ALTER TABLE decisions ADD COLUMN IF NOT EXISTS propensity double precision",
    "ALTER TABLE feedback ADD COLUMN IF NOT EXISTS metric text NOT NULL DEFAULT 'quality'",
    "ALTER TABLE feedback ADD COLUMN IF NOT EXISTS source text NOT NULL DEFAULT 'user'",
    "ALTER TABLE feedback ADD COLUMN IF NOT EXISTS model text NOT NULL DEFAULT ''",
    "ALTER TABLE feedback ADD COLUMN IF NOT EXISTS tenant text",
    "DELETE FROM feedback WHERE id NOT IN (SELECT max(id) FROM feedback GROUP BY request_id, metric, source, model)",
    "UPDATE feedback SET tenant = (SELECT d.tenant FROM decisions d WHERE d.request_id = feedback.request_id) WHERE "
    "tenant IS NULL",
    "DROP INDEX IF EXISTS idx_feedback_request_id",
    "CREATE UNIQUE INDEX IF NOT EXISTS uq_feedback_key ON feedback (request_id, metric, source, model)",
    "CREATE INDEX IF NOT EXISTS idx_feedback_tenant ON feedback (tenant)",
    "CREATE TABLE IF NOT EXISTS conversations (\n"
    "    request_id text NOT NULL PRIMARY KEY,\n"
    "    created_at double precision NOT NULL,\n"
    "    tenant text,\n"
    "    encoder_id text,\n"
    "    embedding bytea,\n"
    "    text text,\n"
    "    expires_at double precision\n"
    ")",
    "CREATE INDEX IF NOT EXISTS idx_conversations_tenant ON conversations (tenant)",
    "CREATE INDEX IF NOT EXISTS idx_conversations_expires_at ON conversations (expires_at)",
]
# fmt: on

V2_DECISION_COLUMNS = (*V1_DECISION_COLUMNS, "router_version", "propensity")
V2_FEEDBACK = "(request_id, created_at, score, label, comment, metadata, metric, source, model, tenant)"


def v2_decision(i: int, tenant: str) -> tuple[Any, ...]:
    """A decision row as the step-2 release wrote it."""
    return (
        f"v2-{i}", 1_750_000_000.0 + i, "chat.completions", "auto", "auto", tenant, False, '{"difficulty": 0.4}',
        '{"policy": "rules", "candidates": ["big"]}', "knob", "big", "fake", "http://r", 200, "ok", None, None, 1,
        20.0, None, 0.3, 11, 7, 0.0002, None, "v0001-abc", 0.95 if i % 2 else None,
    )


def v2_feedback(i: int, tenant: str) -> tuple[Any, ...]:
    return (f"v2-{i}", 1_750_000_100.0 + i, 0.5, None, None, '{"n": 1}', "quality", "judge", "big", tenant)


async def test_released_steps_are_frozen() -> None:
    """Steps 1 and 2 are what their releases ran; later steps follow them in order."""
    assert migrations("sqlite")[:2] == [(1, V1_SQLITE), (2, V2_SQLITE)]
    assert migrations("postgres")[:2] == [(1, V1_POSTGRES), (2, V2_POSTGRES)]
    assert [v for v, _ in migrations("sqlite")] == list(range(1, SCHEMA_VERSION + 1))


def build_v2_sqlite(path: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in [V1_VERSION_TABLE["sqlite"], *V1_SQLITE, *V2_SQLITE]:
            conn.execute(statement)
        conn.executemany("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                         [(1, time.time()), (2, time.time())])
        marks = ", ".join("?" for _ in V2_DECISION_COLUMNS)
        conn.executemany(
            f"INSERT INTO decisions ({', '.join(V2_DECISION_COLUMNS)}) VALUES ({marks})",
            [v2_decision(i, "acme" if i < 2 else "globex") for i in range(4)],
        )
        conn.executemany(f"INSERT INTO feedback {V2_FEEDBACK} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         [v2_feedback(i, "acme" if i < 2 else "globex") for i in range(4)])
        conn.execute("INSERT INTO conversations (request_id, created_at, tenant, encoder_id, embedding) "
                     "VALUES ('v2-0', 1750000000.0, 'acme', 'static:1', x'00010203')")
        conn.commit()
    finally:
        conn.close()


async def build_v2_postgres(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for statement in [V1_VERSION_TABLE["postgres"], *V1_POSTGRES, *V2_POSTGRES]:
                await conn.execute(statement)
            await conn.executemany("INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                                   [(1, time.time()), (2, time.time())])
            marks = ", ".join(f"${i}" for i in range(1, len(V2_DECISION_COLUMNS) + 1))
            await conn.executemany(
                f"INSERT INTO decisions ({', '.join(V2_DECISION_COLUMNS)}) VALUES ({marks})",
                [v2_decision(i, "acme" if i < 2 else "globex") for i in range(4)],
            )
            await conn.executemany(
                f"INSERT INTO feedback {V2_FEEDBACK} VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10)",
                [v2_feedback(i, "acme" if i < 2 else "globex") for i in range(4)],
            )
            await conn.execute("INSERT INTO conversations (request_id, created_at, tenant, encoder_id, embedding) "
                               "VALUES ('v2-0', 1750000000.0, 'acme', 'static:1', '\\x00010203'::bytea)")
    finally:
        await conn.close()


async def check_upgraded(store: DecisionStore) -> None:
    """Every step-2 row is there and readable; workflows and sub-calls work on the upgraded schema."""
    assert await store.count() == 4 and await store.feedback_count() == 4
    old = await store.fetch("v2-1")
    assert old is not None
    assert (old.router_version, old.propensity, old.tenant, old.prompt_tokens) == ("v0001-abc", 0.95, "acme", 11)
    assert old.workflow is None and not old.subcalls
    # Step 4 (experiments) on rows written before it: in no experiment, not compared.
    assert (old.experiment, old.shadow_of, old.arm_propensity, old.compared) == (None, None, None, False)
    assert await store.fetch_subcalls("v2-1") == []
    [judged] = await store.fetch_feedback("v2-2")
    assert (judged.source, judged.model, judged.tenant) == ("judge", "big", "globex")

    tree = {"kind": "cascade", "name": "fast", "escalated": True, "cost_usd": 0.00035}
    calls = [
        SubCallRecord(request_id="v3-1", index=i, workflow="fast", step=step, model=model, status=200,
                      prompt_tokens=11, completion_tokens=7, cost_usd=cost, latency_ms=5.0, confidence=conf,
                      outcome="ok", created_at=1_800_000_000.0, tenant="acme")
        for i, (step, model, cost, conf) in enumerate([("cheap", "small", 2.5e-05, 0.4),
                                                       ("strong", "big", 3.2e-04, None)])
    ]
    new = DecisionRecord(request_id="v3-1", created_at=1_800_000_000.0, endpoint="chat.completions", route="auto",
                         requested_model="auto", tenant="acme", workflow=tree, subcalls=calls, cost_usd=0.000345)
    await store.write_batch([new])
    await store.write_feedback([FeedbackRecord("v3-1", 0.9, source="judge", model="small", tenant="acme")])
    fetched = await store.fetch("v3-1")
    assert fetched is not None and fetched.workflow == tree
    assert await store.fetch_subcalls("v3-1") == calls

    logged = {item.record.request_id: item for item in await store.logged_requests(route="auto")}
    assert set(logged) == {"v2-0", "v2-1", "v2-2", "v2-3", "v3-1"}
    assert logged["v2-0"].conversation is not None and logged["v2-0"].record.workflow is None

    assert await store.forget(tenant="acme") == {"decisions": 3, "feedback": 3, "conversations": 1, "subcalls": 2}
    assert await store.count() == 2 and await store.fetch_subcalls("v3-1") == []


async def test_sqlite_step2_database_is_upgraded_in_place(sqlite_path: str) -> None:
    build_v2_sqlite(sqlite_path)
    store = SQLiteDecisionStore(sqlite_path)
    await store.open()
    try:
        await check_upgraded(store)
    finally:
        await store.close()
    conn = sqlite3.connect(sqlite_path)
    try:
        assert tuple(row[1] for row in conn.execute("PRAGMA table_info(decisions)")) == COLUMNS
        assert [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")] == list(
            range(1, SCHEMA_VERSION + 1))
    finally:
        conn.close()
    again = SQLiteDecisionStore(sqlite_path)  # opening again applies nothing twice
    await again.open()
    try:
        assert await again.count() == 2
    finally:
        await again.close()


@pytest.mark.postgres
async def test_postgres_step2_database_is_upgraded_in_place(pg_dsn: str) -> None:
    await build_v2_postgres(pg_dsn)
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
        assert await conn.fetchval("SELECT array_agg(version ORDER BY version) FROM schema_version") == list(
            range(1, SCHEMA_VERSION + 1))
    finally:
        await conn.close()
