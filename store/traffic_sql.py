"""The statements and row decoding behind :meth:`DecisionStore.traffic` (the dashboard's aggregates).

Both SQL stores run the same two aggregate queries over a window of the decision log (served rows
only: a shadow arm's decision is not traffic); only the placeholder style, the time-bucket
arithmetic and the JSON access differ per dialect. Latency is counted into fixed bins
(:data:`LATENCY_BOUNDS_MS`) so percentiles come out of the store without shipping every row.
"""

from __future__ import annotations

from collections.abc import Iterable

from store._codec import RowLike
from store.records import LatencyBin, TrafficBucket, TrafficWindow
from store.schema import DECISIONS_TABLE, Dialect

#: Upper bounds (ms, inclusive) of the latency bins; bin ``len(LATENCY_BOUNDS_MS)`` is everything above.
LATENCY_BOUNDS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 350, 500, 750, 1000, 1500, 2000, 3000, 5000, 7500, 10000, 15000, 20000,
    30000, 60000, 120000,
)


def _bucket(dialect: Dialect) -> str:
    # Parameters 1 and 2 are (since, bucket_seconds); created_at >= since, so the quotient is >= 0.
    if dialect == "sqlite":
        return "CAST((created_at - ?1) / ?2 AS INTEGER)"
    return "floor((created_at - $1) / $2)::bigint"


def _where(dialect: Dialect) -> str:
    since = "?1" if dialect == "sqlite" else "$1"
    return f"created_at >= {since} AND shadow_of IS NULL"


def _cache_hit(dialect: Dialect) -> tuple[str, str]:
    """(cache looked up, cache hit) expressions over ``decision.cache`` (absent: the route has no
    cache): a lookup has ``result`` hit or miss (``bypass``: the request was not cacheable)."""
    if dialect == "sqlite":
        result, hit = "json_extract(decision, '$.cache.result')", "json_extract(decision, '$.cache.hit')"
        return f"{result} IN ('hit', 'miss')", f"{hit} = 1"
    result, hit = "(decision -> 'cache' ->> 'result')", "(decision -> 'cache' ->> 'hit')"
    return f"{result} IN ('hit', 'miss')", f"{hit} = 'true'"


def buckets_sql(dialect: Dialect) -> str:
    """Per (time bucket, route, model): requests, errors, cost, tokens, latency and cache hits
    (parameters: since, bucket_seconds)."""
    looked_up, hit = _cache_hit(dialect)
    bucket = _bucket(dialect)
    return (
        f"SELECT {bucket} AS bucket, route, model, count(*) AS requests, "
        "sum(CASE WHEN status >= 500 OR outcome = 'stream_error' THEN 1 ELSE 0 END) AS errors, "
        "sum(CASE WHEN status >= 400 AND status < 500 THEN 1 ELSE 0 END) AS rejected, "
        "coalesce(sum(cost_usd), 0) AS cost_usd, "
        "coalesce(sum(prompt_tokens), 0) AS prompt_tokens, "
        "coalesce(sum(completion_tokens), 0) AS completion_tokens, "
        "count(latency_ms) AS latency_requests, coalesce(sum(latency_ms), 0) AS latency_sum_ms, "
        f"sum(CASE WHEN {looked_up} THEN 1 ELSE 0 END) AS cache_lookups, "
        f"sum(CASE WHEN {hit} THEN 1 ELSE 0 END) AS cache_hits "
        f"FROM {DECISIONS_TABLE} WHERE {_where(dialect)} "
        "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )


def latency_sql(dialect: Dialect) -> str:
    """Per (time bucket, latency bin): how many requests (parameters: since, bucket_seconds)."""
    cases = " ".join(f"WHEN latency_ms <= {bound} THEN {i}" for i, bound in enumerate(LATENCY_BOUNDS_MS))
    bin_ = f"CASE {cases} ELSE {len(LATENCY_BOUNDS_MS)} END"
    bucket = _bucket(dialect)
    return (
        f"SELECT {bucket} AS bucket, {bin_} AS bin, count(*) AS n FROM {DECISIONS_TABLE} "
        f"WHERE {_where(dialect)} AND latency_ms IS NOT NULL AND outcome <> 'client_disconnected' "
        "GROUP BY 1, 2 ORDER BY 1, 2"
    )


def window_from_rows(
    since: float, bucket_seconds: float, buckets: Iterable[RowLike], latency: Iterable[RowLike]
) -> TrafficWindow:
    return TrafficWindow(
        since=since,
        bucket_seconds=bucket_seconds,
        buckets=[
            TrafficBucket(
                bucket=int(row["bucket"]), route=row["route"], model=row["model"], requests=int(row["requests"]),
                errors=int(row["errors"] or 0), rejected=int(row["rejected"] or 0),
                cost_usd=float(row["cost_usd"] or 0.0), prompt_tokens=int(row["prompt_tokens"] or 0),
                completion_tokens=int(row["completion_tokens"] or 0),
                latency_requests=int(row["latency_requests"] or 0),
                latency_sum_ms=float(row["latency_sum_ms"] or 0.0),
                cache_lookups=int(row["cache_lookups"] or 0), cache_hits=int(row["cache_hits"] or 0),
            )
            for row in buckets
        ],
        latency=[LatencyBin(bucket=int(row["bucket"]), bin=int(row["bin"]), count=int(row["n"])) for row in latency],
    )
