"""Experiment assignment: what choosing a request's arm adds to its routing decision.

Side by side in one process, on the code the gateway runs (``gateway.experiments.ExperimentRuntime``
built from a parsed config, ``policies.brain`` policies), per request:

* **decide**: ``await policy.decide(ctx)`` for the route's policy, no experiment;
* **assign + decide**: what ``ProxyService._plan`` does for a route with a running experiment —
  ``await runtime.assign(route, ctx)`` (the start/end check, the key read from the request, BLAKE2b of
  experiment + key, the bisect over the arms' cumulative shares; the adaptive path: the assignment
  cache), the decision record's experiment fields and the ``describe()`` of the assignment it stores —
  then the arm's ``decide``;
* **assign** alone, for every key kind: ``user``, ``session``, ``api_key`` and ``conversation`` (a hash
  of a 2 KB system prompt and the first user message), fixed weights, and adaptive (a cached key).

Two routes: ``static`` (the cheapest decision there is) and ``rules`` (keyword and length rules over the
conversation, then a default model: rule signals, no encoder, so the comparison is not drowned by the
encoder's noise). Every request is timed both ways back to back (which way first alternates), so a
pause of the machine hits one pair, not one side; the table shows per-request medians, and the added
time is the median of the per-request differences (robust to the other processes of a shared machine).
``assign`` alone is timed over whole batches (mean per request). Target: < 20 us per request. Run from
the repository root::

    .venv/bin/python bench/experiment_assignment.py [--n 20000 --rounds 7]

Printed and written to ``bench/results/experiment_assignment.{md,json}``; exit code 1 if the target fails.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.config import Config, parse_config
from gateway.experiments import ExperimentRuntime
from gateway.forward import Forwarder
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from gateway.upstream import UpstreamClient
from policies import RequestContext
from policies.brain import build_brain
from store import DecisionRecorder, NullDecisionStore
from store.records import DecisionRecord

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_US = 20.0
SYSTEM = ("You are a careful assistant for an insurance company. " * 40)[:2048]
KINDS = ("user", "session", "api_key", "conversation")


def config() -> Config:
    # Arms that decide like the route (its own copy; a variant with another default model), so "assign +
    # decide" differs from "decide" by the assignment only, whichever arm a request lands on.
    arms = [{"name": "control", "control": True, "weight": 2}, {"name": "twin"},
            {"name": "variant", "policy": {"model": "m2"}}]
    rules = {"policy": "rules", "model": "m1", "signals": {"keywords": {"urgent": {"keywords": ["asap", "urgent"]}}},
             "rules": [{"name": "urgent", "when": {"signal": "urgent", "op": "truthy"}, "action": {"route": "m2"}},
                       {"name": "long", "when": {"signal": "length", "op": "gt", "value": 6000},
                        "action": {"route": "m2"}}]}
    routes: list[dict[str, Any]] = []
    experiments: list[dict[str, Any]] = []
    for base, shape in (("static", {"model": "m1"}), ("rules", rules)):
        routes.append({"name": base, **shape})  # no experiment: the baseline
        for kind in KINDS:
            routes.append({"name": f"{base}-{kind}", **shape})
            experiments.append({"name": f"{base}-{kind}", "route": f"{base}-{kind}", "key": kind, "arms": arms,
                                "guardrails": {"enabled": False}})
        routes.append({"name": f"{base}-adaptive", **shape})
        experiments.append({"name": f"{base}-adaptive", "route": f"{base}-adaptive", "key": "user",
                            "allocation": {"kind": "thompson", "update_interval": 3600},
                            "arms": arms[:2], "guardrails": {"enabled": False}})
    return parse_config({
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [{"name": "m1"}, {"name": "m2"}]}],
        "store": {"kind": "none"}, "routes": routes, "experiments": experiments,
        "classifiers": {"scan_workers": 0},
    }, env={})


def contexts(route: str, n: int, round_: int) -> list[RequestContext]:
    """``n`` distinct requests (distinct user, session, API key; the same conversation start per 4)."""
    out = []
    for i in range(n):
        body = {"model": route, "user": f"user-{round_}-{i}",
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": f"Question {i // 4}: what does my policy cover?"}]}
        headers = {"authorization": f"Bearer sk-{round_}-{i:08d}", "x-pointsman-session-id": f"s-{round_}-{i}"}
        out.append(RequestContext(request_id=f"r{i}", endpoint="chat.completions", route=route, body=body,
                                  headers=headers))
    return out


Step = Callable[[RequestContext], Awaitable[Any]]


async def timed(step: Step, ctxs: list[RequestContext]) -> float:
    """Mean microseconds per request of ``step`` over ``ctxs``."""
    started = time.perf_counter_ns()
    for ctx in ctxs:
        await step(ctx)
    return (time.perf_counter_ns() - started) / len(ctxs) / 1000.0


async def paired(
    a: Step, a_ctxs: list[RequestContext], b: Step, b_ctxs: list[RequestContext]
) -> tuple[list[float], list[float]]:
    """Per request, microseconds of ``a`` and of ``b`` on it, back to back (alternating which goes first)."""
    a_us, b_us = [], []
    clock = time.perf_counter_ns
    for i, (x, y) in enumerate(zip(a_ctxs, b_ctxs, strict=True)):
        if i % 2:
            t0 = clock()
            await a(x)
            t1 = clock()
            await b(y)
            t2 = clock()
            a_us.append((t1 - t0) / 1000.0)
            b_us.append((t2 - t1) / 1000.0)
        else:
            t0 = clock()
            await b(y)
            t1 = clock()
            await a(x)
            t2 = clock()
            b_us.append((t1 - t0) / 1000.0)
            a_us.append((t2 - t1) / 1000.0)
    return a_us, b_us


async def main(args: argparse.Namespace) -> int:
    cfg = config()
    brain = build_brain(cfg.routing())
    await brain.start()
    metrics = Metrics()
    pool = BackendPool(cfg.backends, cfg.breaker)
    recorder = DecisionRecorder(NullDecisionStore())
    runtime = ExperimentRuntime(cfg, brain.arms, Forwarder(pool, UpstreamClient(), cfg.retry, metrics), pool,
                                recorder, metrics, brain.router)
    # Adaptive: every key of the timed rounds is already known (cached), as for a returning user.
    for base in ("static", "rules"):
        live = runtime.experiments[f"{base}-adaptive"]
        live._max_keys = 10**7

        async def put(experiment: str, key_hash: str, arm: str, p: float | None, at: float) -> tuple[str, float | None]:
            return arm, p

        for r in range(args.rounds + 1):
            for ctx in contexts(f"{base}-adaptive", args.n, r):
                key = live.key(ctx.body, ctx.headers, ctx.request_id)
                assert key is not None
                await live.assign_new(key, put)
    gc.collect()
    gc.freeze()

    async def decide(ctx: RequestContext) -> Any:
        return await brain.policies[ctx.route].decide(ctx)

    # The service fills the request's existing record; it is not created for the experiment.
    record = DecisionRecord(request_id="r", created_at=0.0, endpoint="chat.completions", route=None,
                            requested_model=None)

    async def assign(ctx: RequestContext) -> Any:
        assignment = await runtime.assign(ctx.route, ctx)
        assert assignment is not None
        record.experiment, record.experiment_arm = assignment.experiment, assignment.arm
        record.arm_propensity = assignment.propensity
        record.decision["experiment"] = assignment.describe()
        return assignment

    async def assign_decide(ctx: RequestContext) -> Any:
        assignment = await assign(ctx)
        return await assignment.policy.decide(ctx)

    cells: dict[str, dict[str, list[float]]] = {}
    for r in range(1, args.rounds + 1):
        for base in ("static", "rules"):
            for kind in (*KINDS, "adaptive"):
                route = f"{base}-{kind}"
                cell = cells.setdefault(route, {"decide": [], "assign+decide": [], "assign": []})
                # The same requests on the route without an experiment and on the route with one.
                with_exp = contexts(route, args.n, r)
                plain = [RequestContext(c.request_id, c.endpoint, base, c.body, headers=c.headers) for c in with_exp]
                a_us, b_us = await paired(decide, plain, assign_decide, with_exp)
                cell["decide"] += a_us
                cell["assign+decide"] += b_us
                cell["assign"].append(await timed(assign, with_exp))
    await brain.close()

    rows = []
    for route, cell in cells.items():
        added = [b - a for a, b in zip(cell["decide"], cell["assign+decide"], strict=True)]
        rows.append({
            "route": route, "decide_us": statistics.median(cell["decide"]),
            "assign_decide_us": statistics.median(cell["assign+decide"]),
            "added_us": statistics.median(added), "assign_us": statistics.median(cell["assign"]),
        })
    worst = max(max(row["added_us"], row["assign_us"]) for row in rows)
    lines = [
        f"# Experiment assignment overhead ({time.strftime('%Y-%m-%d')}, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{args.n} requests x {args.rounds} rounds)", "",
        "| route (key) | decide (us) | assign + decide (us) | added (us) | assign alone (us) |",
        "|---|---:|---:|---:|---:|",
        *(f"| {r['route']} | {r['decide_us']:.2f} | {r['assign_decide_us']:.2f} | {r['added_us']:+.2f} | "
          f"{r['assign_us']:.2f} |" for r in rows),
        "", f"Target: assignment adds < {TARGET_US:g} us per decision; worst measured {worst:.2f} us: "
        + ("PASS" if worst < TARGET_US else "FAIL"),
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "experiment_assignment.md").write_text(text + "\n")
    (RESULTS / "experiment_assignment.json").write_text(json.dumps({"rows": rows, "target_us": TARGET_US,
                                                                      "n": args.n, "rounds": args.rounds}, indent=2))
    return 0 if worst < TARGET_US else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="requests per cell and round")
    parser.add_argument("--rounds", type=int, default=7)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover
        runner = asyncio.Runner()
    with runner:
        sys.exit(runner.run(main(parser.parse_args())))
