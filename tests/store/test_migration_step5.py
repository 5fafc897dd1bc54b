"""Upgrading a step-4 database (experiments) to step 5 (observability: ``trace_id`` on decisions).

The step-4 database is built by running migration steps 1-4 as this code has them (SQLite and
PostgreSQL), with decision rows written in the step-4 shape; today's store then opens it, adds the
column, keeps every row (their ``trace_id`` NULL) and writes and reads trace ids.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import asyncpg
import pytest

from store import COLUMNS, SCHEMA_VERSION, DecisionRecord, PostgresDecisionStore, SQLiteDecisionStore
from store.base import DecisionStore
from store.schema import migrations, version_table_ddl

pytestmark = pytest.mark.asyncio(loop_scope="session")

V4_DECISION_COLUMNS = tuple(c for c in COLUMNS if c != "trace_id")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_step5_adds_only_trace_id() -> None:
    assert SCHEMA_VERSION >= 5
    assert migrations("sqlite")[4] == (5, ["ALTER TABLE decisions ADD COLUMN trace_id TEXT"])
    assert migrations("postgres")[4] == (5, ["ALTER TABLE decisions ADD COLUMN IF NOT EXISTS trace_id text"])
    assert len(V4_DECISION_COLUMNS) == len(COLUMNS) - 1


def v4_values(i: int) -> dict[str, Any]:
    return {
        "request_id": f"v4-{i}", "created_at": 1_760_000_000.0 + i, "endpoint": "chat.completions", "route": "auto",
        "requested_model": "auto", "tenant": "acme", "stream": False, "signals": '{"difficulty": 0.4}',
        "decision": '{"policy": "rules", "candidates": ["big"]}', "reason": "knob", "model": "big",
        "backend": "fake", "status": 200, "outcome": "ok", "attempts": 1, "experiment": "exp1",
        "experiment_arm": "a", "arm_propensity": 0.5, "compared": False,
    }


def build_v4_sqlite(path: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(version_table_ddl("sqlite"))
        for version, statements in migrations("sqlite")[:4]:
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))
        for i in range(3):
            row = v4_values(i)
            conn.execute(f"INSERT INTO decisions ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                         tuple(row.values()))
        conn.commit()
    finally:
        conn.close()


async def build_v4_postgres(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(version_table_ddl("postgres"))
            for version, statements in migrations("postgres")[:4]:
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                                   version, time.time())
            for i in range(3):
                row = v4_values(i)
                marks = ", ".join(f"${n}::jsonb" if k in ("signals", "decision") else f"${n}"
                                  for n, k in enumerate(row, start=1))
                await conn.execute(f"INSERT INTO decisions ({', '.join(row)}) VALUES ({marks})", *row.values())
    finally:
        await conn.close()


async def check_upgraded(store: DecisionStore) -> None:
    assert await store.count() == 3
    old = await store.fetch("v4-1")
    assert old is not None
    assert (old.experiment, old.experiment_arm, old.arm_propensity, old.trace_id) == ("exp1", "a", 0.5, None)
    new = DecisionRecord(request_id="v5-1", created_at=1_800_000_000.0, endpoint="chat.completions", route="auto",
                         requested_model="auto", trace_id=TRACE_ID)
    await store.write_batch([new])
    fetched = await store.fetch("v5-1")
    assert fetched is not None and fetched.trace_id == TRACE_ID


async def test_sqlite_step4_database_is_upgraded_in_place(sqlite_path: str) -> None:
    build_v4_sqlite(sqlite_path)
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


@pytest.mark.postgres
async def test_postgres_step4_database_is_upgraded_in_place(pg_dsn: str) -> None:
    await build_v4_postgres(pg_dsn)
    store = PostgresDecisionStore(pg_dsn)
    await store.open()
    try:
        await check_upgraded(store)
    finally:
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
