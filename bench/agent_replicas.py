"""Replica selection for agent traffic, simulated: which policy gets the most goodput out of N engines.

A discrete-event simulator of N vLLM-like replicas (continuous batching, chunked prefill, a bounded
prefix cache with LRU eviction; ``bench/replica_sim/``) behind the gateway, where every request is
routed by the gateway's own selection code (``gateway/balancing``: the raw JSON body hashed into
prefix blocks, ``make_policy(...).choose`` / ``served``). Policies: round_robin, least_outstanding,
session_affinity, prefix_affinity (cache-aware without load bounds) and cache_aware.

Traces (``bench/replica_sim/traces.py``): the *agent mix* (85% agent sessions: a shared system prompt
and tools of 2.5-7k tokens, a closed tool-call loop of ~12 turns whose context grows by a tool call and
a tool result each turn, up to 32k tokens; 15% plain chats), sessions arriving by a Gamma process with
CV 3 (BurstGPT); and *plain chat* (mostly single-turn short prompts). Engine profile
(``bench/replica_sim/profile.py``): Llama-3.1-8B BF16 on one H100-80GB under vLLM V1, every number
with its source.

Reported (``bench/results/agent_replicas/``): goodput (the highest arrival rate whose TTFT p99 meets
the SLO: 3 s agent, 1 s chat) per policy at 2/4/8/16 replicas over 5 seeds with 95% CIs, throughput,
TTFT p50/p99, cache hit rate and load imbalance at that rate; TTFT p99 against rate at 8 replicas; a
sensitivity sweep of the engine profile and trace at 8 replicas (KV capacity, prefill speed, decode
cost, session length, tool-result size, burstiness); a sweep of cache_aware's load bounds. Targets: at
8 replicas cache_aware >= least_outstanding + 10% goodput on the agent mix and within 2% of it on
plain chat (exit code 1 if either fails).

Run: ``nice -n 5 .venv/bin/python bench/agent_replicas.py`` (20 min on 2 cores, ~39 CPU-minutes of
simulation; ~30 min when other jobs share the cores), ``--quick`` (~2 min: 2 seeds, 2 and 8 replicas,
small sweeps; ~6 min on shared cores), ``--replicas 2,4,8,16 --seeds 5 --workers 2 --only agent|chat
--no-sweep --out DIR``; ``--report-only`` re-renders the report from ``results.json``. One run (one
policy, rate and seed; 8 replicas, 5 simulated minutes, ~10k agent requests) takes ~1 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from functools import partial
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._args import int_list  # noqa: E402
from bench._procs import cpu_model  # noqa: E402
from bench.replica_sim import plan  # noqa: E402
from bench.replica_sim.profile import EngineProfile  # noqa: E402
from bench.replica_sim.report import verdict, write_report  # noqa: E402
from bench.replica_sim.traces import TraceParams  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "agent_replicas"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 2 and 8 replicas, small sweeps (~3 min)")
    # An empty value means the default, as before.
    parser.add_argument("--replicas", type=int_list(allow_empty=True), default=None,
                        help="comma-separated replica counts (default 2,4,8,16)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 5; quick 2)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output directory (default {RESULTS})")
    parser.add_argument("--only", choices=("agent", "chat"), default=None, help="one mix only")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sensitivity and load-bound sweeps")
    parser.add_argument("--rel-tol", type=float, default=None, help="bisection tolerance (default 1%%; quick 3%%)")
    parser.add_argument("--report-only", action="store_true", help="re-render the report from results.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    if args.report_only:
        doc = json.loads((out / "results.json").read_text())
        return _finish(doc, out)
    quick = args.quick
    replicas = args.replicas or ([2, 8] if quick else [2, 4, 8, 16])
    seeds = args.seeds or (2 if quick else 5)
    rel_tol = args.rel_tol or (0.03 if quick else 0.01)
    mixes = [args.only] if args.only else list(plan.MIXES)

    searches = plan.grid_searches(mixes, replicas, seeds)
    if not args.no_sweep:
        sweep_seeds = 1 if quick else min(seeds, 3)
        if "agent" in mixes:
            searches += plan.sensitivity_searches(sweep_seeds, plan.QUICK_SENSITIVITY if quick else None)
            searches += [plan.Search("agent", 8, s, "least_outstanding") for s in range(sweep_seeds)]
        balance = plan.QUICK_BALANCE if quick else plan.BALANCE
        sizes = (8,) if quick else plan.BALANCE_AGENT_REPLICAS
        searches += plan.balance_searches(mixes, sweep_seeds, balance, sizes)
        tails = plan.tail_runs(mixes, sweep_seeds, balance, sizes)
    else:
        tails = []
    tasks = plan.group(searches)
    curves = plan.curves(mixes, 6 if quick else 10)

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    clock = time.perf_counter()
    records: list[dict[str, Any]] = []
    curve_records: list[dict[str, Any]] = []
    tail_records: list[dict[str, Any]] = []
    n_searches = sum(len(t) for t in tasks)
    with _progress() as progress, Pool(args.workers) as pool:
        bar = progress.add_task("goodput searches", total=n_searches)
        cbar = progress.add_task("TTFT curves", total=len(curves))
        tbar = progress.add_task("moderate-load runs", total=len(tails))
        for result in pool.imap_unordered(partial(plan.run_task, rel_tol=rel_tol), tasks):
            records.extend(result)
            progress.advance(bar, len(result))
        for curve in pool.imap_unordered(plan.run_curve, curves):
            curve_records.extend(curve)
            progress.advance(cbar)
        for tail in pool.imap_unordered(plan.run_tail, tails, chunksize=4):
            tail_records.append(tail)
            progress.advance(tbar)

    doc = {
        "meta": {
            "started": started, "wall_s": time.perf_counter() - clock, "workers": args.workers, "cpu": cpu_model(),
            "cpu_s": sum(r["cpu_s"] for r in (*records, *curve_records, *tail_records)),
            "commit": _commit(),
            "seeds": seeds, "replicas": replicas, "rel_tol": rel_tol, "quick": quick,
            "profile": asdict(EngineProfile()), "trace": asdict(TraceParams()),
            "mixes": {m: asdict(plan.MIXES[m]) for m in mixes},
        },
        "searches": records,
        "curves": curve_records,
        "tails": tail_records,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    return _finish(doc, out)


def _commit() -> str:
    """The repository commit, marked when the selection code (gateway/balancing) differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "gateway/balancing"], cwd=ROOT, capture_output=True, text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' + uncommitted gateway/balancing changes' if dirty else ''}"


def _finish(doc: dict[str, Any], out: Path) -> int:
    path = write_report(doc, out)
    text = path.read_text()
    try:
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text.split("## Plots")[0]))
    except ImportError:
        print(text)
    print(f"\nreport: {path}")
    results = verdict(doc)
    failed = [mix for mix, got in results.items() if got is not None and not got["met"]]
    return 1 if failed else 0


class _NoProgress:
    """Stand-in when rich is missing: prints a line per finished task."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, name: str, total: int) -> str:
        return name

    def advance(self, task: str, n: int = 1) -> None:
        print(f"{task}: +{n}", flush=True)


def _progress() -> Any:
    if not sys.stderr.isatty():
        return _NoProgress()
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    except ImportError:
        return _NoProgress()


if __name__ == "__main__":
    sys.exit(main())
