"""SQLite decision store: the embedded default.

One stdlib ``sqlite3`` connection lives in one dedicated worker thread; every call is handed to that
thread, so the event loop never blocks on disk and the connection is never shared across threads.
WAL mode with ``synchronous=NORMAL`` makes each decision batch one cheap fsync-free commit while
readers (evals, ``sqlite3`` on the command line) can read concurrently. Feedback is acknowledged to
clients only once durable, so its transactions run with ``synchronous=FULL`` (the WAL is fsynced at
their commit): they survive a power cut, not only a crash of the process.

An open connection keeps writing to its file's inode even after the path stops naming it (deleted by a
clean-up job, replaced by a restored backup): every commit would succeed into a file nobody can open
again. So each call first checks that the path still names the opened file, and otherwise reconnects
(creating and migrating the file again) and logs it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from store import experiment_sql as xsql
from store import traffic_sql as tsql
from store._codec import (
    encode_conversation,
    encode_feedback,
    encode_json,
    encode_row,
    encode_subcall,
    feedback_check,
    feedback_from_row,
    join_logged,
    of_decision,
    record_from_row,
    subcall_from_row,
)
from store.base import check_forget_args
from store.records import (
    ArmOutcomes,
    ArmStop,
    ArmTotals,
    DecisionRecord,
    ExperimentRow,
    FeedbackRecord,
    LoggedRequest,
    SubCallRecord,
    TrafficWindow,
)
from store.schema import (
    CONVERSATIONS_TABLE,
    DECISIONS_TABLE,
    EXPERIMENT_UNREAD,
    FEEDBACK_TABLE,
    FORGET_TABLES,
    SUBCALLS_TABLE,
    VERSION_TABLE,
    feedback_covered_sql,
    forget_sql,
    insert_conversation_sql,
    insert_decisions_sql,
    insert_subcalls_sql,
    logged_filter,
    migrations,
    note_newer_schema,
    purge_text_sql,
    select_conversations_sql,
    select_decisions_sql,
    select_feedback_sql,
    select_subcalls_sql,
    tombstone_sql,
    upsert_feedback_sql,
    version_table_ddl,
    without_feedback_sql,
)

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: How long a writer waits for another process's lock before failing (ms).
BUSY_TIMEOUT_MS = 5000
#: How long the text purge's checkpoint waits for other connections (ms): the gateway runs it every 10
#: minutes on the connection its writes wait for (a forget, an operator's command, waits BUSY_TIMEOUT_MS).
PURGE_ERASE_WAIT_MS = 250

#: Decisions (with their feedback, conversations and sub-calls) one transaction of a tenant's forget
#: deletes: a few tens of milliseconds of write lock. Also SQLite's oldest limit on bound parameters
#: (999) bounds it.
FORGET_BATCH = 500

#: Tables whose rows hang off a decision by request id and carry a tenant, deleted before the decision.
_CHILD_TABLES = (FEEDBACK_TABLE, CONVERSATIONS_TABLE, SUBCALLS_TABLE)
_TENANT_DECISIONS_SQL = f"SELECT request_id FROM {DECISIONS_TABLE} WHERE tenant = ? LIMIT ?"


def _file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file ``path`` names now, or None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _add(counts: dict[str, int], batch: dict[str, int]) -> None:
    """Add a committed batch's rows deleted per table to a forget's running ``counts``."""
    for table, n in batch.items():
        counts[table] += n


def _rollback(conn: sqlite3.Connection) -> None:
    # Some errors (disk full, I/O) already rolled the transaction back; a second ROLLBACK would
    # raise and hide the original error.
    if conn.in_transaction:
        conn.execute("ROLLBACK")


@contextmanager
def _transaction(conn: sqlite3.Connection, *, immediate: bool = True) -> Iterator[None]:
    """One write transaction on ``conn``: committed when the block ends, rolled back (and the error
    re-raised unchanged) when the block or the COMMIT raises, whatever it raised.

    ``immediate`` (BEGIN IMMEDIATE) takes the write lock up front, so a transaction that reads before it
    writes never fails half-way with SQLITE_BUSY on the upgrade from reader to writer; waiting for the
    lock is left to ``busy_timeout``. Nothing is retried here.
    """
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


class SQLiteDecisionStore:
    """Decision records in a SQLite file (``path``; ``":memory:"`` works for throwaway use)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        # (device, inode) of the file the connection has open; None for ":memory:" and file: URIs.
        self._identity: tuple[int, int] | None = None
        #: The newest migration step the database records (set by open; above SCHEMA_VERSION when a
        #: newer release migrated it).
        self.schema_version = 0
        self._insert_sql = insert_decisions_sql("sqlite")
        self._conversation_sql = insert_conversation_sql("sqlite")
        self._feedback_sql = upsert_feedback_sql("sqlite")
        self._subcalls_sql = insert_subcalls_sql("sqlite")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise RuntimeError("SQLiteDecisionStore is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # --- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the file (creating its directory), switch to WAL and migrate the schema."""
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pointsman-sqlite")
        try:
            await self._run(self._open_sync)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    def _open_sync(self) -> None:
        self._conn, self._identity = self._connect_sync()

    def _connect_sync(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        on_disk = self.path != ":memory:" and not self.path.startswith("file:")
        if on_disk:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN/COMMIT below), nothing implicit.
        conn = sqlite3.connect(self.path, isolation_level=None, uri=self.path.startswith("file:"))
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # What forget and the text purge delete is overwritten with zeros, not only unlinked: the
            # default of some builds of SQLite (Debian's), not of others (its own).
            conn.execute("PRAGMA secure_delete = ON")
            self.schema_version = self._migrate_sync(conn)
            note_newer_schema(self.schema_version, self.path)
            # Taken after connecting: the file exists now (connect created it when it did not).
            identity = _file_identity(self.path) if on_disk else None
        except BaseException:
            conn.close()
            raise
        return conn, identity

    async def migrate(self) -> None:
        """Create missing tables and indexes; safe to call any number of times."""
        self.schema_version = await self._run(lambda: self._migrate_sync(self._require_conn()))

    @staticmethod
    def _migrate_sync(conn: sqlite3.Connection) -> int:
        """Apply the missing steps; returns the newest step the database records."""
        # BEGIN IMMEDIATE takes the write lock up front, so two processes starting together
        # apply each step once instead of racing.
        with _transaction(conn):
            conn.execute(version_table_ddl("sqlite"))
            done = {row[0] for row in conn.execute(f"SELECT version FROM {VERSION_TABLE}")}
            for version, statements in migrations("sqlite"):
                if version in done:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO {VERSION_TABLE} (version, applied_at) VALUES (?, ?) ON CONFLICT (version) DO NOTHING",
                    (version, time.time()),
                )
        return max(done | {version for version, _statements in migrations("sqlite")})

    async def close(self) -> None:
        """Close the connection and stop the worker thread."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        finally:
            executor.shutdown(wait=False)

    def _require_conn(self) -> sqlite3.Connection:
        """The connection, on the file the path names now (called in the worker thread)."""
        if self._conn is None:
            raise RuntimeError("SQLiteDecisionStore is not open")
        if self._identity is not None and _file_identity(self.path) != self._identity:
            self._reconnect_sync()
        return self._conn

    def _reconnect_sync(self) -> None:
        """The path no longer names the opened file: empty its WAL into it, close it and connect to
        whatever the path names, creating it if needed.

        The WAL is found by name (``<path>-wal``) and SQLite does not delete it on closing a file that
        was moved or unlinked: left full, the next connection would replay the old file's pages onto
        the new one. TRUNCATE checkpoints every frame into the old file and leaves the WAL empty.
        """
        logger.error(
            "the SQLite decision store %s was deleted or replaced while open; reopening it "
            "(what was written before is in the old file)", self.path,
        )
        old, self._conn = self._conn, None
        if old is not None:
            try:
                old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                logger.error("could not empty the old file's WAL before reopening: %s", type(exc).__name__)
            old.close()
        self._conn, self._identity = self._connect_sync()

    # --- writes --------------------------------------------------------------------------------

    async def write_batch(self, records: Sequence[DecisionRecord]) -> int:
        """Insert ``records``, their conversations and their workflows' sub-calls in one
        transaction; request ids already stored are ignored. Returns how many records were not written
        (stored already, or covered by a tombstone)."""
        if not records:
            return 0
        # Encode on the event loop side: cheap, and keeps the worker thread doing only I/O.
        rows = [encode_row(r) for r in records]
        # A child row carries its decision's shadow_of and created_at: a tombstone covering the decision
        # covers it too (schema.insert_conversation_sql).
        conversations = [
            (*encode_conversation(r.conversation), *of_decision(row))
            for r, row in zip(records, rows, strict=True) if r.conversation is not None
        ]
        subcalls = [(*encode_subcall(s), *of_decision(row)) for r, row in zip(records, rows, strict=True)
                    for s in r.subcalls]
        return await self._run(self._write_sync, rows, conversations, subcalls)

    def _write_sync(
        self, rows: list[tuple[Any, ...]], conversations: list[tuple[Any, ...]], subcalls: list[tuple[Any, ...]]
    ) -> int:
        conn = self._require_conn()
        with _transaction(conn, immediate=False):
            before = conn.total_changes
            conn.executemany(self._insert_sql, rows)
            skipped = len(rows) - (conn.total_changes - before)
            if conversations:
                conn.executemany(self._conversation_sql, conversations)
            if subcalls:
                conn.executemany(self._subcalls_sql, subcalls)
        return skipped

    async def write_feedback(self, items: Sequence[FeedbackRecord]) -> list[int]:
        """Upsert ``items`` in one transaction, fsynced before this returns; returns the indexes of the items
        a tombstone covered (not written)."""
        if not items:
            return []
        rows = [(*encode_feedback(item), item.issued_at) for item in items]
        return await self._run(self._write_feedback_sync, rows)

    def _write_feedback_sync(self, rows: list[tuple[Any, ...]]) -> list[int]:
        conn = self._require_conn()
        conn.execute("PRAGMA synchronous = FULL")
        try:
            with _transaction(conn, immediate=False):
                before = conn.total_changes
                conn.executemany(self._feedback_sql, rows)
                # An upsert changes one row, inserted or replaced; only a skipped one changes none. Which
                # were skipped is asked only then (rarely: feedback on a forgotten request).
                if conn.total_changes - before >= len(rows):
                    return []
                covered = feedback_covered_sql("sqlite")
                return [i for i, row in enumerate(rows) if conn.execute(covered, feedback_check(row)).fetchone()[0]]
        finally:
            conn.execute("PRAGMA synchronous = NORMAL")

    async def forget(self, *, tenant: str | None = None, request_id: str | None = None) -> dict[str, int]:
        """Delete a tenant's or a request's decisions, feedback, conversations and sub-calls.

        A request's rows go in one transaction. A tenant's go in batches of :data:`FORGET_BATCH`
        decisions, each batch one transaction with the decisions' feedback, conversations and sub-calls
        (so an interrupted forget leaves whole requests, never feedback or a conversation without its
        decision, and running it again finishes the job), then the tenant's rows that hang off no
        decision of the tenant. Between transactions the write lock is left free for as long as the
        last one held it: one transaction for a large tenant held it for seconds, and a gateway writing
        to the same file waited behind it (decision writes failing with SQLITE_BUSY, feedback answered
        503).
        """
        by_tenant, value = check_forget_args(tenant, request_id)
        if not by_tenant:
            counts = await self._run(self._forget_sync, value)
        else:
            counts = dict.fromkeys(FORGET_TABLES, 0)
            # The tombstone goes in the first batch's transaction: from its commit on, the tenant's requests
            # issued until now are neither written (a gateway's queued records, feedback) nor found again.
            forgotten_at: float | None = time.time()
            for step in (self._forget_decisions_sync, self._forget_strays_sync):
                while True:
                    started = time.monotonic()
                    deleted = await self._run(step, value, counts, forgotten_at)
                    forgotten_at = None
                    if not deleted:
                        break
                    await asyncio.sleep(time.monotonic() - started)
        if any(counts.values()):
            await self._run(self._erase_wal_sync, BUSY_TIMEOUT_MS)
        return counts

    def _forget_sync(self, request_id: str) -> dict[str, int]:
        """One request (and its experiment shadows), in one transaction."""
        conn = self._require_conn()
        counts: dict[str, int] = {}
        with _transaction(conn):
            conn.execute(tombstone_sql("sqlite", by_tenant=False), (request_id, time.time()))
            for table, sql in forget_sql("sqlite", by_tenant=False):
                counts[table] = conn.execute(sql, (request_id,)).rowcount
        return {name: counts[name] for name in FORGET_TABLES}

    def _forget_decisions_sync(self, tenant: str, counts: dict[str, int], forgotten_at: float | None) -> int:
        """Delete up to FORGET_BATCH of the tenant's decisions with every row hanging off them, in one
        transaction (with the tenant's tombstone, at ``forgotten_at``, when given); adds to ``counts``, returns
        the decisions deleted (0: none left)."""
        conn = self._require_conn()
        batch: dict[str, int] = {}
        with _transaction(conn):
            if forgotten_at is not None:
                conn.execute(tombstone_sql("sqlite", by_tenant=True), (tenant, forgotten_at))
            ids = [row[0] for row in conn.execute(_TENANT_DECISIONS_SQL, (tenant, FORGET_BATCH))]
            if ids:
                marks = ", ".join("?" * len(ids))
                for table in (*_CHILD_TABLES, DECISIONS_TABLE):  # children first, as forget_sql does
                    batch[table] = conn.execute(f"DELETE FROM {table} WHERE request_id IN ({marks})", ids).rowcount
        _add(counts, batch)
        return len(ids)

    def _forget_strays_sync(self, tenant: str, counts: dict[str, int], _forgotten_at: float | None) -> int:
        """Delete up to FORGET_BATCH rows per child table that carry the tenant but hang off none of its
        decisions (feedback on a request forgotten since, rows whose decision was never written), in
        one transaction; adds to ``counts``, returns the rows deleted (0: none left)."""
        conn = self._require_conn()
        batch: dict[str, int] = {}
        with _transaction(conn):
            for table in _CHILD_TABLES:
                batch[table] = conn.execute(
                    f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE tenant = ? LIMIT ?)",
                    (tenant, FORGET_BATCH),
                ).rowcount
        _add(counts, batch)
        return sum(batch.values())

    async def purge_expired_text(self, now: float) -> int:
        """Delete the text of conversations whose retention ended at or before ``now``."""
        return await self._run(self._purge_sync, now)

    async def reclaim_deleted(self) -> tuple[str, ...]:
        """Nothing to do: forget and the purge overwrite what they delete (``secure_delete``) and empty
        the write-ahead log themselves (:meth:`_erase_wal_sync`)."""
        return ()

    def _purge_sync(self, now: float) -> int:
        conn = self._require_conn()
        with _transaction(conn):
            purged = conn.execute(purge_text_sql("sqlite"), (now,)).rowcount
        if purged:
            # Briefly: the gateway purges on the connection its decision and feedback writes wait for.
            self._erase_wal_sync(PURGE_ERASE_WAIT_MS)
        return int(purged)

    def _erase_wal_sync(self, wait_ms: int) -> None:
        """Empty the write-ahead log after a deletion (forget, the text purge).

        The WAL keeps the page images of every transaction since it was last reset, the inserts of what
        was just deleted among them, and while a gateway has the store open it is never deleted: a copy of
        the files (``strings decisions.db-wal``) gave forgotten text back long after the rows were gone.
        A TRUNCATE checkpoint copies the latest pages (the deleted content zeroed, see ``secure_delete``)
        into the database and cuts the log to zero bytes. It waits up to ``wait_ms`` for readers and writers
        of other connections (and holds off this connection's writes meanwhile); when they keep it from
        finishing, the log is emptied by a later forget or purge, or when the last connection closes.
        """
        conn = self._require_conn()
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
            row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:  # the deletion itself committed: say so, do not fail it
            row = (exc,)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if row is not None and row[0]:
            logger.warning(
                "the SQLite decision store %s is busy: its write-ahead log still holds what was just deleted "
                "until its next full checkpoint", self.path,
            )

    # --- reads ---------------------------------------------------------------------------------

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        rows = await self._run(self._query_sync, select_decisions_sql() + " WHERE request_id = ?", (request_id,))
        return record_from_row(rows[0]) if rows else None

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        sql = select_decisions_sql() + " ORDER BY created_at DESC, request_id DESC LIMIT ?"
        return [record_from_row(row) for row in await self._run(self._query_sync, sql, (limit,))]

    async def count(self) -> int:
        rows = await self._run(self._query_sync, "SELECT count(*) AS n FROM decisions", ())
        return int(rows[0]["n"])

    async def fetch_feedback(self, request_id: str) -> list[FeedbackRecord]:
        sql = select_feedback_sql() + " WHERE request_id = ? ORDER BY metric, source, model"
        return [feedback_from_row(row) for row in await self._run(self._query_sync, sql, (request_id,))]

    async def fetch_subcalls(self, request_id: str) -> list[SubCallRecord]:
        sql = select_subcalls_sql() + " WHERE request_id = ? ORDER BY idx"
        return [subcall_from_row(row) for row in await self._run(self._query_sync, sql, (request_id,))]

    async def feedback_count(self) -> int:
        rows = await self._run(self._query_sync, "SELECT count(*) AS n FROM feedback", ())
        return int(rows[0]["n"])

    async def logged_requests(
        self, *, route: str | None = None, since: float | None = None, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        where, params = logged_filter("sqlite", route, since, with_feedback=with_feedback)
        chosen = f"request_id IN (SELECT request_id FROM decisions{where})"
        queries = [
            (select_decisions_sql() + where + " ORDER BY created_at, request_id", params),
            (select_conversations_sql() + " WHERE " + chosen, params),
            (select_feedback_sql() + " WHERE " + chosen + " ORDER BY metric, source, model", params),
        ]
        decisions, conversations, feedback = await self._run(self._snapshot_sync, queries)
        return join_logged(decisions, conversations, feedback)

    async def count_without_feedback(self, *, route: str | None = None, since: float | None = None) -> int:
        where, params = logged_filter("sqlite", route, since)
        rows = await self._run(self._query_sync, without_feedback_sql(where), tuple(params))
        return int(rows[0][0])

    async def traffic(self, since: float, bucket_seconds: float) -> TrafficWindow:
        """Served decisions since ``since``, aggregated per ``bucket_seconds`` (one snapshot)."""
        if bucket_seconds <= 0:
            raise ValueError("bucket_seconds must be positive")
        params = [since, bucket_seconds]
        queries = [(tsql.buckets_sql("sqlite"), params), (tsql.latency_sql("sqlite"), params)]
        buckets, latency = await self._run(self._snapshot_sync, queries)
        return tsql.window_from_rows(since, bucket_seconds, buckets, latency)

    # --- experiments -----------------------------------------------------------------------------

    async def register_experiment(self, name: str, route: str, spec: dict[str, Any]) -> None:
        """Register (or replace) an experiment's route and normalised spec."""
        params = (name, route, encode_json(spec), time.time())
        await self._run(self._write_one_sync, xsql.upsert_experiment_sql("sqlite"), params)

    async def fetch_experiment(self, name: str) -> ExperimentRow | None:
        rows = await self._run(self._query_sync, xsql.select_experiments_sql("sqlite", by_name=True), (name,))
        return xsql.experiment_from_row(rows[0]) if rows else None

    async def list_experiments(self) -> list[ExperimentRow]:
        rows = await self._run(self._query_sync, xsql.select_experiments_sql("sqlite", by_name=False), ())
        return [xsql.experiment_from_row(row) for row in rows]

    async def stop_arm(
        self, experiment: str, arm: str, reason: str, detail: dict[str, Any], replica: str | None, at: float
    ) -> bool:
        """Store an arm's stop; False when it was already stopped (the first stop is kept)."""
        params = (experiment, arm, reason, encode_json(detail), at, replica)
        return await self._run(self._write_one_sync, xsql.insert_stop_sql("sqlite"), params) > 0

    async def resume_arm(self, experiment: str, arm: str) -> bool:
        """Remove an arm's stop; False when it was not stopped."""
        return await self._run(self._write_one_sync, xsql.delete_stop_sql("sqlite"), (experiment, arm)) > 0

    async def experiment_stops(self, experiment: str | None = None) -> list[ArmStop]:
        sql = xsql.select_stops_sql("sqlite", by_experiment=experiment is not None)
        rows = await self._run(self._query_sync, sql, () if experiment is None else (experiment,))
        return [xsql.stop_from_row(row) for row in rows]

    async def experiment_totals(self, experiment: str, since: float | None = None) -> dict[str, ArmTotals]:
        sql = xsql.totals_sql("sqlite", since=since is not None)
        rows = await self._run(self._query_sync, sql, (experiment,) if since is None else (experiment, since))
        return {totals.arm: totals for totals in map(xsql.totals_from_row, rows)}

    async def experiment_outcomes(
        self, experiment: str, metric: str, since: float | None = None
    ) -> dict[str, ArmOutcomes]:
        sql = xsql.outcomes_sql("sqlite", metric, since=since is not None)
        params = (experiment, metric) if since is None else (experiment, metric, since)
        rows = await self._run(self._query_sync, sql, params)
        return {outcomes.arm: outcomes for outcomes in map(xsql.outcomes_from_row, rows)}

    async def experiment_latencies(self, experiment: str, since: float) -> dict[str, list[float]]:
        rows = await self._run(self._query_sync, xsql.latencies_sql("sqlite"), (experiment, since))
        return xsql.latencies_from_rows(rows)

    async def get_assignment(self, experiment: str, key_hash: str) -> tuple[str, float | None] | None:
        rows = await self._run(self._query_sync, xsql.select_assignment_sql("sqlite"), (experiment, key_hash))
        return (str(rows[0]["arm"]), rows[0]["propensity"]) if rows else None

    async def put_assignment(
        self, experiment: str, key_hash: str, arm: str, propensity: float | None, at: float
    ) -> tuple[str, float | None]:
        """Assign a key unless it already is; returns the stored assignment (first writer wins)."""
        return await self._run(self._put_assignment_sync, (experiment, key_hash, arm, propensity, at))

    def _put_assignment_sync(self, params: tuple[Any, ...]) -> tuple[str, float | None]:
        conn = self._require_conn()
        with _transaction(conn):
            conn.execute(xsql.insert_assignment_sql("sqlite"), params)
            row = conn.execute(xsql.select_assignment_sql("sqlite"), params[:2]).fetchone()
        return str(row["arm"]), row["propensity"]

    async def experiment_requests(
        self, experiment: str, since: float | None = None, *, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        """Every decision row of ``experiment`` (served and shadow), oldest first, each with its
        feedback (conversations are not loaded); with ``with_feedback``, only the rows that have some.
        Each row's signals, reason and error message are read empty (:data:`store.schema.EXPERIMENT_UNREAD`):
        no experiment read uses them and they are most of a row."""
        where, extra = xsql.experiment_filter("sqlite", since, with_feedback=with_feedback)
        params = [experiment, *extra]
        chosen = f"request_id IN (SELECT request_id FROM decisions{where})"
        queries = [
            (select_decisions_sql(EXPERIMENT_UNREAD) + where + " ORDER BY created_at, request_id", params),
            (select_feedback_sql() + " WHERE " + chosen + " ORDER BY metric, source, model", params),
        ]
        return await self._run(self._joined_sync, queries)

    def _joined_sync(self, queries: list[tuple[str, list[Any]]]) -> list[LoggedRequest]:
        # Decoded in the store's thread too: a large experiment's rows took seconds of the event loop.
        decisions, feedback = self._snapshot_sync(queries)
        return join_logged(decisions, [], feedback)

    def _write_one_sync(self, sql: str, params: tuple[Any, ...]) -> int:
        conn = self._require_conn()
        with _transaction(conn):
            changed = conn.execute(sql, params).rowcount
        return int(changed)

    def _snapshot_sync(self, queries: list[tuple[str, list[Any]]]) -> list[list[sqlite3.Row]]:
        # One read transaction: in WAL mode every query sees the same snapshot.
        conn = self._require_conn()
        conn.execute("BEGIN")
        try:
            return [conn.execute(sql, params).fetchall() for sql, params in queries]
        finally:
            _rollback(conn)

    def _query_sync(self, sql: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        return self._require_conn().execute(sql, params).fetchall()
