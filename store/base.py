"""The decision-store interface and the row encoding every implementation shares."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from store.records import COLUMNS, JSON_COLUMNS, DecisionRecord
from store.schema import COLUMN_KINDS

logger = logging.getLogger(__name__)

_ZERO: dict[str, Any] = {"str": "", "float": 0.0, "int": 0, "bool": False}


@runtime_checkable
class DecisionStore(Protocol):
    """Where decision records are persisted.

    Writers call :meth:`write_batch` from one background task (see ``DecisionRecorder``); the read
    methods serve evals and tests. ``open`` and ``close`` are idempotent. ``write_batch`` is
    idempotent per request id: a record whose ``request_id`` is already stored is ignored, so a
    batch retried after an ambiguous failure never duplicates rows.
    """

    async def open(self) -> None:
        """Connect and create or migrate the schema."""
        ...

    async def write_batch(self, records: Sequence[DecisionRecord]) -> None:
        """Persist ``records`` in one transaction: all of them, or none (and raise)."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...

    async def fetch(self, request_id: str) -> DecisionRecord | None:
        """The record with this request id, or None."""
        ...

    async def recent(self, limit: int = 100) -> list[DecisionRecord]:
        """Up to ``limit`` records, newest ``created_at`` first."""
        ...

    async def count(self) -> int:
        """How many decision records are stored."""
        ...


def json_safe(value: Any, *, strip_nul: bool = False) -> Any:
    """A copy of ``value`` that every JSON column accepts.

    Signals come from classifiers and may hold tuples, numpy scalars, NaN or non-string keys; a record
    the database rejects would be retried for ever, so anything unusual is coerced here instead:
    NaN/inf -> None, tuples/sets -> lists, unknown objects -> ``str()``. PostgreSQL's jsonb and text
    refuse U+0000, so ``strip_nul`` removes it.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "") if strip_nul else value
    if isinstance(value, Mapping):
        return {
            json_safe(str(k), strip_nul=strip_nul): json_safe(v, strip_nul=strip_nul)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, strip_nul=strip_nul) for v in value]
    # numpy scalars and friends expose item(); fall back to their text.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return json_safe(item(), strip_nul=strip_nul)
        except (TypeError, ValueError):
            pass
    return json_safe(str(value), strip_nul=strip_nul)


def encode_json(value: Any, *, strip_nul: bool = False) -> str:
    """JSON text for a JSON column (compact, UTF-8 kept as is)."""
    return json.dumps(json_safe(value, strip_nul=strip_nul), ensure_ascii=False, separators=(",", ":"))


def decode_json(value: Any) -> dict[str, Any]:
    """A JSON column's value back as a dict (drivers hand back text or an already decoded object)."""
    if value is None:
        return {}
    if isinstance(value, str | bytes | bytearray):
        value = json.loads(value)
    return dict(value)


def _coerce(name: str, kind: str, nullable: bool, value: Any, strip_nul: bool) -> Any:
    if kind == "json":
        return encode_json(value if value is not None else {}, strip_nul=strip_nul)
    if value is None:
        return None if nullable else _ZERO[kind]
    try:
        if kind == "str":
            text = value if isinstance(value, str) else str(value)
            return text.replace("\x00", "") if strip_nul else text
        if kind == "bool":
            return bool(value)
        if kind == "int":
            return value if type(value) is int else int(value)
        return value if type(value) is float else float(value)
    except (TypeError, ValueError, OverflowError):
        # A row the database refuses would block the write queue; lose the field, keep the row.
        logger.warning("decision record field %s has an unusable %s value; stored as empty", name, kind)
        return None if nullable else _ZERO[kind]


def encode_row(record: DecisionRecord, *, strip_nul: bool = False) -> tuple[Any, ...]:
    """The record's column values in COLUMNS order, as the database expects them.

    Values are coerced to the column's type (JSON columns become JSON text) so that no record can be
    refused by a strictly typed driver such as asyncpg and then retried for ever.
    """
    return tuple(_coerce(name, *COLUMN_KINDS[name], getattr(record, name), strip_nul) for name in COLUMNS)


class RowLike(Protocol):
    """A database row addressable by column name (sqlite3.Row, asyncpg.Record, dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def record_from_row(row: RowLike) -> DecisionRecord:
    """Build a record from a row keyed by column name."""
    values: dict[str, Any] = {}
    for name in COLUMNS:
        value = row[name]
        if name in JSON_COLUMNS:
            value = decode_json(value)
        elif COLUMN_KINDS[name][0] == "bool" and value is not None:
            value = bool(value)
        values[name] = value
    return DecisionRecord(**values)
