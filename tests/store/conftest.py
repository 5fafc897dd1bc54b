"""Fixtures for the decision store tests: real SQLite files and a real PostgreSQL server.

PostgreSQL is expected at 127.0.0.1:5432, database ``test`` (override with POINTSMAN_TEST_PG_DSN).
Each test gets its own freshly created schema (selected through ``search_path``) that is dropped
afterwards, so parallel runs never see each other's rows. If the server is down the test fails
with a message saying so: these tests never skip.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import urlencode, urlsplit

import asyncpg
import pytest

from store import DecisionRecord, PostgresDecisionStore, SQLiteDecisionStore
from store.base import DecisionStore

PG_DSN = os.environ.get("POINTSMAN_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def dsn_with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set (asyncpg passes unknown query keys on as server settings)."""
    sep = "&" if urlsplit(dsn).query else "?"
    return f"{dsn}{sep}{urlencode({'search_path': schema})}"


async def _admin_connect() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(PG_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.fail(
            f"PostgreSQL is required for this test but is not reachable at {PG_DSN} "
            f"({type(exc).__name__}: {exc}). Start it (e.g. `service postgresql start`) "
            "or point POINTSMAN_TEST_PG_DSN at a server; the store tests never skip.",
            pytrace=False,
        )


@asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """Create a uniquely named schema, yield a DSN that uses it, drop it afterwards."""
    schema = f"pointsman_test_{uuid.uuid4().hex[:16]}"
    conn = await _admin_connect()
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    try:
        yield dsn_with_search_path(PG_DSN, schema)
    finally:
        conn = await _admin_connect()
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


@contextmanager
def sync_pg_schema() -> Iterator[str]:
    """:func:`pg_schema` for synchronous tests (gateway subprocesses): a DSN on a fresh, empty schema,
    dropped afterwards."""
    schema = f"pointsman_test_{uuid.uuid4().hex[:16]}"

    async def admin(sql: str) -> None:
        conn = await _admin_connect()
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE SCHEMA "{schema}"'))
    try:
        yield dsn_with_search_path(PG_DSN, schema)
    finally:
        asyncio.run(admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture
async def pg_dsn() -> AsyncIterator[str]:
    """A DSN whose search_path is a fresh, empty schema (dropped after the test)."""
    async with pg_schema() as dsn:
        yield dsn


@pytest.fixture
def sqlite_path(tmp_path: Any) -> str:
    return str(tmp_path / "decisions.db")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[DecisionStore]:
    """An opened store of each kind, on an empty database."""
    if request.param == "sqlite":
        sqlite_store = SQLiteDecisionStore(str(tmp_path / "decisions.db"))
        await sqlite_store.open()
        try:
            yield sqlite_store
        finally:
            await sqlite_store.close()
        return
    async with pg_schema() as dsn:
        pg_store = PostgresDecisionStore(dsn)
        await pg_store.open()
        try:
            yield pg_store
        finally:
            await pg_store.close()


@pytest.fixture
def make_record() -> Callable[..., DecisionRecord]:
    """Factory: ``make_record(i, **overrides)`` builds a record with request id ``req-{i:06d}``."""

    def make(i: int = 0, **overrides: Any) -> DecisionRecord:
        fields: dict[str, Any] = {
            "request_id": f"req-{i:06d}",
            "created_at": 1_700_000_000.0 + i,
            "endpoint": "chat.completions",
            "route": "auto",
            "requested_model": "auto",
        }
        fields.update(overrides)
        return DecisionRecord(**fields)

    return make
