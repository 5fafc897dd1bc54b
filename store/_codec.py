"""Row encoding shared by the SQL stores: DecisionRecord <-> column values.

Every value is coerced to its column's type on the way in. A row the database refuses would make
the recorder retry its batch for ever, so odd values (NaN in signals, numpy scalars, a float in an
integer column, U+0000 for PostgreSQL) are repaired here rather than refused there. The common case
(values already of the right type) takes a fast path: this runs once per request.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast

import orjson

from store.records import ConversationRecord, DecisionRecord, FeedbackRecord, LoggedRequest, SubCallRecord
from store.schema import COLUMN_KINDS

logger = logging.getLogger(__name__)

# orjson already writes NaN/inf as null and tuples as lists; these add int keys and numpy values.
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
_ZERO: dict[str, Any] = {"str": "", "float": 0.0, "int": 0, "bool": False}
_EXACT_TYPE: dict[str, type] = {"str": str, "float": float, "int": int, "bool": bool}
# (name, kind, nullable, exact python type or None for JSON) per column, in COLUMNS order.
_SPEC: tuple[tuple[str, str, bool, type | None], ...] = tuple(
    (name, kind, nullable, _EXACT_TYPE.get(kind)) for name, (kind, nullable) in COLUMN_KINDS.items()
)


class RowLike(Protocol):
    """A database row addressable by column name (sqlite3.Row, asyncpg.Record, dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def json_safe(value: Any, *, strip_nul: bool = False) -> Any:
    """A copy of ``value`` made only of JSON types: NaN/inf -> None, tuples/sets -> lists,
    keys -> str, numpy scalars -> Python numbers, other objects -> ``str()``; ``strip_nul`` removes
    U+0000, which PostgreSQL's jsonb and text refuse."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "") if strip_nul else value
    if isinstance(value, Mapping):
        return {json_safe(str(k), strip_nul=strip_nul): json_safe(v, strip_nul=strip_nul) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, strip_nul=strip_nul) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            return json_safe(item(), strip_nul=strip_nul)
        except (TypeError, ValueError):
            pass
    return json_safe(str(value), strip_nul=strip_nul)


def _orjson_default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return list(value)
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


def encode_json(value: Any, *, strip_nul: bool = False) -> str:
    """Compact JSON text for a JSON column; never raises for odd values (see :func:`json_safe`)."""
    try:
        text = orjson.dumps(value, default=_orjson_default, option=_ORJSON_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError: huge ints, odd keys, deep nesting
        return json.dumps(json_safe(value, strip_nul=strip_nul), ensure_ascii=False, separators=(",", ":"))
    if strip_nul and "\\u0000" in text:
        return json.dumps(json_safe(value, strip_nul=True), ensure_ascii=False, separators=(",", ":"))
    return text


def decode_json(value: Any) -> dict[str, Any]:
    """A JSON column's value back as a dict (drivers hand back text or an already decoded object)."""
    if value is None:
        return {}
    if isinstance(value, str | bytes | bytearray):
        value = orjson.loads(value)
    return dict(value)


def _coerce(name: str, kind: str, nullable: bool, value: Any, strip_nul: bool) -> Any:
    """Slow path of :func:`encode_row`: a value not of its column's exact type."""
    if value is None:
        return None if nullable else _ZERO[kind]
    try:
        if kind == "str":
            text = str(value)
            return text.replace("\x00", "") if strip_nul else text
        if kind == "bool":
            return bool(value)
        if kind == "int":
            return int(value)
        number = float(value)
        if number != number:  # NaN
            return None if nullable else _ZERO[kind]
        return number
    except (TypeError, ValueError, OverflowError):
        # Losing one field beats blocking the write queue with a row that can never be stored.
        logger.warning("decision record field %s has an unusable %s value; stored as empty", name, kind)
        return None if nullable else _ZERO[kind]


def encode_row(record: DecisionRecord, *, strip_nul: bool = False) -> tuple[Any, ...]:
    """The record's column values in COLUMNS order, each of its column's type (JSON as text)."""
    out: list[Any] = []
    for name, kind, nullable, exact in _SPEC:
        value: Any = getattr(record, name)
        if exact is None:
            if value is None and nullable:  # a nullable JSON column (workflow) stays NULL
                out.append(None)
                continue
            out.append(encode_json({} if value is None else value, strip_nul=strip_nul))
        elif type(value) is exact:  # exact: a bool must not pass for an int
            if exact is float and value != value:
                # NaN: SQLite would store NULL (and refuse it in a NOT NULL column); keep one shape.
                value = None if nullable else _ZERO[kind]
            elif strip_nul and exact is str and "\x00" in cast(str, value):
                value = cast(str, value).replace("\x00", "")
            out.append(value)
        else:
            out.append(_coerce(name, kind, nullable, value, strip_nul))
    return tuple(out)


_SHADOW_OF = next(i for i, spec in enumerate(_SPEC) if spec[0] == "shadow_of")
_CREATED_AT = next(i for i, spec in enumerate(_SPEC) if spec[0] == "created_at")


def of_decision(row: tuple[Any, ...]) -> tuple[Any, Any]:
    """(shadow_of, created_at) of an encoded decision row: the parameters a conversation or sub-call row
    carries after its columns, for the tombstone check (:func:`store.schema.insert_conversation_sql`)."""
    return row[_SHADOW_OF], row[_CREATED_AT]


def feedback_check(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The parameters of :func:`store.schema.feedback_covered_sql` from a feedback row as the stores write it
    (FEEDBACK_COLUMNS, then when the request was issued): request_id, tenant, issued at, created_at."""
    return row[0], row[9], row[10], row[1]


def record_from_row(row: RowLike) -> DecisionRecord:
    """Build a record from a row keyed by column name."""
    values: dict[str, Any] = {}
    for name, kind, nullable, _exact in _SPEC:
        value = row[name]
        if kind == "json":
            value = None if value is None and nullable else decode_json(value)
        elif kind == "bool" and value is not None:
            value = bool(value)
        values[name] = value
    return DecisionRecord(**values)


# --- feedback and conversations ------------------------------------------------------------------


def _text(value: str | None, strip_nul: bool) -> str | None:
    if value is None:
        return None
    value = str(value)
    return value.replace("\x00", "") if strip_nul and "\x00" in value else value


def encode_feedback(item: FeedbackRecord, *, strip_nul: bool = False) -> tuple[Any, ...]:
    """A feedback row in FEEDBACK_COLUMNS order. The key columns are never NULL ("" for no model),
    so the unique index sees one key per logical piece of feedback."""
    score = float(item.score)
    return (
        _text(item.request_id, strip_nul) or "",
        float(item.created_at),
        score if math.isfinite(score) else None,
        _text(item.label, strip_nul),
        _text(item.comment, strip_nul),
        encode_json(item.metadata or {}, strip_nul=strip_nul),
        _text(item.metric, strip_nul) or "quality",
        _text(item.source, strip_nul) or "user",
        _text(item.model, strip_nul) or "",
        _text(item.tenant, strip_nul),
    )


def feedback_from_row(row: RowLike) -> FeedbackRecord:
    """A feedback record from a row keyed by column name. A score that is NULL (possible only in
    rows written before schema step 2) reads as NaN."""
    score = row["score"]
    return FeedbackRecord(
        request_id=row["request_id"],
        score=math.nan if score is None else float(score),
        metric=row["metric"],
        source=row["source"],
        model=row["model"],
        label=row["label"],
        comment=row["comment"],
        tenant=row["tenant"],
        created_at=float(row["created_at"]),
        metadata=decode_json(row["metadata"]),
    )


def encode_conversation(item: ConversationRecord, *, strip_nul: bool = False) -> tuple[Any, ...]:
    """A conversation row in CONVERSATION_COLUMNS order."""
    return (
        item.request_id,
        float(item.created_at),
        _text(item.tenant, strip_nul),
        _text(item.encoder_id, strip_nul),
        None if item.embedding is None else bytes(item.embedding),
        _text(item.text, strip_nul),
        None if item.expires_at is None else float(item.expires_at),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def encode_subcall(item: SubCallRecord, *, strip_nul: bool = False) -> tuple[Any, ...]:
    """A sub-call row in SUBCALL_COLUMNS order (numbers coerced, NaN stored as NULL)."""
    return (
        _text(item.request_id, strip_nul) or "",
        int(item.index),
        _text(item.workflow, strip_nul) or "",
        _text(item.step, strip_nul) or "",
        _text(item.model, strip_nul),
        _text(item.backend, strip_nul),
        _int(item.status),
        _int(item.prompt_tokens),
        _int(item.completion_tokens),
        _float(item.cost_usd),
        _float(item.latency_ms),
        _float(item.confidence),
        _text(item.outcome, strip_nul) or "ok",
        _text(item.error, strip_nul),
        float(item.created_at),
        _text(item.tenant, strip_nul),
    )


def subcall_from_row(row: RowLike) -> SubCallRecord:
    """A sub-call record from a row keyed by column name."""
    return SubCallRecord(
        request_id=row["request_id"], index=int(row["idx"]), workflow=row["workflow"], step=row["step"],
        model=row["model"], backend=row["backend"], status=_int(row["status"]),
        prompt_tokens=_int(row["prompt_tokens"]), completion_tokens=_int(row["completion_tokens"]),
        cost_usd=_float(row["cost_usd"]), latency_ms=_float(row["latency_ms"]), confidence=_float(row["confidence"]),
        outcome=row["outcome"], error=row["error"], created_at=float(row["created_at"]), tenant=row["tenant"],
    )


def conversation_from_row(row: RowLike) -> ConversationRecord:
    """A conversation record from a row keyed by column name."""
    embedding = row["embedding"]
    return ConversationRecord(
        request_id=row["request_id"],
        created_at=float(row["created_at"]),
        tenant=row["tenant"],
        encoder_id=row["encoder_id"],
        embedding=None if embedding is None else bytes(embedding),
        text=row["text"],
        expires_at=row["expires_at"],
    )


def join_logged(
    decision_rows: Iterable[RowLike], conversation_rows: Iterable[RowLike], feedback_rows: Iterable[RowLike]
) -> list[LoggedRequest]:
    """Decisions (in their order) joined with their conversation and feedback, from three reads."""
    conversations = {c.request_id: c for c in map(conversation_from_row, conversation_rows)}
    feedback: dict[str, list[FeedbackRecord]] = {}
    for item in map(feedback_from_row, feedback_rows):
        feedback.setdefault(item.request_id, []).append(item)
    out: list[LoggedRequest] = []
    for row in decision_rows:
        record = record_from_row(row)
        record.conversation = conversations.get(record.request_id)
        out.append(LoggedRequest(record, record.conversation, feedback.get(record.request_id, [])))
    return out
