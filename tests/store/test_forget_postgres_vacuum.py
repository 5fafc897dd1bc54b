"""What ``pointsman forget`` deletes from a PostgreSQL store is not left in the tables as dead row versions.

A DELETE in PostgreSQL only marks the row versions dead: the forgotten conversation text and feedback
comments stay in the tables' pages, readable (pageinspect, pg_dirtyread, a copy of the data files) until a
VACUUM removes them, which autovacuum does when it gets round to it. ``forget`` VACUUMs the tables it
deleted from once its transaction committed, and says so.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import asyncpg
import pytest

from store import ConversationRecord, DecisionRecord, FeedbackRecord, PostgresDecisionStore
from tests.gatewayproc import REPO

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres]

TABLES = ("decisions", "feedback", "conversations", "subcalls")


async def _tuples_holding(dsn: str, marker: str) -> dict[str, int]:
    """Per table: the row versions, live or dead, in its pages whose bytes hold ``marker`` (pageinspect reads
    every line pointer of every page, as a reader of the data files would)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect SCHEMA public")
        schema = await conn.fetchval("SELECT extnamespace::regnamespace::text FROM pg_extension "
                                     "WHERE extname = 'pageinspect'")
        out: dict[str, int] = {}
        for table in TABLES:
            pages = await conn.fetchval(
                "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int", table)
            held = 0
            for page in range(pages):
                held += await conn.fetchval(
                    f"SELECT count(*) FROM {schema}.heap_page_items({schema}.get_raw_page($1, $2)) "
                    "WHERE position($3::bytea in t_data) > 0",
                    table, page, marker.encode(),
                )
            out[table] = held
        return out
    finally:
        await conn.close()


async def test_a_forgotten_tenants_rows_leave_no_dead_row_versions_in_the_tables(pg_dsn: str) -> None:
    secret, kept = f"forget-me-{uuid.uuid4().hex}", f"keep-me-{uuid.uuid4().hex}"
    store = PostgresDecisionStore(pg_dsn)
    await store.open()
    try:
        for tenant, marker in (("acme", secret), ("other", kept)):
            records = [
                DecisionRecord(
                    request_id=f"{tenant}-{i}", created_at=1_760_000_000.0 + i, endpoint="chat.completions",
                    route="auto", requested_model="auto", tenant=tenant, error_message=f"{marker} error",
                    conversation=ConversationRecord(f"{tenant}-{i}", 1_760_000_000.0 + i, tenant,
                                                    text=f"About {marker} number {i}"),
                )
                for i in range(20)
            ]
            await store.write_batch(records)
            await store.write_feedback([FeedbackRecord(r.request_id, 1.0, comment=f"{marker} was fine", tenant=tenant)
                                        for r in records])
    finally:
        await store.close()
    assert (await _tuples_holding(pg_dsn, secret))["conversations"] == 20

    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gateway.cli", "forget", "--store", pg_dsn, "--tenant", "acme"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("forgot tenant 'acme': deleted 20 decisions, 20 feedback rows, 20 conversations")
    assert await _tuples_holding(pg_dsn, secret) == dict.fromkeys(TABLES, 0)
    assert "vacuumed decisions, feedback, conversations, subcalls" in done.stdout, done.stdout
    # The other tenant's rows are untouched.
    assert await _tuples_holding(pg_dsn, kept) == {"decisions": 20, "feedback": 20, "conversations": 20,
                                                   "subcalls": 0}
