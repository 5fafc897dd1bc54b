"""DDL and SQL text for the store's tables, in the SQLite and PostgreSQL dialects.

Migrations are numbered steps, oldest first, applied once each and recorded in ``schema_version``
(``migrate()`` runs on every start). A released step is literal SQL and is never edited or derived
from the current code again: a database written by an older release must be upgraded by the same
statements whatever the dataclasses look like today. New columns and tables arrive as new steps.

The ``decisions`` columns after the last step must equal the columns of
:class:`store.records.DecisionRecord` (``COLUMNS``): :data:`COLUMN_KINDS` is derived from the record
for encoding rows, and a test checks that a freshly migrated database has exactly those columns. Both
dialects keep one shape: timestamps are unix seconds as floating point, JSON columns hold objects
(TEXT in SQLite, jsonb in PostgreSQL), embeddings are bytes (BLOB / bytea).
"""

from __future__ import annotations

import logging
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from store.records import COLUMNS, JSON_COLUMNS, DecisionRecord

Dialect = Literal["sqlite", "postgres"]

logger = logging.getLogger(__name__)

#: The newest schema version this code writes.
SCHEMA_VERSION = 7

DECISIONS_TABLE = "decisions"
FEEDBACK_TABLE = "feedback"
CONVERSATIONS_TABLE = "conversations"
SUBCALLS_TABLE = "subcalls"
EXPERIMENTS_TABLE = "experiments"
ARM_STOPS_TABLE = "experiment_stops"
ASSIGNMENTS_TABLE = "experiment_assignments"
VERSION_TABLE = "schema_version"
FORGOTTEN_TENANTS_TABLE = "forgotten_tenants"
FORGOTTEN_REQUESTS_TABLE = "forgotten_requests"

#: Columns of ``decisions`` that get an index (what evals and dashboards filter on).
INDEXED_COLUMNS: tuple[str, ...] = ("created_at", "route", "model", "tenant")

#: The key a piece of feedback is unique on: a repeat replaces, never adds.
FEEDBACK_KEY: tuple[str, ...] = ("request_id", "metric", "source", "model")
#: Columns written for a piece of feedback (``id`` is assigned by the database).
FEEDBACK_COLUMNS: tuple[str, ...] = (
    "request_id", "created_at", "score", "label", "comment", "metadata", "metric", "source", "model", "tenant",
)
CONVERSATION_COLUMNS: tuple[str, ...] = (
    "request_id", "created_at", "tenant", "encoder_id", "embedding", "text", "expires_at",
)
#: Columns of a workflow's sub-call row (``idx`` holds :attr:`SubCallRecord.index`: ``index`` is an
#: SQL keyword). The key is (request_id, idx).
SUBCALL_COLUMNS: tuple[str, ...] = (
    "request_id", "idx", "workflow", "step", "model", "backend", "status", "prompt_tokens", "completion_tokens",
    "cost_usd", "latency_ms", "confidence", "outcome", "error", "created_at", "tenant",
)

_SQL_TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {"str": "TEXT", "float": "REAL", "int": "INTEGER", "bool": "INTEGER", "json": "TEXT"},
    "postgres": {
        "str": "text",
        "float": "double precision",
        "int": "bigint",
        "bool": "boolean",
        "json": "jsonb",
    },
}


def _column_kind(name: str, annotation: Any) -> tuple[str, bool]:
    """Map a record field's annotation to (type kind, nullable)."""
    nullable = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(members) < len(typing.get_args(annotation))
        if len(members) != 1:
            raise TypeError(f"DecisionRecord.{name}: unsupported union type {annotation!r}")
        annotation = members[0]
    if name in JSON_COLUMNS:
        return "json", nullable
    # bool first: bool is a subclass of int and must not become an integer column in PostgreSQL.
    for python_type in (bool, int, float, str):
        if annotation is python_type:
            return python_type.__name__, nullable
    raise TypeError(f"DecisionRecord.{name}: no SQL type for {annotation!r}")


def _column_kinds() -> dict[str, tuple[str, bool]]:
    hints = typing.get_type_hints(DecisionRecord)
    return {name: _column_kind(name, hints[name]) for name in COLUMNS}


