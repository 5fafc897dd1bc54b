"""The dashboard's numbers, computed from the decision store (every replica's rows) and the live
router: ``GET /dashboard/api/summary`` returns :func:`build_summary`'s result as JSON.

Nothing here holds request text: decision records carry signals, the plan and its reason, never the
conversation (its text, when a route opts in to capture it, is in another table this never reads).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

from gateway.config import Config, ModelConfig
from gateway.usage import cost_usd
from policies.brain.active import ActiveRouter
from store.base import DecisionStore
from store.records import DecisionRecord, ExperimentRow, TrafficWindow
from store.traffic_sql import LATENCY_BOUNDS_MS

#: Allowed bucket widths (seconds): the window is cut into about :data:`TARGET_BUCKETS` of one of these.
BUCKET_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
TARGET_BUCKETS = 60
MIN_WINDOW, MAX_WINDOW = 60, 30 * 86400
RECENT = 25


class Baseline:
    """What each request would have cost on an always-strong policy: its tokens priced at its route's
    strong model (``cost_quality.strong``), or at the dearest configured model for routes without a
    cost-quality pair. A model requested by name was not routed: its baseline is its own cost."""

    def __init__(self, config: Config) -> None:
        self.prices: dict[str, ModelConfig] = {m.name: m for backend in config.backends for m in backend.models}
        dearest = max(self.prices.values(), key=lambda m: m.input_cost_per_mtok + m.output_cost_per_mtok, default=None)
        self.dearest: str | None = dearest.name if dearest else None
        self.strong: dict[str, str | None] = {}
        for route in config.routes:
            strong = route.cost_quality.strong if route.cost_quality is not None else None
            self.strong[route.name] = strong if strong in self.prices else self.dearest

    def model_for(self, route: str | None) -> str | None:
        """The model a route's baseline prices tokens at (None: a direct request, its own cost)."""
        if route is None:
            return None
        return self.strong.get(route, self.dearest)

    def cost(self, route: str | None, actual: float, prompt_tokens: int, completion_tokens: int) -> float:
        model = self.model_for(route)
        if model is None:
            return actual
        return cost_usd(self.prices[model], prompt_tokens, completion_tokens) or 0.0


