"""PostgreSQL decision store, for many gateway replicas writing one log.

asyncpg with a small pool (the recorder writes from one task; reads are occasional). The schema
lives in whatever schema the connection's ``search_path`` selects, so a deployment or a test run can
isolate itself with ``?search_path=name`` in the DSN or ``server_settings``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

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
from store.deadline import within
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

# Key of the transaction-scoped advisory lock that serializes migrations: replicas starting together
# would otherwise race on CREATE TABLE IF NOT EXISTS (it is not atomic against itself in PostgreSQL).
_MIGRATION_LOCK_KEY = 0x706F696E74736D61  # "pointsma"
# PostgreSQL text cannot hold U+0000: a query parameter holding it fails (CharacterNotInRepertoireError),
# and every write strips it, so no stored request id has one. A lookup by such an id (a client's
# POST /v1/feedback) finds nothing, as on SQLite, instead of raising: the feedback endpoint read that as
# the store being unavailable and answered 503 (retry) to a request that can only ever be a 404.
_NUL = "\x00"
#: Seconds :meth:`PostgresDecisionStore.close` waits for the pool to close gracefully before closing its
#: connections outright.
CLOSE_TIMEOUT = 5.0
#: The tables a gateway writes a request's rows to, in the order its transactions write them
#: (decisions, then their conversations and sub-calls; feedback alone): forget locks them in this order.
_WRITE_ORDER = (DECISIONS_TABLE, CONVERSATIONS_TABLE, SUBCALLS_TABLE, FEEDBACK_TABLE)
#: Seconds :meth:`PostgresDecisionStore.reclaim_deleted`'s VACUUM may take (the pool's command timeout,
#: 30 s, is for the gateway's statements; VACUUM reads every page a delete left dead rows in).
VACUUM_TIMEOUT = 3600.0


class PostgresDecisionStore:
    """Decision records in PostgreSQL, reached through ``dsn`` (a ``postgresql://`` URL)."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        server_settings: Mapping[str, str] | None = None,
        command_timeout: float = 30.0,
    ) -> None:
        self.dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self._server_settings = dict(server_settings or {})
        self._command_timeout = command_timeout
        self._pool: asyncpg.Pool | None = None
        #: The newest migration step the database records (set by open; above SCHEMA_VERSION when a
        #: newer release migrated it).
        self.schema_version = 0
        self._insert_sql = insert_decisions_sql("postgres") + " RETURNING 1"
        self._conversation_sql = insert_conversation_sql("postgres")
        self._feedback_sql = upsert_feedback_sql("postgres") + " RETURNING 1"
        self._covered_sql = feedback_covered_sql("postgres")
        self._subcalls_sql = insert_subcalls_sql("postgres")

    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("PostgresDecisionStore is not open")
        return self._pool

    # --- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the connection pool and migrate the schema."""
        if self._pool is not None:
            return
        pool = await asyncpg.create_pool(
            self.dsn,
            min_size=self._min_size,
            max_size=self._max_size,
            command_timeout=self._command_timeout,
            server_settings=self._server_settings or None,
        )
        try:
            self.schema_version = await self._migrate(pool)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        from store.url import masked_store_url  # here: store.url imports this module

        note_newer_schema(self.schema_version, masked_store_url(self.dsn) if "://" in self.dsn else "store.dsn")

    async def migrate(self) -> None:
        """Create missing tables and indexes; safe to call any number of times, from many replicas."""
        self.schema_version = await self._migrate(self._require_pool())

    @staticmethod
    async def _migrate(pool: asyncpg.Pool) -> int:
        """Apply the missing steps under the migration lock; returns the newest step the database records."""
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK_KEY)
            await conn.execute(version_table_ddl("postgres"))
            done = {row["version"] for row in await conn.fetch(f"SELECT version FROM {VERSION_TABLE}")}
            for version, statements in migrations("postgres"):
                if version in done:
                    continue
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(
                    f"INSERT INTO {VERSION_TABLE} (version, applied_at) VALUES ($1, $2) "
                    "ON CONFLICT (version) DO NOTHING",
                    version,
                    time.time(),
                )
        return max(done | {version for version, _statements in migrations("postgres")})

    async def close(self) -> None:
        """Close the pool: waits for in-flight queries, for at most :data:`CLOSE_TIMEOUT` seconds, then
        closes their connections. A query given up on (a write past the recorder's drain deadline) holds
        its connection until its cancellation reaches a server that may have stopped answering, and a
        graceful close waited for that: the command timeout, or for ever without one."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await within(pool.close(), CLOSE_TIMEOUT)
        except TimeoutError:
            pool.terminate()

    # --- writes --------------------------------------------------------------------------------

    async def write_batch(self, records: Sequence[DecisionRecord]) -> int:
        """Insert ``records``, their conversations and their workflows' sub-calls in one
        transaction; request ids already stored are ignored. Returns how many records were not written
        (stored already, or covered by a tombstone)."""
        if not records:
            return 0
        # PostgreSQL refuses U+0000 in text and jsonb; strip it rather than refuse the whole batch.
        rows = [encode_row(r, strip_nul=True) for r in records]
        # A child row carries its decision's shadow_of and created_at: a tombstone covering the decision
        # covers it too (schema.insert_conversation_sql).
        conversations = [
            (*encode_conversation(r.conversation, strip_nul=True), *of_decision(row))
            for r, row in zip(records, rows, strict=True) if r.conversation is not None
        ]
        subcalls = [(*encode_subcall(s, strip_nul=True), *of_decision(row))
                    for r, row in zip(records, rows, strict=True) for s in r.subcalls]
        async with self._require_pool().acquire() as conn, conn.transaction():
            # One row back per row inserted: the same pipelined round trip as executemany.
            inserted = await conn.fetchmany(self._insert_sql, rows)
            if conversations:
                await conn.executemany(self._conversation_sql, conversations)
            if subcalls:
                await conn.executemany(self._subcalls_sql, subcalls)
        return len(rows) - len(inserted)

    async def write_feedback(self, items: Sequence[FeedbackRecord]) -> list[int]:
        """Upsert ``items`` in one transaction (committed, hence durable, when this returns); returns the
        indexes of the items a tombstone covered (not written)."""
        if not items:
            return []
        rows = [(*encode_feedback(item, strip_nul=True), item.issued_at) for item in items]
        async with self._require_pool().acquire() as conn, conn.transaction():
            # One row back per row written, inserted or replaced: the same pipelined round trip as executemany.
            written = await conn.fetchmany(self._feedback_sql, rows)
            if len(written) >= len(rows):
                return []
            # Which were skipped is asked only then (rarely: feedback on a forgotten request).
            return [i for i, row in enumerate(rows) if await conn.fetchval(self._covered_sql, *feedback_check(row))]

    async def forget(self, *, tenant: str | None = None, request_id: str | None = None) -> dict[str, int]:
        """Delete a tenant's or a request's decisions, feedback, conversations and sub-calls (in one
        transaction), after committing the tombstone that keeps a running gateway from writing them again.

        A gateway's write that began before the tombstone commits does not see it, and deletes do not see
        that write's rows until it commits: such a row would outlive the forget. So the tombstone goes in
        under a table lock, which waits for the writes in flight and holds new ones until it commits; every
        write after that sees the tombstone, and the deletes, after it, see every row written before. The
        lock is not held through the deletes: for a large tenant they take long, and every replica's writes
        of every other tenant waited for them (feedback answered 503). A forget stopped between the two
        transactions leaves the tombstone (nothing more of those requests is written) and the rows, which
        running it again deletes.
        """
        by_tenant, value = check_forget_args(tenant, request_id)
        counts: dict[str, int] = {}
        async with self._require_pool().acquire() as conn:
            async with conn.transaction():
                # In the order write_batch takes them; a gateway's reads never wait for it.
                await conn.execute(f"LOCK TABLE {', '.join(_WRITE_ORDER)} IN SHARE ROW EXCLUSIVE MODE")
                await conn.execute(tombstone_sql("postgres", by_tenant=by_tenant), value, time.time())
            async with conn.transaction():
                for table, sql in forget_sql("postgres", by_tenant=by_tenant):
                    status = await conn.execute(sql, value)  # "DELETE <n>"
                    counts[table] = int(status.rsplit(" ", 1)[-1])
        return {name: counts[name] for name in FORGET_TABLES}

    async def purge_expired_text(self, now: float) -> int:
        """Delete the text of conversations whose retention ended at or before ``now``."""
        status = await self._require_pool().execute(purge_text_sql("postgres"), now)  # "UPDATE <n>"
        return int(status.rsplit(" ", 1)[-1])

    async def reclaim_deleted(self) -> tuple[str, ...]:
        """VACUUM the tables forget and the text purge delete from, once their transaction committed.

        A DELETE (and the purge's UPDATE) only marks row versions dead: the forgotten text stays in the
        tables' pages, readable from the data files, until a VACUUM removes the versions and their index
        entries, which autovacuum does whenever it gets round to it. VACUUM cannot run in a transaction
        block, so it is sent on its own (asyncpg's autocommit). It cannot remove a version a transaction
        still open may read (its snapshot predates the delete); that one goes at a later (auto)vacuum.
        """
        async with self._require_pool().acquire() as conn:
            await conn.execute(f"VACUUM {', '.join(FORGET_TABLES)}", timeout=VACUUM_TIMEOUT)
        return FORGET_TABLES

    # --- reads ---------------------------------------------------------------------------------

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        if _NUL in request_id:
            return None  # see _NUL
        row = await self._require_pool().fetchrow(select_decisions_sql() + " WHERE request_id = $1", request_id)
        return record_from_row(row) if row is not None else None

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        sql = select_decisions_sql() + " ORDER BY created_at DESC, request_id DESC LIMIT $1"
        return [record_from_row(row) for row in await self._require_pool().fetch(sql, limit)]

    async def count(self) -> int:
        return int(await self._require_pool().fetchval("SELECT count(*) FROM decisions"))

    async def fetch_feedback(self, request_id: str) -> list[FeedbackRecord]:
        if _NUL in request_id:
            return []
        sql = select_feedback_sql() + " WHERE request_id = $1 ORDER BY metric, source, model"
        return [feedback_from_row(row) for row in await self._require_pool().fetch(sql, request_id)]

    async def fetch_subcalls(self, request_id: str) -> list[SubCallRecord]:
        if _NUL in request_id:
            return []
        sql = select_subcalls_sql() + " WHERE request_id = $1 ORDER BY idx"
        return [subcall_from_row(row) for row in await self._require_pool().fetch(sql, request_id)]

    async def feedback_count(self) -> int:
        return int(await self._require_pool().fetchval("SELECT count(*) FROM feedback"))

    async def logged_requests(
        self, *, route: str | None = None, since: float | None = None, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        where, params = logged_filter("postgres", route, since, with_feedback=with_feedback)
        chosen = f"request_id IN (SELECT request_id FROM decisions{where})"
        # One repeatable-read transaction: the three reads see the same snapshot.
        async with self._require_pool().acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            decisions = await conn.fetch(select_decisions_sql() + where + " ORDER BY created_at, request_id", *params)
            conversations = await conn.fetch(select_conversations_sql() + " WHERE " + chosen, *params)
            feedback = await conn.fetch(
                select_feedback_sql() + " WHERE " + chosen + " ORDER BY metric, source, model", *params
            )
        return join_logged(decisions, conversations, feedback)

    async def count_without_feedback(self, *, route: str | None = None, since: float | None = None) -> int:
        where, params = logged_filter("postgres", route, since)
        return int(await self._require_pool().fetchval(without_feedback_sql(where), *params))

    async def traffic(self, since: float, bucket_seconds: float) -> TrafficWindow:
        """Served decisions since ``since``, aggregated per ``bucket_seconds`` (one snapshot)."""
        if bucket_seconds <= 0:
            raise ValueError("bucket_seconds must be positive")
        async with self._require_pool().acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            buckets = await conn.fetch(tsql.buckets_sql("postgres"), float(since), float(bucket_seconds))
            latency = await conn.fetch(tsql.latency_sql("postgres"), float(since), float(bucket_seconds))
        return tsql.window_from_rows(since, bucket_seconds, buckets, latency)

    # --- experiments -----------------------------------------------------------------------------

    async def register_experiment(self, name: str, route: str, spec: dict[str, Any]) -> None:
        """Register (or replace) an experiment's route and normalised spec."""
        await self._require_pool().execute(
            xsql.upsert_experiment_sql("postgres"), name, route, encode_json(spec, strip_nul=True), time.time()
        )

    async def fetch_experiment(self, name: str) -> ExperimentRow | None:
        row = await self._require_pool().fetchrow(xsql.select_experiments_sql("postgres", by_name=True), name)
        return xsql.experiment_from_row(row) if row is not None else None

    async def list_experiments(self) -> list[ExperimentRow]:
        rows = await self._require_pool().fetch(xsql.select_experiments_sql("postgres", by_name=False))
        return [xsql.experiment_from_row(row) for row in rows]

    async def stop_arm(
        self, experiment: str, arm: str, reason: str, detail: dict[str, Any], replica: str | None, at: float
    ) -> bool:
        """Store an arm's stop; False when it was already stopped (the first stop is kept)."""
        status = await self._require_pool().execute(
            xsql.insert_stop_sql("postgres"), experiment, arm, reason, encode_json(detail, strip_nul=True), at,
            replica,
        )
        return int(status.rsplit(" ", 1)[-1]) > 0  # "INSERT 0 <n>"

    async def resume_arm(self, experiment: str, arm: str) -> bool:
        """Remove an arm's stop; False when it was not stopped."""
        status = await self._require_pool().execute(xsql.delete_stop_sql("postgres"), experiment, arm)
        return int(status.rsplit(" ", 1)[-1]) > 0

    async def experiment_stops(self, experiment: str | None = None) -> list[ArmStop]:
        sql = xsql.select_stops_sql("postgres", by_experiment=experiment is not None)
        rows = await self._require_pool().fetch(sql, *(() if experiment is None else (experiment,)))
        return [xsql.stop_from_row(row) for row in rows]

    async def experiment_totals(self, experiment: str, since: float | None = None) -> dict[str, ArmTotals]:
        sql = xsql.totals_sql("postgres", since=since is not None)
        rows = await self._require_pool().fetch(sql, *((experiment,) if since is None else (experiment, since)))
        return {totals.arm: totals for totals in map(xsql.totals_from_row, rows)}

    async def experiment_outcomes(
        self, experiment: str, metric: str, since: float | None = None
    ) -> dict[str, ArmOutcomes]:
        sql = xsql.outcomes_sql("postgres", metric, since=since is not None)
        params = (experiment, metric) if since is None else (experiment, metric, since)
        rows = await self._require_pool().fetch(sql, *params)
        return {outcomes.arm: outcomes for outcomes in map(xsql.outcomes_from_row, rows)}

    async def experiment_latencies(self, experiment: str, since: float) -> dict[str, list[float]]:
        rows = await self._require_pool().fetch(xsql.latencies_sql("postgres"), experiment, since)
        return xsql.latencies_from_rows(rows)

    async def get_assignment(self, experiment: str, key_hash: str) -> tuple[str, float | None] | None:
        row = await self._require_pool().fetchrow(xsql.select_assignment_sql("postgres"), experiment, key_hash)
        return (str(row["arm"]), row["propensity"]) if row is not None else None

    async def put_assignment(
        self, experiment: str, key_hash: str, arm: str, propensity: float | None, at: float
    ) -> tuple[str, float | None]:
        """Assign a key unless it already is; returns the stored assignment (first writer wins)."""
        async with self._require_pool().acquire() as conn, conn.transaction():
            await conn.execute(xsql.insert_assignment_sql("postgres"), experiment, key_hash, arm, propensity, at)
            row = await conn.fetchrow(xsql.select_assignment_sql("postgres"), experiment, key_hash)
        assert row is not None  # inserted or already there, in this transaction
        return str(row["arm"]), row["propensity"]

    async def experiment_requests(
        self, experiment: str, since: float | None = None, *, with_feedback: bool = False
    ) -> list[LoggedRequest]:
        """Every decision row of ``experiment`` (served and shadow), oldest first, each with its
        feedback (conversations are not loaded); with ``with_feedback``, only the rows that have some.
        Each row's signals, reason and error message are read empty (:data:`store.schema.EXPERIMENT_UNREAD`):
        no experiment read uses them and they are most of a row."""
        where, extra = xsql.experiment_filter("postgres", since, with_feedback=with_feedback)
        params = [experiment, *extra]
        chosen = f"request_id IN (SELECT request_id FROM decisions{where})"
        async with self._require_pool().acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            decisions = await conn.fetch(
                select_decisions_sql(EXPERIMENT_UNREAD) + where + " ORDER BY created_at, request_id", *params
            )
            feedback = await conn.fetch(
                select_feedback_sql() + " WHERE " + chosen + " ORDER BY metric, source, model", *params
            )
        # Decoded off the event loop: a large experiment's rows took seconds of it.
        return await asyncio.to_thread(join_logged, decisions, [], feedback)