#: Column name -> (kind, nullable); kind is one of "str", "float", "int", "bool", "json".
COLUMN_KINDS: dict[str, tuple[str, bool]] = _column_kinds()


def column_types(dialect: Dialect) -> dict[str, str]:
    """Column name -> SQL type declaration (with NOT NULL where the record field is not optional)."""
    out: dict[str, str] = {}
    for name, (kind, nullable) in COLUMN_KINDS.items():
        sql_type = _SQL_TYPES[dialect][kind]
        out[name] = sql_type if nullable else f"{sql_type} NOT NULL"
    return out


# --- step 1 (released): the first schema, frozen as it was created ------------------------------

_STEP1_SQLITE: tuple[str, ...] = (
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
)

_STEP1_POSTGRES: tuple[str, ...] = (
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
)

# --- step 2: feedback keyed per (request, metric, source, model), conversations, router version --


def _step2(dialect: Dialect) -> list[str]:
    """Alter a step-1 database: new ``decisions`` columns, the feedback key (duplicates from before
    it existed are collapsed to the newest row first), the feedback tenant (copied from the
    decision, so ``forget`` finds old rows), and the ``conversations`` table."""
    if dialect == "sqlite":
        # SQLite has no ADD COLUMN IF NOT EXISTS; the step runs once, inside the migration lock.
        add, text, real, blob = "ADD COLUMN", "TEXT", "REAL", "BLOB"
    else:
        add, text, real, blob = "ADD COLUMN IF NOT EXISTS", "text", "double precision", "bytea"
    key = ", ".join(FEEDBACK_KEY)
    return [
        f"ALTER TABLE decisions {add} router_version {text}",
        f"ALTER TABLE decisions {add} propensity {real}",
        f"ALTER TABLE feedback {add} metric {text} NOT NULL DEFAULT 'quality'",
        f"ALTER TABLE feedback {add} source {text} NOT NULL DEFAULT 'user'",
        f"ALTER TABLE feedback {add} model {text} NOT NULL DEFAULT ''",
        f"ALTER TABLE feedback {add} tenant {text}",
        f"DELETE FROM feedback WHERE id NOT IN (SELECT max(id) FROM feedback GROUP BY {key})",
        "UPDATE feedback SET tenant = (SELECT d.tenant FROM decisions d WHERE d.request_id = feedback.request_id) "
        "WHERE tenant IS NULL",
        # The unique index leads with request_id, so it serves lookups by request id as well.
        "DROP INDEX IF EXISTS idx_feedback_request_id",
        f"CREATE UNIQUE INDEX IF NOT EXISTS uq_feedback_key ON feedback ({key})",
        "CREATE INDEX IF NOT EXISTS idx_feedback_tenant ON feedback (tenant)",
        "CREATE TABLE IF NOT EXISTS conversations (\n"
        f"    request_id {text} NOT NULL PRIMARY KEY,\n"
        f"    created_at {real} NOT NULL,\n"
        f"    tenant {text},\n"
        f"    encoder_id {text},\n"
        f"    embedding {blob},\n"
        f"    text {text},\n"
        f"    expires_at {real}\n"
        ")",
        "CREATE INDEX IF NOT EXISTS idx_conversations_tenant ON conversations (tenant)",
        "CREATE INDEX IF NOT EXISTS idx_conversations_expires_at ON conversations (expires_at)",
    ]


# --- step 3: workflows (the decision's sub-call tree, and one row per sub-call) --------------------


def _step3(dialect: Dialect) -> list[str]:
    """Alter a step-2 database: the ``workflow`` JSON column on ``decisions`` (NULL for requests a
    single model answered) and the ``subcalls`` table."""
    if dialect == "sqlite":
        add, text, real, integer, json = "ADD COLUMN", "TEXT", "REAL", "INTEGER", "TEXT"
    else:
        add, text, real, integer, json = "ADD COLUMN IF NOT EXISTS", "text", "double precision", "bigint", "jsonb"
    return [
        f"ALTER TABLE decisions {add} workflow {json}",
        "CREATE TABLE IF NOT EXISTS subcalls (\n"
        f"    request_id {text} NOT NULL,\n"
        f"    idx {integer} NOT NULL,\n"
        f"    workflow {text} NOT NULL,\n"
        f"    step {text} NOT NULL,\n"
        f"    model {text},\n"
        f"    backend {text},\n"
        f"    status {integer},\n"
        f"    prompt_tokens {integer},\n"
        f"    completion_tokens {integer},\n"
        f"    cost_usd {real},\n"
        f"    latency_ms {real},\n"
        f"    confidence {real},\n"
        f"    outcome {text} NOT NULL,\n"
        f"    error {text},\n"
        f"    created_at {real} NOT NULL,\n"
        f"    tenant {text},\n"
        "    PRIMARY KEY (request_id, idx)\n"
        ")",
        "CREATE INDEX IF NOT EXISTS idx_subcalls_created_at ON subcalls (created_at)",
        "CREATE INDEX IF NOT EXISTS idx_subcalls_model ON subcalls (model)",
        "CREATE INDEX IF NOT EXISTS idx_subcalls_tenant ON subcalls (tenant)",
    ]


