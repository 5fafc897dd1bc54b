"""Upgrading a step-5 database to step 6 (an index on ``decisions.shadow_of``), and forgetting one request
by index lookups only.

``pointsman forget --request-id`` finds a request's experiment shadows by ``shadow_of``, once per table it
deletes from. With no index each lookup scanned every decision under the write lock (1.1 s at 500 000
decisions on SQLite, a gateway's writes to the same file waiting). The step-5 database is built by running
steps 1-5 as this code has them, with served and shadow decisions; today's store opens it, adds the index,
keeps every row, and the forget statements' plans read ``decisions`` (and the tables hanging off it) through
indexes only.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import asyncpg
import pytest

from store import SCHEMA_VERSION, DecisionRecord, FeedbackRecord, PostgresDecisionStore, SQLiteDecisionStore
from store.base import DecisionStore
from store.schema import forget_sql, migrations, version_table_ddl

pytestmark = pytest.mark.asyncio(loop_scope="session")

INDEX = "idx_decisions_shadow_of"
STEP6 = "CREATE INDEX IF NOT EXISTS idx_decisions_shadow_of ON decisions (shadow_of) WHERE shadow_of IS NOT NULL"


async def test_step6_adds_only_the_partial_shadow_of_index() -> None:
    assert SCHEMA_VERSION >= 6
    assert migrations("sqlite")[5] == (6, [STEP6])
    assert migrations("postgres")[5] == (6, [STEP6])


def v5_rows() -> list[dict[str, Any]]:
    """Two served decisions, each with two shadows (``<id>:shadow:<arm>``, ``shadow_of`` = the id)."""
    out = []
    for i in range(2):
        served = f"v5-{i}"
        for rid, shadow_of in ((served, None), (f"{served}:shadow:b", served), (f"{served}:shadow:c", served)):
            out.append(
                {
                    "request_id": rid,
                    "created_at": 1_760_000_000.0 + i,
                    "endpoint": "chat.completions",
                    "route": "auto",
                    "requested_model": "auto",
                    "tenant": "acme",
                    "stream": False,
                    "signals": "{}",
                    "decision": "{}",
                    "reason": "knob",
                    "model": "big",
                    "status": 200,
                    "outcome": "ok",
                    "attempts": 1,
                    "experiment": "exp1",
                    "shadow_of": shadow_of,
                }
            )
    return out


def build_v5_sqlite(path: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(version_table_ddl("sqlite"))
        for version, statements in migrations("sqlite")[:5]:
            for statement in statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))
        for row in v5_rows():
            conn.execute(
                f"INSERT INTO decisions ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})", tuple(row.values())
            )
        conn.commit()
    finally:
        conn.close()


async def build_v5_postgres(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(version_table_ddl("postgres"))
            for version, statements in migrations("postgres")[:5]:
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)", version, time.time()
                )
            for row in v5_rows():
                marks = ", ".join(
                    f"${n}::jsonb" if k in ("signals", "decision") else f"${n}" for n, k in enumerate(row, start=1)
                )
                await conn.execute(f"INSERT INTO decisions ({', '.join(row)}) VALUES ({marks})", *row.values())
    finally:
        await conn.close()


async def check_upgraded(store: DecisionStore) -> None:
    assert await store.count() == 6
    await store.write_feedback(
        [FeedbackRecord("v5-0:shadow:b", 1.0, metric="judge", source="judge"), FeedbackRecord("v5-0", 1.0)]
    )
    await store.write_batch(
        [
            DecisionRecord(
                request_id="v6-1",
                created_at=1_800_000_000.0,
                endpoint="chat.completions",
                route="auto",
                requested_model="auto",
                shadow_of="v5-1",
            )
        ]
    )
    assert await store.forget(request_id="v5-0") == {"decisions": 3, "feedback": 2, "conversations": 0, "subcalls": 0}
    assert await store.forget(request_id="v5-1") == {"decisions": 4, "feedback": 0, "conversations": 0, "subcalls": 0}
    assert await store.count() == 0


async def test_sqlite_step5_database_is_upgraded_and_forget_reads_by_index(sqlite_path: str) -> None:
    build_v5_sqlite(sqlite_path)
    store = SQLiteDecisionStore(sqlite_path)
    await store.open()
    try:
        await check_upgraded(store)
    finally:
        await store.close()
    conn = sqlite3.connect(sqlite_path)
    try:
        assert [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY version")] == list(
            range(1, SCHEMA_VERSION + 1)
        )
        for _table, sql in forget_sql("sqlite", by_tenant=False):
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, ("v5-0",))]
            assert not [step for step in plan if step.startswith("SCAN") and "CONSTANT ROW" not in step], (sql, plan)
            assert any(INDEX in step for step in plan), (sql, plan)
        # Served decisions' reads (shadow_of IS NULL) never take the shadow-only index.
        served = "SELECT count(*) FROM decisions WHERE created_at >= 0 AND shadow_of IS NULL"
        assert not [row for row in conn.execute("EXPLAIN QUERY PLAN " + served) if INDEX in row[3]]
    finally:
        conn.close()


@pytest.mark.postgres
async def test_postgres_step5_database_is_upgraded_and_forget_reads_by_index(pg_dsn: str) -> None:
    await build_v5_postgres(pg_dsn)
    store = PostgresDecisionStore(pg_dsn)
    await store.open()
    try:
        await check_upgraded(store)
    finally:
        await store.close()
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT array_agg(version ORDER BY version) FROM schema_version") == list(
            range(1, SCHEMA_VERSION + 1)
        )
        # An empty table is cheapest to scan whatever the indexes: forbid scans to see whether an index serves.
        await conn.execute("SET enable_seqscan = off")
        for _table, sql in forget_sql("postgres", by_tenant=False):
            plan = "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + sql.replace("$1", "'v5-0'::text")))
            assert "Seq Scan" not in plan and INDEX in plan, (sql, plan)
    finally:
        await conn.close()
