"""The statements and row decoding behind the stores' experiment methods (schema step 4).

Both SQL stores run the same statements; only the placeholder style differs (``?`` for SQLite,
``$n`` for PostgreSQL), so each statement is built per dialect here and the stores stay thin.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from store._codec import RowLike, decode_json
from store.outcomes import EXPLICIT_SOURCES, IMPLICIT_SCORE, IMPLICIT_SOURCE, JUDGE_SOURCE, QUALITY_METRIC
from store.records import ArmOutcomes, ArmStop, ArmTotals, ExperimentRow
from store.schema import (
    ARM_STOPS_TABLE,
    ASSIGNMENTS_TABLE,
    DECISIONS_TABLE,
    EXPERIMENTS_TABLE,
    FEEDBACK_TABLE,
    Dialect,
)

# Served rows of an experiment: not a shadow decision, and not a request the client walked away
# from (its latency and status say nothing about the arm).
_SERVED = "experiment = {p1} AND shadow_of IS NULL AND experiment_arm IS NOT NULL AND outcome <> 'client_disconnected'"


def _p(dialect: Dialect, i: int) -> str:
    return "?" if dialect == "sqlite" else f"${i}"


def _numbered(dialect: Dialect, i: int) -> str:
    """Placeholder ``i`` by number in both dialects (SQLite's ``?NNN``), for a parameter used twice."""
    return f"?{i}" if dialect == "sqlite" else f"${i}"


def upsert_experiment_sql(dialect: Dialect) -> str:
    """INSERT of (name, route, spec, updated_at); a registered experiment is replaced."""
    values = ", ".join(_p(dialect, i) for i in range(1, 5))
    return (
        f"INSERT INTO {EXPERIMENTS_TABLE} (name, route, spec, updated_at) VALUES ({values}) "
        "ON CONFLICT (name) DO UPDATE SET route = excluded.route, spec = excluded.spec, "
        "updated_at = excluded.updated_at"
    )


def select_experiments_sql(dialect: Dialect, *, by_name: bool) -> str:
    """SELECT of registered experiments (one by name, or all by name)."""
    sql = f"SELECT name, route, spec, updated_at FROM {EXPERIMENTS_TABLE}"
    return sql + f" WHERE name = {_p(dialect, 1)}" if by_name else sql + " ORDER BY name"


def insert_stop_sql(dialect: Dialect) -> str:
    """INSERT of an arm stop; an arm already stopped keeps its first stop (first writer wins)."""
    values = ", ".join(_p(dialect, i) for i in range(1, 7))
    return (
        f"INSERT INTO {ARM_STOPS_TABLE} (experiment, arm, reason, detail, stopped_at, replica) VALUES ({values}) "
        "ON CONFLICT (experiment, arm) DO NOTHING"
    )


def select_stops_sql(dialect: Dialect, *, by_experiment: bool) -> str:
    """SELECT of arm stops, oldest first (of one experiment, or of all)."""
    sql = f"SELECT experiment, arm, reason, detail, stopped_at, replica FROM {ARM_STOPS_TABLE}"
    if by_experiment:
        sql += f" WHERE experiment = {_p(dialect, 1)}"
    return sql + " ORDER BY stopped_at, experiment, arm"


def delete_stop_sql(dialect: Dialect) -> str:
    """DELETE of one arm's stop (an operator resumes the arm)."""
    return f"DELETE FROM {ARM_STOPS_TABLE} WHERE experiment = {_p(dialect, 1)} AND arm = {_p(dialect, 2)}"


def totals_sql(dialect: Dialect, *, since: bool) -> str:
    """Per-arm aggregates of an experiment's served rows (parameters: experiment[, since])."""
    where = _SERVED.format(p1=_p(dialect, 1))
    if since:
        where += f" AND created_at >= {_p(dialect, 2)}"
    return (
        "SELECT experiment_arm AS arm, count(*) AS requests, "
        "sum(CASE WHEN status >= 500 OR outcome = 'stream_error' THEN 1 ELSE 0 END) AS errors, "
        "count(cost_usd) AS cost_requests, coalesce(sum(cost_usd), 0) AS cost_sum, "
        "coalesce(sum(cost_usd * cost_usd), 0) AS cost_sq_sum, count(latency_ms) AS latency_requests "
        f"FROM {DECISIONS_TABLE} WHERE {where} GROUP BY experiment_arm"
    )


def outcomes_sql(dialect: Dialect, metric: str, *, since: bool) -> str:
    """Per-arm outcomes of an experiment's served rows under ``metric``, combined per request in SQL
    exactly as :func:`store.outcomes.served_feedback` then ``.outcome(metric, use_judge=True)`` combine
    them in Python (parameters: experiment, metric[, since]).

    Per served request (an inner GROUP BY request): the feedback rows about its served answer (``model``
    empty or the served model's name); its outcome is the mean of its explicit rows under the metric,
    else the mean of its judge rows under it, else :data:`~store.outcomes.IMPLICIT_SCORE` when an
    implicit row scored it below 1 (any implicit row for ``quality``, one named like the metric
    otherwise), else none. Per arm: the requests with an outcome, and the sum of their outcomes clamped
    to [0, 1]. A NULL score (rows written before schema step 2, or a non-finite score) is no evidence;
    the rows-based reading took it for NaN, which made the arm's sum NaN.
    """
    # Numbered placeholders: the metric is compared more than once.
    where = _SERVED.format(p1=_numbered(dialect, 1))
    if since:
        where += f" AND created_at >= {_numbered(dialect, 3)}"
    metric_p = _numbered(dialect, 2)
    real = "double precision"
    explicit = ", ".join(f"'{source}'" for source in EXPLICIT_SOURCES)
    implicit_metric = "" if metric == QUALITY_METRIC else f" AND f.metric = {metric_p}"
    per_request = (
        "SELECT d.arm AS arm, coalesce("
        f"avg(CASE WHEN f.metric = {metric_p} AND f.source IN ({explicit}) THEN f.score END), "
        f"avg(CASE WHEN f.metric = {metric_p} AND f.source = '{JUDGE_SOURCE}' THEN f.score END), "
        f"max(CASE WHEN f.source = '{IMPLICIT_SOURCE}' AND f.score < 1.0{implicit_metric} "
        f"THEN CAST({IMPLICIT_SCORE!r} AS {real}) END)) AS outcome "
        f"FROM (SELECT request_id, experiment_arm AS arm, coalesce(model, '') AS model FROM {DECISIONS_TABLE} "
        f"WHERE {where}) d "
        f"JOIN {FEEDBACK_TABLE} f ON f.request_id = d.request_id AND f.model IN ('', d.model) "
        "GROUP BY d.request_id, d.arm"
    )
    return (
        "SELECT arm, count(outcome) AS outcomes, coalesce(sum("
        f"CASE WHEN outcome < 0 THEN CAST(0 AS {real}) WHEN outcome > 1 THEN CAST(1 AS {real}) ELSE outcome END"
        f"), CAST(0 AS {real})) AS quality_sum FROM ({per_request}) per_request GROUP BY arm"
    )


def latencies_sql(dialect: Dialect) -> str:
    """(arm, latency_ms) of an experiment's served rows since a time (parameters: experiment, since)."""
    where = _SERVED.format(p1=_p(dialect, 1))
    return (
        f"SELECT experiment_arm AS arm, latency_ms FROM {DECISIONS_TABLE} "
        f"WHERE {where} AND created_at >= {_p(dialect, 2)} AND latency_ms IS NOT NULL"
    )


def experiment_filter(dialect: Dialect, since: float | None, *, with_feedback: bool = False) -> tuple[str, list[Any]]:
    """WHERE clause (and its parameters after the experiment name) selecting an experiment's rows,
    served and shadow; with ``with_feedback``, only those that have feedback."""
    where = f" WHERE experiment = {_p(dialect, 1)}"
    params: list[Any] = []
    if since is not None:
        where += f" AND created_at >= {_p(dialect, 2)}"
        params.append(since)
    if with_feedback:
        where += f" AND request_id IN (SELECT request_id FROM {FEEDBACK_TABLE})"
    return where, params


def select_assignment_sql(dialect: Dialect) -> str:
    """SELECT of one key's sticky assignment (parameters: experiment, key_hash)."""
    return (
        f"SELECT arm, propensity FROM {ASSIGNMENTS_TABLE} "
        f"WHERE experiment = {_p(dialect, 1)} AND key_hash = {_p(dialect, 2)}"
    )


def insert_assignment_sql(dialect: Dialect) -> str:
    """INSERT of a sticky assignment; a key already assigned keeps its arm (first writer wins)."""
    values = ", ".join(_p(dialect, i) for i in range(1, 6))
    return (
        f"INSERT INTO {ASSIGNMENTS_TABLE} (experiment, key_hash, arm, propensity, assigned_at) VALUES ({values}) "
        "ON CONFLICT (experiment, key_hash) DO NOTHING"
    )


def experiment_from_row(row: RowLike) -> ExperimentRow:
    return ExperimentRow(
        name=str(row["name"]), route=str(row["route"]), spec=decode_json(row["spec"]),
        updated_at=float(row["updated_at"]),
    )


def stop_from_row(row: RowLike) -> ArmStop:
    replica = row["replica"]
    return ArmStop(
        experiment=str(row["experiment"]), arm=str(row["arm"]), reason=str(row["reason"]),
        detail=decode_json(row["detail"]), stopped_at=float(row["stopped_at"]),
        replica=None if replica is None else str(replica),
    )


def totals_from_row(row: RowLike) -> ArmTotals:
    return ArmTotals(
        arm=str(row["arm"]), requests=int(row["requests"]), errors=int(row["errors"] or 0),
        cost_requests=int(row["cost_requests"]), cost_sum=float(row["cost_sum"] or 0.0),
        cost_sq_sum=float(row["cost_sq_sum"] or 0.0), latency_requests=int(row["latency_requests"]),
    )


def outcomes_from_row(row: RowLike) -> ArmOutcomes:
    return ArmOutcomes(arm=str(row["arm"]), outcomes=int(row["outcomes"]), quality_sum=float(row["quality_sum"] or 0.0))


def latencies_from_rows(rows: Iterable[RowLike]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in rows:
        out.setdefault(str(row["arm"]), []).append(float(row["latency_ms"]))
    return out