# --- step 4: experiments (arms on decisions, shadow rows, registered experiments, stops, assignments)


def _step4(dialect: Dialect) -> list[str]:
    """Alter a step-3 database: the experiment columns on ``decisions`` and the experiments, arm
    stops and sticky assignments tables."""
    if dialect == "sqlite":
        add, text, real, json, boolean = "ADD COLUMN", "TEXT", "REAL", "TEXT", "INTEGER NOT NULL DEFAULT 0"
    else:
        add, text, real, json, boolean = (
            "ADD COLUMN IF NOT EXISTS", "text", "double precision", "jsonb", "boolean NOT NULL DEFAULT false"
        )
    return [
        f"ALTER TABLE decisions {add} experiment {text}",
        f"ALTER TABLE decisions {add} shadow_of {text}",
        f"ALTER TABLE decisions {add} arm_propensity {real}",
        f"ALTER TABLE decisions {add} compared {boolean}",
        "CREATE INDEX IF NOT EXISTS idx_decisions_experiment ON decisions (experiment, created_at)",
        f"CREATE TABLE IF NOT EXISTS {EXPERIMENTS_TABLE} (\n"
        f"    name {text} PRIMARY KEY,\n"
        f"    route {text} NOT NULL,\n"
        f"    spec {json} NOT NULL,\n"
        f"    updated_at {real} NOT NULL\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ARM_STOPS_TABLE} (\n"
        f"    experiment {text} NOT NULL,\n"
        f"    arm {text} NOT NULL,\n"
        f"    reason {text} NOT NULL,\n"
        f"    detail {json} NOT NULL,\n"
        f"    stopped_at {real} NOT NULL,\n"
        f"    replica {text},\n"
        "    PRIMARY KEY (experiment, arm)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ASSIGNMENTS_TABLE} (\n"
        f"    experiment {text} NOT NULL,\n"
        f"    key_hash {text} NOT NULL,\n"
        f"    arm {text} NOT NULL,\n"
        f"    propensity {real},\n"
        f"    assigned_at {real} NOT NULL,\n"
        "    PRIMARY KEY (experiment, key_hash)\n"
        ")",
    ]


# --- step 5: observability (the OpenTelemetry trace id on decisions) -------------------------------


def _step5(dialect: Dialect) -> list[str]:
    """Alter a step-4 database: the ``trace_id`` column on ``decisions`` (NULL when tracing was off)."""
    if dialect == "sqlite":
        return ["ALTER TABLE decisions ADD COLUMN trace_id TEXT"]
    return ["ALTER TABLE decisions ADD COLUMN IF NOT EXISTS trace_id text"]


# --- step 6: forgetting one request finds its experiment shadows by index ----------------------------


#: Index ``decisions.shadow_of``, which ``forget --request-id`` looks a request's shadows up by (once per
#: table it deletes from). Without it each lookup scanned every decision under the write lock: 1.1 s at
#: 500 000 decisions on SQLite, during which a gateway writing to the file waited. Partial (shadow rows
#: only), so a served decision, which has no ``shadow_of``, costs no index write, and the ``shadow_of IS
#: NULL`` filters of the traffic and experiment reads never pick it. One statement for both dialects:
#: ``shadow_of = x`` implies ``shadow_of IS NOT NULL`` to both planners.
_STEP6: tuple[str, ...] = (
    "CREATE INDEX IF NOT EXISTS idx_decisions_shadow_of ON decisions (shadow_of) WHERE shadow_of IS NOT NULL",
)