def choose_bucket(window: float) -> int:
    """The smallest allowed bucket that cuts ``window`` into at most :data:`TARGET_BUCKETS` slices."""
    for step in BUCKET_STEPS:
        if window / step <= TARGET_BUCKETS:
            return step
    return BUCKET_STEPS[-1]


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a latency histogram (bin -> count), interpolated within its bin."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(histogram):
        count = histogram[index]
        if count and seen + count >= rank:
            low = 0.0 if index == 0 else float(LATENCY_BOUNDS_MS[index - 1])
            if index >= len(LATENCY_BOUNDS_MS):
                return low  # above the last bound: report the bound (a lower limit)
            high = float(LATENCY_BOUNDS_MS[index])
            return low + (high - low) * max(0.0, rank - seen) / count
        seen += count
    return float(LATENCY_BOUNDS_MS[-1])


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def traffic_summary(window: TrafficWindow, slices: int, baseline: Baseline) -> dict[str, Any]:
    """Series per bucket (models, routes, errors, cost, baseline cost, latency, cache hit rate), the
    window's totals and a per-route table."""
    t = [window.since + i * window.bucket_seconds for i in range(slices)]
    models: dict[str, list[int]] = {}
    routes: dict[str, list[int]] = {}
    zero_i = [0] * slices
    errors, rejected, requests = list(zero_i), list(zero_i), list(zero_i)
    lookups, hits = list(zero_i), list(zero_i)
    cost = [0.0] * slices
    base = [0.0] * slices
    per_route: dict[str, dict[str, Any]] = {}
    totals: dict[str, Any] = {"requests": 0, "errors": 0, "rejected": 0, "cost_usd": 0.0, "baseline_cost_usd": 0.0,
                              "prompt_tokens": 0, "completion_tokens": 0, "cache_lookups": 0, "cache_hits": 0,
                              "latency_requests": 0, "latency_sum_ms": 0.0}
    for row in window.buckets:
        i = row.bucket
        if not 0 <= i < slices:
            continue  # a row written after "now" by a replica with a fast clock
        model = row.model or "(none)"
        route = row.route or "(direct)"
        models.setdefault(model, list(zero_i))[i] += row.requests
        routes.setdefault(route, list(zero_i))[i] += row.requests
        requests[i] += row.requests
        errors[i] += row.errors
        rejected[i] += row.rejected
        lookups[i] += row.cache_lookups
        hits[i] += row.cache_hits
        row_base = baseline.cost(row.route, row.cost_usd, row.prompt_tokens, row.completion_tokens)
        cost[i] += row.cost_usd
        base[i] += row_base
        for key, value in (("requests", row.requests), ("errors", row.errors), ("rejected", row.rejected),
                           ("cost_usd", row.cost_usd), ("baseline_cost_usd", row_base),
                           ("prompt_tokens", row.prompt_tokens), ("completion_tokens", row.completion_tokens),
                           ("cache_lookups", row.cache_lookups), ("cache_hits", row.cache_hits),
                           ("latency_requests", row.latency_requests), ("latency_sum_ms", row.latency_sum_ms)):
            totals[key] += value
        entry = per_route.setdefault(route, {
            "route": route, "requests": 0, "errors": 0, "rejected": 0, "cost_usd": 0.0, "baseline_cost_usd": 0.0,
            "baseline_model": baseline.model_for(row.route), "models": {},
        })
        entry["requests"] += row.requests
        entry["errors"] += row.errors
        entry["rejected"] += row.rejected
        entry["cost_usd"] += row.cost_usd
        entry["baseline_cost_usd"] += row_base
        entry["models"][model] = entry["models"].get(model, 0) + row.requests
    hist: list[dict[int, int]] = [{} for _ in range(slices)]
    overall: dict[int, int] = {}
    for b in window.latency:
        if 0 <= b.bucket < slices:
            hist[b.bucket][b.bin] = hist[b.bucket].get(b.bin, 0) + b.count
            overall[b.bin] = overall.get(b.bin, 0) + b.count
    totals.update(
        error_rate=_rate(totals["errors"], totals["requests"]),
        savings_usd=totals["baseline_cost_usd"] - totals["cost_usd"],
        savings_share=(1 - totals["cost_usd"] / totals["baseline_cost_usd"]) if totals["baseline_cost_usd"] else None,
        cache_hit_rate=_rate(totals["cache_hits"], totals["cache_lookups"]),
        latency_mean_ms=(totals["latency_sum_ms"] / totals["latency_requests"]) if totals["latency_requests"] else None,
        latency_p50_ms=percentile(overall, 0.5), latency_p95_ms=percentile(overall, 0.95),
        latency_p99_ms=percentile(overall, 0.99),
    )
    return {
        "series": {
            "t": t, "requests": requests, "models": models, "routes": routes, "errors": errors, "rejected": rejected,
            "cost_usd": cost, "baseline_cost_usd": base,
            "latency_p50_ms": [percentile(h, 0.5) for h in hist], "latency_p95_ms": [percentile(h, 0.95) for h in hist],
            "cache_hit_rate": [_rate(h, n) for h, n in zip(hits, lookups, strict=True)],
        },
        "totals": totals,
        "routes": sorted(per_route.values(), key=lambda r: -r["requests"]),
    }


def experiment_status(spec: Mapping[str, Any], now: float) -> str:
    """``paused``, ``scheduled`` (before its start), ``ended`` (after its end) or ``running``."""
    if spec.get("paused"):
        return "paused"
    start, end = spec.get("start"), spec.get("end")
    if isinstance(start, int | float) and now < start:
        return "scheduled"
    if isinstance(end, int | float) and now >= end:
        return "ended"
    return "running"


async def experiments_summary(store: DecisionStore, now: float) -> list[dict[str, Any]]:
    """Every registered experiment: its status, and per arm its share, stop and served totals."""
    rows: list[ExperimentRow] = await store.list_experiments()
    if not rows:
        return []
    stops = await store.experiment_stops()
    totals = await asyncio.gather(*(store.experiment_totals(row.name) for row in rows))
    out = []
    for row, arm_totals in zip(rows, totals, strict=True):
        stopped = {s.arm: s for s in stops if s.experiment == row.name}
        arms = []
        for arm in row.spec.get("arms", []):
            name = str(arm.get("name"))
            got = arm_totals.get(name)
            stop = stopped.get(name)
            arms.append({
                "name": name, "kind": arm.get("kind"), "control": bool(arm.get("control")),
                "shadow": bool(arm.get("shadow")), "weight": arm.get("weight"), "model": arm.get("model"),
                "requests": got.requests if got else 0, "errors": got.errors if got else 0,
                "cost_usd": got.cost_sum if got else 0.0,
                "mean_cost_usd": (got.cost_sum / got.cost_requests) if got and got.cost_requests else None,
                "stopped": None if stop is None else {"reason": stop.reason, "at": stop.stopped_at},
            })
        out.append({
            "name": row.name, "route": row.route, "status": experiment_status(row.spec, now),
            "key": row.spec.get("key"), "description": row.spec.get("description"),
            "start": row.spec.get("start"), "end": row.spec.get("end"), "arms": arms,
        })
    return out


