"""A SQLite decision store whose file is deleted or replaced under a running gateway.

An open SQLite connection writes to its file's inode, not its path: without a check, every record after
the file was deleted (a clean-up job, an operator resetting the log) commits into a file no one can open
again, while the recorder counts it as written.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from store import DecisionRecord, DecisionRecorder, SQLiteDecisionStore
from tests.polling import eventually_async

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]


def stored_ids(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT request_id FROM decisions ORDER BY request_id")]
    finally:
        conn.close()


def integrity(path: str) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("suffixes", [("",), ("", "-wal", "-shm")], ids=["rm-db", "rm-db-wal-shm"])
async def test_records_after_the_file_is_deleted_land_in_a_new_file(
    sqlite_path: str, make_record: MakeRecord, caplog: pytest.LogCaptureFixture, suffixes: tuple[str, ...]
) -> None:
    recorder = DecisionRecorder(SQLiteDecisionStore(sqlite_path), flush_interval=0.02, purge_interval=None)
    await recorder.start()
    try:
        recorder.record(make_record(1))
        await eventually_async(lambda: recorder.written == 1)
        for suffix in suffixes:  # `rm pointsman.db` leaves the WAL of the old file behind
            os.remove(sqlite_path + suffix)
        with caplog.at_level(logging.ERROR, logger="store"):
            recorder.record(make_record(2))
            await eventually_async(lambda: recorder.written == 2)
        # Readable by anyone who opens the path now, with the current schema.
        assert stored_ids(sqlite_path) == ["req-000002"]
        assert await recorder.store.fetch("req-000002") is not None
    finally:
        await recorder.stop()
    assert stored_ids(sqlite_path) == ["req-000002"]
    assert integrity(sqlite_path) == "ok"
    assert "deleted or replaced" in caplog.text


async def test_a_file_replaced_by_a_restored_copy_is_written_from_then_on(
    tmp_path: Path, make_record: MakeRecord
) -> None:
    path = str(tmp_path / "decisions.db")
    store = SQLiteDecisionStore(path)
    await store.open()
    try:
        await store.write_batch([make_record(1)])
        backup = str(tmp_path / "backup.db")
        conn = sqlite3.connect(path)
        conn.execute(f"VACUUM INTO '{backup}'")
        conn.close()
        await store.write_batch([make_record(2)])
        # The operator restores the backup over the live file (a rename: a new inode at the path).
        shutil.move(backup, path)
        await store.write_batch([make_record(3)])
        assert await store.count() == 2
    finally:
        await store.close()
    assert stored_ids(path) == ["req-000001", "req-000003"]
    assert integrity(path) == "ok"