# --- step 7: tombstones, so what a running gateway still holds of a forgotten request is not written after it --


def _step7(dialect: Dialect) -> list[str]:
    """Add the tombstone tables ``pointsman forget`` writes in the transaction that deletes: a tenant's, with
    the time of the forget (it covers the requests issued up to then), and a request id's (with its shadows'
    ids). The writers' statements skip the rows a tombstone covers (:func:`covered_sql`)."""
    text, real = ("TEXT", "REAL") if dialect == "sqlite" else ("text", "double precision")
    return [
        f"CREATE TABLE IF NOT EXISTS {FORGOTTEN_TENANTS_TABLE} (\n"
        f"    tenant {text} NOT NULL PRIMARY KEY,\n"
        f"    forgotten_at {real} NOT NULL\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {FORGOTTEN_REQUESTS_TABLE} (\n"
        f"    request_id {text} NOT NULL PRIMARY KEY,\n"
        f"    forgotten_at {real} NOT NULL\n"
        ")",
    ]


def note_newer_schema(found: int, where: str) -> None:
    """Warn when the database was migrated by a newer release than this code (``found`` > SCHEMA_VERSION).

    Serving goes on (steps only add tables and columns, and during a rolling upgrade older replicas
    keep writing to a database the first new one migrated), but the operator should know: what the
    newer steps added is neither written nor read by this release.
    """
    if found > SCHEMA_VERSION:
        logger.warning(
            "the decision store %s has schema version %d, newer than this release's %d: it was migrated by a "
            "newer pointsman; continuing with the tables this release knows",
            where, found, SCHEMA_VERSION,
        )


