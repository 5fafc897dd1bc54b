"""Operator commands on a store (``pointsman forget``) pointed at awkward stores: a DSN whose password is
in the query string, a database a newer release has migrated."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable

import asyncpg
import pytest

from store import SCHEMA_VERSION, DecisionRecord, open_store_url
from tests.fakes.upstream import free_port

MakeRecord = Callable[..., DecisionRecord]


def forget_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "forget", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_password_in_the_dsn_query_is_not_printed() -> None:
    # asyncpg (like libpq) takes the password as a query parameter too.
    url = f"postgresql://ops@127.0.0.1:{free_port()}/pointsman?password=s3cret-pw&sslmode=disable"
    done = forget_command("--store", url, "--tenant", "acme")
    assert done.returncode == 2
    assert done.stderr.startswith("pointsman forget: ") and "password=***" in done.stderr
    assert "s3cret-pw" not in done.stderr + done.stdout


@pytest.mark.parametrize("password", ["12/Xy9-s3cret", "ab?s3cret", "ab#s3cret", "a@b/s3cret"])
def test_a_password_url_parsing_cannot_see_is_not_printed(password: str) -> None:
    # Unencoded, "/", "?" or "#" ends the host for asyncpg (and urlsplit): the password was not masked and
    # was printed whole ("12/..." read as host "ops", port 12) or in pieces (asyncpg's parse errors).
    url = f"postgresql://ops:{password}@127.0.0.1:{free_port()}/pointsman"
    done = forget_command("--store", url, "--tenant", "acme")
    assert done.returncode == 2
    assert done.stderr.startswith("pointsman forget: store postgresql://ops:***@127.0.0.1:"), done.stderr
    assert "percent-encode" in done.stderr and len(done.stderr.splitlines()) == 1
    assert "s3cret" not in done.stderr + done.stdout and password.split("s3cret")[0] not in done.stderr


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:ab/cd==@h:5/db?sslmode=disable", "postgresql://u:***@h:5/db?sslmode=disable"),
        ("postgresql://h:5432/db?user=me@corp", "postgresql://h:5432/db?user=me@corp"),
        ("postgresql://u@h/db?sslmode=require&PASSWORD=pw", "postgresql://u@h/db?sslmode=require&PASSWORD=***"),
        ("postgresql://u@h/db?mypassword=x", "postgresql://u@h/db?mypassword=x"),
    ],
)
def test_masked_store_url(url: str, masked: str) -> None:
    from store.url import masked_store_url

    assert masked_store_url(url) == masked


async def _migrated_by_a_newer_release(url: str, make_record: MakeRecord) -> None:
    """A store with one decision of tenant acme, then a step this release does not know recorded (as a
    newer release would, with a table of its own holding the tenant's data)."""
    store = open_store_url(url)
    await store.open()
    try:
        await store.write_batch([make_record(1, tenant="acme")])
    finally:
        await store.close()
    newer = SCHEMA_VERSION + 1
    if url.startswith("postgresql://"):
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE TABLE tenant_notes (tenant text)")
            await conn.execute("INSERT INTO schema_version VALUES ($1, 0)", newer)
        finally:
            await conn.close()
    else:
        import sqlite3

        db = sqlite3.connect(url.removeprefix("sqlite://"))
        with db:
            db.execute("CREATE TABLE tenant_notes (tenant TEXT)")
            db.execute("INSERT INTO schema_version VALUES (?, 0)", (newer,))
        db.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, sqlite_path: str) -> str:
    if request.param == "sqlite":
        return f"sqlite://{sqlite_path}"
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


async def test_a_store_a_newer_release_migrated_serves_with_a_warning_but_forget_refuses(
    store_url: str, make_record: MakeRecord, caplog: pytest.LogCaptureFixture
) -> None:
    await _migrated_by_a_newer_release(store_url, make_record)
    store = open_store_url(store_url)
    with caplog.at_level(logging.WARNING, logger="store"):
        await store.open()
    try:
        assert store.schema_version == SCHEMA_VERSION + 1
        await store.write_batch([make_record(2)])  # a replica of the older release still records
        assert await store.count() == 2
    finally:
        await store.close()
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this release's {SCHEMA_VERSION}" in caplog.text
    assert "s3cret" not in caplog.text

    done = forget_command("--store", store_url, "--tenant", "acme")
    assert done.returncode == 2, done.stdout
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this pointsman knows" in done.stderr
    store = open_store_url(store_url)
    await store.open()
    try:
        assert await store.fetch("req-000001") is not None, "forget deleted part of the tenant's data"
    finally:
        await store.close()
