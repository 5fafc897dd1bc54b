"""One adaptive-allocation update of a large experiment: wall time, longest event-loop stall, peak RSS.

Builds (once, cached under ``--cache``) a store holding an adaptive experiment of ``--requests``
served requests over two arms, each with a cost and a ~1.5 KB signals blob, and about ``--feedback``
feedback rows on them: user thumbs, judge scores, the gateway's implicit failures, a fifth of the
rated requests with two rows, some about another model (a comparison). Then, for each mode, a fresh
subprocess opens the store and runs one reallocation ``--repeat`` times while a ticker on the same
event loop records how late its 1 ms sleeps wake up (the longest lateness is the stall a request
being served would have seen):

- ``current``: :meth:`ExperimentMonitor.reallocate` of the checkout under test;
- ``rows``: what commit 198eab0 did (the store's per-arm cost sums, then every request that has
  feedback read and decoded off the loop, and its outcomes combined in Python).

Both are printed with the evidence they computed and the allocation it gives, which must be the same
(the evidence up to the order its sums were added in; exit code 1 otherwise). Reported: the median wall
time of one update, the longest stall over all repeats, the process's peak RSS (``ru_maxrss``) and
its RSS before the first update.

    .venv/bin/python bench/experiment_reallocation.py [--backend sqlite|postgres] [--requests 500000]
        [--feedback 50000,500000] [--modes rows,current] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _args import int_list

from store import DecisionRecord, FeedbackRecord, PostgresDecisionStore, SQLiteDecisionStore
from store.base import DecisionStore

EXPERIMENT = "realloc"
ARMS = ("control", "v2")
START = 1_700_000_000.0
PG_DSN = os.environ.get("POINTSMAN_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _signals(rng: random.Random) -> dict[str, Any]:
    return {
        "difficulty": {"value": rng.random(),
                       "detail": {"head": "logreg", "features": [rng.random() for _ in range(40)]}},
        "pii": {"value": [], "detail": {"checked": ["email", "phone", "card", "iban"]}},
        "topic": {"value": rng.choice(["code", "math", "chat", "summary"]), "detail": {"scores": [rng.random()] * 30}},
    }


def _records(requests: int, seed: int) -> Any:
    rng = random.Random(seed)
    batch: list[DecisionRecord] = []
    for i in range(requests):
        arm = ARMS[i % 2]
        model = "big" if arm == "control" else "small"
        disconnected = i % 97 == 0
        batch.append(DecisionRecord(
            request_id=f"r{i:08d}", created_at=START + i * 0.01, endpoint="chat.completions", route="auto",
            requested_model="auto", signals=_signals(rng), decision={"policy": "rules", "candidates": [model]},
            reason="rule matched: default", model=model, backend="fake", status=499 if disconnected else 200,
            outcome="client_disconnected" if disconnected else "ok", latency_ms=rng.uniform(50, 900),
            cost_usd=None if i % 53 == 0 else rng.uniform(1e-5, 3e-3) * (2.0 if model == "big" else 1.0),
            prompt_tokens=100, completion_tokens=50, experiment=EXPERIMENT, experiment_arm=arm,
            arm_propensity=0.5,
        ))
        if len(batch) == 5000:
            yield batch
            batch = []
    if batch:
        yield batch


def _feedback(requests: int, rows: int, seed: int) -> Any:
    """About ``rows`` feedback rows over the first requests (spread over the whole experiment)."""
    rng = random.Random(seed + 1)
    rated = min(requests, max(1, int(rows / 1.25)))
    step = requests / rated
    batch: list[FeedbackRecord] = []
    for k in range(rated):
        i = int(k * step)
        rid, model = f"r{i:08d}", "big" if i % 2 == 0 else "small"
        kind = rng.random()
        if kind < 0.5:
            batch.append(FeedbackRecord(rid, float(rng.random() < 0.7), source="user", model=model))
        elif kind < 0.8:
            batch.append(FeedbackRecord(rid, round(rng.random(), 3), source="judge", model=model))
        else:
            batch.append(FeedbackRecord(rid, 0.0, metric="reask", source="implicit", model=model))
        if rng.random() < 0.25:  # a second row: the judge, or a comparison's score of the other model
            other = rng.choice([model, "", "other-model"])
            batch.append(FeedbackRecord(rid, round(rng.random(), 3), source="judge", model=other))
        if len(batch) >= 5000:
            yield batch
            batch = []
    if batch:
        yield batch


def _store(backend: str, where: str) -> DecisionStore:
    return SQLiteDecisionStore(where) if backend == "sqlite" else PostgresDecisionStore(where)


async def _build(backend: str, where: str, requests: int, feedback: int, seed: int) -> None:
    store = _store(backend, where)
    await store.open()
    try:
        for batch in _records(requests, seed):
            await store.write_batch(batch)
        for fb_batch in _feedback(requests, feedback, seed):
            await store.write_feedback(fb_batch)
    finally:
        await store.close()


async def _pg_schema(schema: str, create: bool) -> bool:
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        exists = await conn.fetchval("SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", schema)
        if create and not exists:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        return bool(exists)
    finally:
        await conn.close()


def _dataset(args: argparse.Namespace, feedback: int) -> str:
    """The store (a SQLite path or a PostgreSQL DSN) holding the dataset, built when missing."""
    tag = f"realloc_{args.requests}_{feedback}_{args.seed}"
    if args.backend == "sqlite":
        path = Path(args.cache) / f"{tag}.db"
        if not path.exists():
            partial = path.with_suffix(".partial.db")
            partial.unlink(missing_ok=True)
            t0 = time.perf_counter()
            asyncio.run(_build("sqlite", str(partial), args.requests, feedback, args.seed))
            partial.rename(path)
            print(f"  built {path} in {time.perf_counter() - t0:.0f} s", flush=True)
        return str(path)
    from tests.store.conftest import dsn_with_search_path

    schema = f"bench_{tag}"
    dsn = dsn_with_search_path(PG_DSN, schema)
    if not asyncio.run(_pg_schema(schema, create=True)):
        t0 = time.perf_counter()
        asyncio.run(_build("postgres", dsn, args.requests, feedback, args.seed))
        print(f"  built schema {schema} in {time.perf_counter() - t0:.0f} s", flush=True)
    return dsn


# --- one measurement, in its own process -------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def _rows_path(store: DecisionStore, name: str, since: float | None, metric: str) -> Any:
    """Commit 198eab0's reallocation read (kept here to compare against)."""
    from gateway.experiments.monitor import arm_evidence

    totals = await store.experiment_totals(name, since=since)
    rows = await store.experiment_requests(name, since=since, with_feedback=True)
    return await asyncio.to_thread(arm_evidence, rows, metric, totals)