def version_table_ddl(dialect: Dialect) -> str:
    """CREATE statement for the table recording which migration steps have run."""
    t = _SQL_TYPES[dialect]
    return (
        f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (\n"
        f"    version {t['int']} PRIMARY KEY,\n"
        f"    applied_at {t['float']} NOT NULL\n"
        ")"
    )


def migrations(dialect: Dialect) -> list[tuple[int, list[str]]]:
    """Numbered migration steps, oldest first. Append new steps; never edit a released one."""
    step1 = _STEP1_SQLITE if dialect == "sqlite" else _STEP1_POSTGRES
    return [(1, list(step1)), (2, _step2(dialect)), (3, _step3(dialect)), (4, _step4(dialect)),
            (5, _step5(dialect)), (6, list(_STEP6)), (7, _step7(dialect))]


# --- statements the stores run -------------------------------------------------------------------


def _placeholders(dialect: Dialect, n: int) -> str:
    return ", ".join("?" for _ in range(n)) if dialect == "sqlite" else ", ".join(f"${i}" for i in range(1, n + 1))


def _mark(dialect: Dialect, n: int) -> str:
    """The ``n``-th (1-based) parameter, numbered: the guarded statements use some of them twice."""
    return f"?{n}" if dialect == "sqlite" else f"${n}"


def _typed_marks(dialect: Dialect, types: Sequence[str]) -> str:
    """Numbered parameters for an INSERT ... SELECT, one per column type. PostgreSQL reads an untyped
    parameter in a SELECT list as text, so each is cast to its column's type there."""
    if dialect == "sqlite":
        return ", ".join(f"?{n}" for n in range(1, len(types) + 1))
    return ", ".join(f"${n}::{t}" for n, t in enumerate(types, start=1))


def covered_sql(dialect: Dialect, request_ids: Sequence[int], tenant: int, issued_at: str) -> str:
    """A condition, true when a tombstone covers a row: one of the parameters numbered ``request_ids`` (the
    row's id, the decision it shadows) was forgotten, or its tenant (parameter ``tenant``) was forgotten at
    or after ``issued_at`` (an SQL expression: when the request was issued). A NULL id or tenant matches
    nothing. Both lookups are primary-key probes of small tables, inside the writer's own statement."""
    ids = ", ".join(_mark(dialect, n) for n in request_ids)
    return (
        f"EXISTS (SELECT 1 FROM {FORGOTTEN_REQUESTS_TABLE} WHERE request_id IN ({ids})) OR "
        f"EXISTS (SELECT 1 FROM {FORGOTTEN_TENANTS_TABLE} WHERE tenant = {_mark(dialect, tenant)} "
        f"AND forgotten_at >= {issued_at})"
    )


def _guarded_insert(dialect: Dialect, table: str, columns: Sequence[str], types: Sequence[str], covered: str) -> str:
    """INSERT of one row of ``columns`` (parameters 1 to n; ``types`` are their PostgreSQL types) unless
    ``covered``: one statement, so the tombstone check costs the batch no round trip."""
    marks = _typed_marks(dialect, types[: len(columns)])
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {marks} WHERE NOT ({covered})"


def _pg_type(kind_type: str) -> str:
    return kind_type.removesuffix(" NOT NULL")


def insert_decisions_sql(dialect: Dialect) -> str:
    """INSERT for one decision row (parameters in COLUMNS order); a request id already stored is ignored, so
    a retried batch never duplicates or overwrites a row, and a row a tombstone covers (its id or the id it
    shadows forgotten, or its tenant forgotten since its ``created_at``) is not written."""
    types = [_pg_type(t) for t in column_types("postgres").values()]
    index = {name: n for n, name in enumerate(COLUMNS, start=1)}
    covered = covered_sql(dialect, (index["request_id"], index["shadow_of"]), index["tenant"],
                          _mark(dialect, index["created_at"]))
    return _guarded_insert(dialect, DECISIONS_TABLE, COLUMNS, types, covered) + " ON CONFLICT (request_id) DO NOTHING"


#: Columns an experiment read leaves unread (read back empty): no A/B report or arm allocation uses them,
#: and the signals are most of a decision's size (their JSON decoded, several KB a row in memory).
EXPERIMENT_UNREAD: dict[str, str] = {"signals": "NULL", "reason": "''", "error_message": "NULL"}


def select_decisions_sql(unread: Mapping[str, str] | None = None) -> str:
    """SELECT of every decision column, in COLUMNS order (append WHERE / ORDER BY); a column of
    ``unread`` (name -> SQL literal, e.g. :data:`EXPERIMENT_UNREAD`) is read as that literal instead."""
    unread = unread or {}
    columns = (f"{unread[c]} AS {c}" if c in unread else c for c in COLUMNS)
    return f"SELECT {', '.join(columns)} FROM {DECISIONS_TABLE}"


#: PostgreSQL types of FEEDBACK_COLUMNS, then of the one parameter that is no column: when the request was issued.
_FEEDBACK_TYPES: tuple[str, ...] = (
    "text", "double precision", "double precision", "text", "text", "jsonb", "text", "text", "text", "text",
    "double precision",
)


def upsert_feedback_sql(dialect: Dialect) -> str:
    """INSERT for one piece of feedback: FEEDBACK_COLUMNS, then when its request was issued (NULL: unknown).
    An existing row with the same (request_id, metric, source, model) is replaced in place, so a repeat never
    adds a row; a row a tombstone covers is not written. A request issued at an unknown time counts as issued
    when its decision was (stored), else when the feedback was made."""
    names = list(FEEDBACK_COLUMNS)
    updates = ", ".join(f"{c} = excluded.{c}" for c in FEEDBACK_COLUMNS if c not in FEEDBACK_KEY)
    # Typed where PostgreSQL cannot infer a parameter's type from the expression around it.
    cast = (lambda n, t: _mark(dialect, n)) if dialect == "sqlite" else (lambda n, t: f"{_mark(dialect, n)}::{t}")
    issued_at = (
        f"coalesce({cast(len(names) + 1, 'double precision')}, (SELECT d.created_at FROM {DECISIONS_TABLE} d "
        f"WHERE d.request_id = {cast(1, 'text')}), {cast(2, 'double precision')})"
    )
    covered = covered_sql(dialect, (1,), names.index("tenant") + 1, issued_at)
    return (
        _guarded_insert(dialect, FEEDBACK_TABLE, FEEDBACK_COLUMNS, _FEEDBACK_TYPES, covered)
        + f" ON CONFLICT ({', '.join(FEEDBACK_KEY)}) DO UPDATE SET {updates}"
    )


def feedback_covered_sql(dialect: Dialect) -> str:
    """SELECT of whether a tombstone covers a piece of feedback: parameters request_id, tenant, when its
    request was issued (NULL: unknown) and ``created_at``, read as :func:`upsert_feedback_sql` reads them.
    Asked only when a feedback batch wrote fewer rows than it held, to tell which were skipped."""
    cast = (lambda n, t: _mark(dialect, n)) if dialect == "sqlite" else (lambda n, t: f"{_mark(dialect, n)}::{t}")
    issued_at = (
        f"coalesce({cast(3, 'double precision')}, (SELECT d.created_at FROM {DECISIONS_TABLE} d "
        f"WHERE d.request_id = {cast(1, 'text')}), {cast(4, 'double precision')})"
    )
    return f"SELECT {covered_sql(dialect, (1,), 2, issued_at)}"


def tombstone_sql(dialect: Dialect, *, by_tenant: bool) -> str:
    """INSERT of the tombstone a forget writes before its deletes (SQLite: in the first deleting
    transaction; PostgreSQL: in a transaction of its own, under the table lock); parameters: the tenant or
    request id, and the time of the forget.

    A tenant's is its latest forget's time. A request's covers its experiment shadows too (their decisions
    are found by ``shadow_of``, so run it before the deletes; a shadow not yet written is covered through
    its ``shadow_of``)."""
    one, two = _mark(dialect, 1), _mark(dialect, 2)
    if dialect == "postgres":
        one, two = f"{one}::text", f"{two}::double precision"
    if by_tenant:
        return (
            f"INSERT INTO {FORGOTTEN_TENANTS_TABLE} (tenant, forgotten_at) VALUES ({one}, {two}) "
            "ON CONFLICT (tenant) DO UPDATE SET forgotten_at = excluded.forgotten_at"
        )
    return (
        f"INSERT INTO {FORGOTTEN_REQUESTS_TABLE} (request_id, forgotten_at) SELECT {one}, {two} "
        f"UNION SELECT request_id, {two} FROM {DECISIONS_TABLE} WHERE shadow_of = {one} "
        "ON CONFLICT (request_id) DO NOTHING"
    )


def select_feedback_sql() -> str:
    """SELECT of every feedback column but ``id`` (append WHERE / ORDER BY)."""
    return f"SELECT {', '.join(FEEDBACK_COLUMNS)} FROM {FEEDBACK_TABLE}"


_CONVERSATION_TYPES: tuple[str, ...] = (
    "text", "double precision", "text", "text", "bytea", "text", "double precision",
)
_SUBCALL_TYPES: tuple[str, ...] = (
    "text", "bigint", "text", "text", "text", "text", "bigint", "bigint", "bigint", "double precision",
    "double precision", "double precision", "text", "text", "double precision", "text",
)


def _child_covered(dialect: Dialect, columns: Sequence[str]) -> str:
    """:func:`covered_sql` for a row hanging off a decision, given as its columns followed by two parameters
    of its decision: the id it shadows and its ``created_at``."""
    n = len(columns)
    return covered_sql(dialect, (1, n + 1), columns.index("tenant") + 1, _mark(dialect, n + 2))


def insert_conversation_sql(dialect: Dialect) -> str:
    """INSERT for one conversation: CONVERSATION_COLUMNS, then its decision's ``shadow_of`` and ``created_at``;
    an existing one is kept, one a tombstone covers is not written."""
    types = (*_CONVERSATION_TYPES, "text", "double precision")
    covered = _child_covered(dialect, CONVERSATION_COLUMNS)
    return (_guarded_insert(dialect, CONVERSATIONS_TABLE, CONVERSATION_COLUMNS, types, covered)
            + " ON CONFLICT (request_id) DO NOTHING")


def insert_subcalls_sql(dialect: Dialect) -> str:
    """INSERT for one sub-call: SUBCALL_COLUMNS, then its decision's ``shadow_of`` and ``created_at``; one
    already stored is kept (a retried batch never duplicates), one a tombstone covers is not written."""
    types = (*_SUBCALL_TYPES, "text", "double precision")
    covered = _child_covered(dialect, SUBCALL_COLUMNS)
    return (_guarded_insert(dialect, SUBCALLS_TABLE, SUBCALL_COLUMNS, types, covered)
            + " ON CONFLICT (request_id, idx) DO NOTHING")


def select_subcalls_sql() -> str:
    """SELECT of every sub-call column (append WHERE / ORDER BY)."""
    return f"SELECT {', '.join(SUBCALL_COLUMNS)} FROM {SUBCALLS_TABLE}"


def select_conversations_sql() -> str:
    """SELECT of every conversation column (append WHERE / ORDER BY)."""
    return f"SELECT {', '.join(CONVERSATION_COLUMNS)} FROM {CONVERSATIONS_TABLE}"


def logged_filter(
    dialect: Dialect, route: str | None, since: float | None, *, with_feedback: bool = False
) -> tuple[str, list[Any]]:
    """A WHERE clause over ``decisions`` for :meth:`logged_requests` and its parameters; with
    ``with_feedback``, only decisions that have feedback (of any metric, source or model)."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, op, value in (("route", "=", route), ("created_at", ">=", since)):
        if value is None:
            continue
        params.append(value)
        mark = "?" if dialect == "sqlite" else f"${len(params)}"
        clauses.append(f"{column} {op} {mark}")
    if with_feedback:
        # The unique feedback key starts with request_id: an index probe per decision, no scan of feedback.
        clauses.append(f"request_id IN (SELECT request_id FROM {FEEDBACK_TABLE})")
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def without_feedback_sql(where: str) -> str:
    """Count the decisions :func:`logged_filter` (without ``with_feedback``) selects that have no feedback."""
    condition = f"NOT EXISTS (SELECT 1 FROM {FEEDBACK_TABLE} f WHERE f.request_id = {DECISIONS_TABLE}.request_id)"
    return f"SELECT count(*) FROM {DECISIONS_TABLE}" + (f"{where} AND {condition}" if where else f" WHERE {condition}")


#: What :meth:`DecisionStore.forget` reports, per table.
FORGET_TABLES: tuple[str, ...] = (DECISIONS_TABLE, FEEDBACK_TABLE, CONVERSATIONS_TABLE, SUBCALLS_TABLE)


def forget_sql(dialect: Dialect, *, by_tenant: bool) -> list[tuple[str, str]]:
    """(table, DELETE) pairs that forget a tenant's or a request's data, children before decisions.

    Feedback, conversations and sub-calls are found by their own tenant column and through the
    decision they belong to (rows written before they carried a tenant, or judge feedback recorded
    without one). A request's data includes its experiment shadows: their decisions
    (``<id>:shadow:<arm>``, ``shadow_of`` = the id) and whatever hangs off them. A tenant's shadows
    carry the tenant, so the tenant's statements find them already.
    """
    mark = "?1" if dialect == "sqlite" else "$1"  # numbered: the statements use it more than once
    if by_tenant:
        decision_where = f"tenant = {mark}"
        child_where = (
            f"tenant = {mark} OR request_id IN (SELECT request_id FROM {DECISIONS_TABLE} WHERE tenant = {mark})"
        )
    else:
        # Index lookups only (shadow_of is indexed since step 6), never a scan under the write lock. The
        # children's ids are one list, not "= id OR IN (shadows)": PostgreSQL reads that OR by scanning the
        # whole child table.
        decision_where = f"request_id = {mark} OR shadow_of = {mark}"
        child_where = (
            f"request_id IN (SELECT {mark} UNION ALL SELECT request_id FROM {DECISIONS_TABLE} WHERE shadow_of = {mark})"
        )
    return [
        (FEEDBACK_TABLE, f"DELETE FROM {FEEDBACK_TABLE} WHERE {child_where}"),
        (CONVERSATIONS_TABLE, f"DELETE FROM {CONVERSATIONS_TABLE} WHERE {child_where}"),
        (SUBCALLS_TABLE, f"DELETE FROM {SUBCALLS_TABLE} WHERE {child_where}"),
        (DECISIONS_TABLE, f"DELETE FROM {DECISIONS_TABLE} WHERE {decision_where}"),
    ]


def purge_text_sql(dialect: Dialect) -> str:
    """UPDATE that deletes the text of every conversation whose retention ended at or before now."""
    mark = "?" if dialect == "sqlite" else "$1"
    return (
        f"UPDATE {CONVERSATIONS_TABLE} SET text = NULL "
        f"WHERE text IS NOT NULL AND expires_at IS NOT NULL AND expires_at <= {mark}"
    )