def _compact_value(value: Any) -> Any:
    """A signal's value for display: numbers rounded, short label lists kept, mappings of numbers rounded."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return round(float(value), 4) if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:64]
    if isinstance(value, Mapping):
        return {str(k)[:64]: _compact_value(v) for k, v in list(value.items())[:12]}
    if isinstance(value, list | tuple):
        return [_compact_value(v) for v in value[:12]]
    return str(value)[:64]


def decision_summary(record: DecisionRecord) -> dict[str, Any]:
    """One decision as the dashboard lists it: what was decided, why, and how it went (no text)."""
    decision = record.decision or {}
    raw_details = decision.get("details")
    details: Mapping[str, Any] = raw_details if isinstance(raw_details, Mapping) else {}
    cache = decision.get("cache") if isinstance(decision.get("cache"), Mapping) else None
    signals = {
        str(name): _compact_value(sig.get("value") if isinstance(sig, Mapping) else sig)
        for name, sig in (record.signals or {}).items()
    }
    rules = details.get("rules")
    return {
        "request_id": record.request_id, "created_at": record.created_at, "route": record.route,
        "requested_model": record.requested_model, "model": record.model, "backend": record.backend,
        "status": record.status, "outcome": record.outcome, "error_type": record.error_type,
        "latency_ms": record.latency_ms, "cost_usd": record.cost_usd,
        "prompt_tokens": record.prompt_tokens, "completion_tokens": record.completion_tokens,
        "stream": record.stream, "tenant": record.tenant,
        "experiment": record.experiment, "arm": record.experiment_arm, "shadow_of": record.shadow_of,
        "router_version": record.router_version, "reason": record.reason, "policy": decision.get("policy"),
        "candidates": decision.get("candidates"), "score": details.get("score"),
        "threshold": details.get("threshold"), "threshold_source": details.get("threshold_source"),
        "rules": _compact_value(rules) if rules else [],
        "workflow": (record.workflow or {}).get("name") if record.workflow else None,
        "cache_hit": None if cache is None else bool(cache.get("hit")),
        "signals": signals,
    }


def router_summary(router: ActiveRouter | None) -> dict[str, Any] | None:
    if router is None:
        return None
    return {"version": router.version, "directory": str(router.current.directory), "reloads": router.reloads,
            "reload_failures": router.reload_failures, "last_error": router.last_error}


async def build_summary(
    store: DecisionStore, config: Config, router: ActiveRouter | None, window: float,
    *, now: float | None = None, started_at: float | None = None,
) -> dict[str, Any]:
    """Everything the dashboard shows for the last ``window`` seconds (1 minute to 30 days; ``ValueError``
    outside: the API refuses those with a 400 before asking, so an answer always covers the window asked
    for). ``window`` comes back as a float, whatever number type it was given as."""
    now = time.time() if now is None else now
    window = float(window)
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        raise ValueError(f"window: {window:g} s is outside {MIN_WINDOW} to {MAX_WINDOW} seconds")
    step = choose_bucket(window)
    end = math.floor(now / step) * step + step  # the bucket holding "now" is the last one
    slices = max(1, math.ceil(window / step))
    since = end - slices * step
    traffic, recent, experiments = await asyncio.gather(
        store.traffic(since, step), store.recent(limit=RECENT), experiments_summary(store, now)
    )
    summary = traffic_summary(traffic, slices, Baseline(config))
    return {
        "now": now, "window": window, "since": since, "bucket_seconds": step, "started_at": started_at,
        "router": router_summary(router),
        "routes_configured": [
            {"name": r.name, "policy": r.policy,
             "strong": r.cost_quality.strong if r.cost_quality else None,
             "weak": r.cost_quality.weak if r.cost_quality else None}
            for r in config.routes
        ],
        **summary,
        "experiments": experiments,
        "recent": [decision_summary(r) for r in recent],
    }