async def _ticker(done: asyncio.Event, lateness: list[float]) -> None:
    """How late each 1 ms sleep wakes up, until ``done``."""
    while not done.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lateness.append(time.perf_counter() - t - 0.001)


async def _measure(backend: str, where: str, mode: str, repeat: int) -> dict[str, Any]:
    import gc

    from prometheus_client import CollectorRegistry, Counter

    from gateway.experiments.assignment import LiveExperiment
    from gateway.experiments.monitor import ExperimentMonitor
    from policies.experiments.allocation import ThompsonAllocator
    from policies.experiments.config import ExperimentConfig

    config = ExperimentConfig.model_validate({
        "name": EXPERIMENT, "route": "auto", "start": "2023-11-14T00:00:00Z",
        "arms": [{"name": "control", "control": True, "model": "big"}, {"name": "v2", "model": "small"}],
        "allocation": {"kind": "thompson", "lambda": 0.5},
    })
    from policies.experiments.arms import ArmPolicy

    # The monitor never asks an arm's policy to decide: a placeholder stands in for it.
    arms = {arm: ArmPolicy(EXPERIMENT, arm, None, "model") for arm in ARMS}  # type: ignore[arg-type]
    experiment = LiveExperiment(config, arms)
    counter = Counter("stops", "x", ["experiment", "arm", "guardrail"], registry=CollectorRegistry())
    store = _store(backend, where)
    await store.open()
    monitor = ExperimentMonitor([experiment], store, counter, "bench")
    gc.collect()
    rss_before = _rss_mb()
    walls: list[float] = []
    worst = 0.0
    evidence: Any = None
    try:
        for _ in range(repeat):
            done = asyncio.Event()
            lateness: list[float] = []
            tick = asyncio.create_task(_ticker(done, lateness))
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            if mode == "rows":
                evidence = await _rows_path(store, EXPERIMENT, config.start_ts, config.allocation.metric)
            else:
                await monitor.reallocate(experiment)
                evidence = monitor.evidence[EXPERIMENT]
            walls.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)  # what is freed after the update (on the loop) counts too
            done.set()
            await tick
            worst = max(worst, max(lateness, default=0.0))
    finally:
        await store.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    allocation = config.allocation
    allocator = ThompsonAllocator(experiment.served, experiment.control, lam=allocation.lambda_,
                                  draws=allocation.draws, min_propensity=allocation.min_propensity, salt=EXPERIMENT)
    return {
        "mode": mode, "wall_s": statistics.median(walls), "walls": walls, "stall_ms": worst * 1000,
        "peak_rss_mb": peak, "rss_before_mb": rss_before,
        "evidence": {arm: [e.outcomes, e.quality_sum, e.cost_requests, e.cost_sum, e.cost_sq_sum]
                     for arm, e in sorted(evidence.items())},
        "propensities": allocator.propensities(evidence),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--requests", type=int, default=500_000)
    parser.add_argument("--feedback", type=int_list(), default=[50_000, 500_000])
    parser.add_argument("--modes", default="rows,current")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default="/tmp/pointsman-bench-realloc")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "WHERE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        backend, where, mode = args.child
        print(json.dumps(asyncio.run(_measure(backend, where, mode, args.repeat))))
        return 0
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    print(f"{args.backend}, {args.requests:,} requests, one update repeated {args.repeat}x per mode", flush=True)
    failed = 0
    for feedback in args.feedback:
        where = _dataset(args, feedback)
        found: dict[str, Any] = {}
        allocations: dict[str, Any] = {}
        for mode in args.modes.split(","):
            out = subprocess.run(
                [sys.executable, __file__, "--repeat", str(args.repeat), "--child", args.backend, where, mode],
                check=True, stdout=subprocess.PIPE, text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            found[mode] = result["evidence"]
            allocations[mode] = result["propensities"]
            runs = ", ".join(f"{w:.2f}" for w in result["walls"])
            print(f"  feedback {feedback:>7,}  {mode:8}  wall {result['wall_s']:6.2f} s "
                  f"(runs {runs})  longest stall {result['stall_ms']:7.1f} ms  "
                  f"peak RSS {result['peak_rss_mb']:6.0f} MB (before the update {result['rss_before_mb']:.0f} MB)",
                  flush=True)
        first = next(iter(found.values()))
        for mode, evidence in found.items():
            same = all(
                arm in first and all(abs(a - b) <= 1e-9 * max(1.0, abs(a)) for a, b in zip(v, first[arm], strict=True))
                for arm, v in evidence.items()
            ) and set(evidence) == set(first)
            if not same:
                failed = 1
            print(f"    {mode}: {evidence}{'' if same else '  <- DIFFERS'}")
        first_allocation = next(iter(allocations.values()))
        for mode, allocation in allocations.items():
            failed |= allocation != first_allocation
            mark = "" if allocation == first_allocation else "  <- DIFFERS"
            print(f"    {mode} allocates new keys {allocation}{mark}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
