"""DDL and SQL text for the decision-log tables, in the SQLite and PostgreSQL dialects.

The ``decisions`` columns are derived from :class:`store.records.DecisionRecord` itself, so adding a
field to the record adds a column here and the two can never drift apart. Both dialects keep one
shape: timestamps are unix seconds as floating point, JSON columns hold objects (TEXT in SQLite,
jsonb in PostgreSQL).

Migrations are a list of numbered steps; every statement is idempotent (``IF NOT EXISTS``) and the
``schema_version`` table records which steps have run, so ``migrate()`` can be called on every start.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from store.records import COLUMNS, JSON_COLUMNS, DecisionRecord

Dialect = Literal["sqlite", "postgres"]

#: The newest schema version this code writes.
SCHEMA_VERSION = 1

DECISIONS_TABLE = "decisions"
FEEDBACK_TABLE = "feedback"
VERSION_TABLE = "schema_version"

#: Columns of ``decisions`` that get an index (what evals and dashboards filter on).
INDEXED_COLUMNS: tuple[str, ...] = ("created_at", "route", "model", "tenant")

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


def decisions_ddl(dialect: Dialect) -> list[str]:
    """CREATE TABLE and CREATE INDEX statements for ``decisions``."""
    cols = []
    for name, decl in column_types(dialect).items():
        suffix = " PRIMARY KEY" if name == "request_id" else ""
        cols.append(f"    {name} {decl}{suffix}")
    statements = [f"CREATE TABLE IF NOT EXISTS {DECISIONS_TABLE} (\n" + ",\n".join(cols) + "\n)"]
    for col in INDEXED_COLUMNS:
        statements.append(f"CREATE INDEX IF NOT EXISTS idx_{DECISIONS_TABLE}_{col} ON {DECISIONS_TABLE} ({col})")
    return statements


def feedback_ddl(dialect: Dialect) -> list[str]:
    """CREATE statements for ``feedback``.

    Feedback joins on ``request_id`` but has no foreign key: feedback may arrive before the batched
    decision record is flushed, and a request can receive several pieces of feedback.
    """
    t = _SQL_TYPES[dialect]
    ident = "INTEGER PRIMARY KEY AUTOINCREMENT" if dialect == "sqlite" else "bigserial PRIMARY KEY"
    table = (
        f"CREATE TABLE IF NOT EXISTS {FEEDBACK_TABLE} (\n"
        f"    id {ident},\n"
        f"    request_id {t['str']} NOT NULL,\n"
        f"    created_at {t['float']} NOT NULL,\n"
        f"    score {t['float']},\n"
        f"    label {t['str']},\n"
        f"    comment {t['str']},\n"
        f"    metadata {t['json']}\n"
        ")"
    )
    return [
        table,
        f"CREATE INDEX IF NOT EXISTS idx_{FEEDBACK_TABLE}_request_id ON {FEEDBACK_TABLE} (request_id)",
        f"CREATE INDEX IF NOT EXISTS idx_{FEEDBACK_TABLE}_created_at ON {FEEDBACK_TABLE} (created_at)",
    ]


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
    return [(1, [*decisions_ddl(dialect), *feedback_ddl(dialect)])]


def insert_decisions_sql(dialect: Dialect) -> str:
    """INSERT for one decision row; a request id already stored is ignored, so a retried batch
    never duplicates or overwrites a row."""
    names = ", ".join(COLUMNS)
    if dialect == "sqlite":
        placeholders = ", ".join("?" for _ in COLUMNS)
    else:
        placeholders = ", ".join(f"${i}" for i in range(1, len(COLUMNS) + 1))
    return f"INSERT INTO {DECISIONS_TABLE} ({names}) VALUES ({placeholders}) ON CONFLICT (request_id) DO NOTHING"


def select_decisions_sql() -> str:
    """SELECT of every decision column, in COLUMNS order (append WHERE / ORDER BY)."""
    return f"SELECT {', '.join(COLUMNS)} FROM {DECISIONS_TABLE}"
