"""Adaptation through the product: how much better does a router get from its own logged traffic?

Starts from the shipped router, feeds traffic it was not trained on (RouterBench-train's GPT-4-1106
vs Mixtral-8x7B outcomes on ARC-challenge, MBPP and Winogrande, from ``../shared/data``) through a real
gateway as logged traffic with comparisons, retrains with the product's own commands, and reports
held-out APGR before and after as a learning curve over 50 / 100 / 200 / 400 / 800 labelled requests.

Every step is a public command or endpoint:
- a graded fake upstream (``tests/fakes/graded.py``) answers as ``gpt-4`` or ``mixtral`` with the
  data's known outcome for that prompt, and its judge model compares two answers by those outcomes;
- ``pointsman serve`` with route ``auto`` (``cost_quality`` gpt-4 vs mixtral, ``compare: {share: 1}``,
  ``record: {embedding: true}``) logs every request, its conversation embedding and the judge's
  comparison of both models (both orders) into SQLite;
- after the first n requests: ``pointsman train --data logs:sqlite:///... --out REGISTRY`` and
  ``pointsman eval --config ... --data file:heldout.jsonl --routers-dir REGISTRY/versions/<id>``;
- the shipped router is evaluated the same way (no ``--routers-dir``).

The held-out set is 600 prompts chosen by prompt hash (never sent as traffic). Per cell: APGR with
the eval's bootstrap 95% CI, the random router's 95% band, and the paired bootstrap (held-out prompts
resampled) of APGR(retrained) - APGR(shipped). With ``--repeats R`` the traffic order is drawn R
times and the table shows the mean over draws. RouterBench has no licence: nothing built here ships.

Run: ``nice -n 5 .venv/bin/python bench/adaptation.py [--encoder static|minilm] [--repeats 3] [--no-warm-start]``;
results in ``bench/results/adaptation/`` (``adaptation.md``, ``adaptation.json``, ``adaptation.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._args import int_list  # noqa: E402
from bench._procs import free_port, start, stop, wait_http  # noqa: E402
from evals.data import load_routerbench, resolve_data_dir  # noqa: E402
from evals.data.split import prompt_unit  # noqa: E402
from evals.metrics import evaluate_scores  # noqa: E402

DATA_STRONG, DATA_WEAK = "gpt-4-1106-preview", "mistralai/mixtral-8x7b-chat"
STRONG, WEAK, JUDGE = "gpt-4", "mixtral", "judge"
HOLDOUT = 600
HOLDOUT_SEED = 11
SIZES = (50, 100, 200, 400, 800)
RESULTS = ROOT / "bench" / "results" / "adaptation"
PRICES = {STRONG: (10.0, 30.0), WEAK: (0.6, 0.6)}  # USD per million tokens (in, out)


def load_rows(data_dir: Path) -> list[dict[str, Any]]:
    """RouterBench rows with both outcomes known, as labelled rows under the gateway's model names."""
    rows = []
    for r in load_routerbench(data_dir):
        s, w = r.quality.get(DATA_STRONG, math.nan), r.quality.get(DATA_WEAK, math.nan)
        if math.isnan(s) or math.isnan(w):
            continue
        costs = {STRONG: r.cost.get(DATA_STRONG), WEAK: r.cost.get(DATA_WEAK)}
        rows.append({
            "prompt": r.prompt, "scores": {STRONG: float(s), WEAK: float(w)}, "source": r.task,
            "costs": {m: float(c) for m, c in costs.items() if c is not None and not math.isnan(c)},
        })
    return rows


def split(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(held-out 600 by prompt hash, the pool traffic is drawn from)."""
    order = np.argsort([prompt_unit(r["prompt"], HOLDOUT_SEED) for r in rows], kind="stable")
    hold = {int(i) for i in order[:HOLDOUT]}
    return [rows[i] for i in sorted(hold)], [r for i, r in enumerate(rows) if i not in hold]


def gateway_config(upstream_port: int, port: int, db: Path, encoder: str) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "backends": [{
            "name": "graded", "base_url": f"http://127.0.0.1:{upstream_port}/v1", "health": {"enabled": False},
            "models": [
                {"name": STRONG, "input_cost_per_mtok": PRICES[STRONG][0], "output_cost_per_mtok": PRICES[STRONG][1]},
                {"name": WEAK, "input_cost_per_mtok": PRICES[WEAK][0], "output_cost_per_mtok": PRICES[WEAK][1]},
                {"name": JUDGE},
            ],
        }],
        "routes": [{
            "name": "auto", "policy": "rules",
            "cost_quality": {"strong": STRONG, "weak": WEAK, "threshold": 0.5},
            "compare": {"share": 1.0, "judge": JUDGE, "max_concurrency": 64},
            "record": {"embedding": True},
        }],
        "classifiers": {"encoder": encoder},
        "store": {"kind": "sqlite", "path": str(db), "flush_interval": 0.2},
    }


def pointsman(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"pointsman {' '.join(args[:1])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


async def send(base_url: str, prompts: Sequence[str], concurrency: int = 4) -> None:
    """Chat completions for ``prompts`` through the gateway (``concurrency`` at a time)."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120) as client:
        async def one(text: str) -> None:
            async with limit:
                r = await client.post(f"{base_url}/v1/chat/completions",
                                      json={"model": "auto", "messages": [{"role": "user", "content": text}]})
                r.raise_for_status()
        await asyncio.gather(*(one(p) for p in prompts))


def labelled_requests(db: Path) -> int:
    """Requests the store holds a judge's score for both models of (what ``pointsman train`` learns from)."""
    with sqlite3.connect(db) as conn:
        return int(conn.execute(
            "SELECT count(*) FROM (SELECT request_id FROM feedback WHERE source = 'judge' AND model IN (?, ?) "
            "GROUP BY request_id HAVING count(DISTINCT model) = 2)", (STRONG, WEAK)
        ).fetchone()[0])


def wait_for_comparisons(db: Path, expected: int, quiet: float = 30.0) -> int:
    """Wait until ``expected`` requests are labelled, or none has been for ``quiet`` seconds (a
    comparison the gateway skipped, over a bound, never lands); returns the labelled requests stored."""
    seen, changed = -1, time.monotonic()
    while (now := labelled_requests(db)) < expected:
        if now != seen:
            seen, changed = now, time.monotonic()
        elif time.monotonic() - changed > quiet:
            break
        time.sleep(0.5)
    return labelled_requests(db)


def serve_until_labelled(base_url: str, db: Path, order: Sequence[str], sent: int, size: int) -> tuple[int, int]:
    """Send traffic from ``order[sent:]`` until the store holds ``size`` labelled requests.

    The gateway skips comparisons while its loop is busy (served requests first, comparisons from
    spare capacity), so n requests sent can leave fewer than n labelled; the learning curve's x is what
    was labelled, so the shortfall is topped up with more traffic. Returns (requests sent, labelled).
    """
    labelled = labelled_requests(db)
    while labelled < size and sent < len(order):
        batch = order[sent : sent + (size - labelled)]
        asyncio.run(send(base_url, batch))
        sent += len(batch)
        labelled = wait_for_comparisons(db, size)
    if labelled < size:
        print(f"  only {labelled} of {size} requests labelled after all {sent} sent", flush=True)
    return sent, labelled


def evaluate(config: Path, heldout: Path, out: Path, routers: Path | None) -> dict[str, Any]:
    """``pointsman eval`` on the held-out file; returns its report.json and per-prompt scores."""
    args = ["eval", "--config", str(config), "--route", "auto", "--data", f"file:{heldout}", "--out", str(out),
            "--bootstrap", "500", "--no-progress"]
    if routers is not None:
        args += ["--routers-dir", str(routers)]
    pointsman(*args)
    report = json.loads((out / "report.json").read_text())
    scores = [json.loads(line)["score"] for line in (out / "decisions.jsonl").read_text().splitlines()]
    return {"report": report, "scores": np.array(scores, dtype=float)}


def paired_difference(a: np.ndarray, b: np.ndarray, strong: np.ndarray, weak: np.ndarray,
                      resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """APGR(a) - APGR(b) on the same prompts, with a paired bootstrap 95% CI."""
    rng = np.random.default_rng(seed)
    point = evaluate_scores(a, strong, weak).apgr - evaluate_scores(b, strong, weak).apgr
    diffs = []
    for _ in range(resamples):
        i = rng.integers(0, len(a), len(a))
        if np.ptp(strong[i] - weak[i]) == 0:
            continue
        diffs.append(evaluate_scores(a[i], strong[i], weak[i]).apgr - evaluate_scores(b[i], strong[i], weak[i]).apgr)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def run_draw(draw: int, pool: list[dict[str, Any]], heldout_file: Path, args: argparse.Namespace,
             work: Path, outcomes: Path, shipped_scores: np.ndarray, strong: np.ndarray,
             weak: np.ndarray) -> list[dict[str, Any]]:
    """One traffic order: serve, retrain and evaluate after each size."""
    rng = np.random.default_rng(1000 + draw)
    order = [pool[i]["prompt"] for i in rng.permutation(len(pool))]  # the whole pool: top-ups draw on it
    root = work / f"draw{draw}"
    root.mkdir(parents=True, exist_ok=True)
    upstream_port, port = free_port(), free_port()
    db = root / "decisions.db"
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(gateway_config(upstream_port, port, db, args.encoder)))
    upstream = start([sys.executable, "-m", "tests.fakes.graded", "--table", str(outcomes), "--port",
                      str(upstream_port)], root / "upstream.log", cwd=ROOT)
    gateway = None
    cells = []
    try:
        wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", upstream, 30, log_path=root / "upstream.log")
        gateway = start([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
                        root / "gateway.log", cwd=root)
        wait_http(f"http://127.0.0.1:{port}/ready", gateway, 180, log_path=root / "gateway.log")
        sent = 0
        for size in args.sizes:
            t0 = time.perf_counter()
            sent, labelled = serve_until_labelled(f"http://127.0.0.1:{port}", db, order, sent, size)
            registry = root / f"routers-{size}"
            train = ["train", "--data", f"logs:sqlite:///{db}", "--encoders", args.encoder, "--out", str(registry),
                     "--seed", str(draw), "--no-progress"]
            train.append("--warm-start" if args.warm_start else "--no-warm-start")
            pointsman(*train)
            version = json.loads((registry / "active.json").read_text())["version"]
            result = evaluate(config, heldout_file, root / f"eval-{size}", registry / "versions" / version)
            if len(result["scores"]) != len(shipped_scores):  # eval left some out (e.g. the router's training data)
                raise SystemExit(f"pointsman eval scored {len(result['scores'])} of the {len(shipped_scores)} held-out "
                                 f"prompts ({result['report']['rows']['excluded']}): the paired comparison needs all")
            apgr = result["report"]["routers"]["router"]["apgr"]
            diff = paired_difference(result["scores"], shipped_scores, strong, weak, seed=draw)
            cells.append({"draw": draw, "labelled": size, "apgr": apgr["value"], "ci": apgr["ci"],
                          "vs_shipped": diff, "labelled_requests": labelled, "requests_sent": sent,
                          "seconds": round(time.perf_counter() - t0, 1)})
            print(f"draw {draw} n={size:4d}: APGR {apgr['value']:.3f} [{apgr['ci'][0]:.3f}, {apgr['ci'][1]:.3f}]"
                  f"  vs shipped {diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}]  ({labelled} labelled of {sent} "
                  "requests sent)", flush=True)
    finally:
        stop(gateway)
        stop(upstream)
    return cells


def summarise(cells: list[dict[str, Any]], sizes: Sequence[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        mine = [c for c in cells if c["labelled"] == size]
        rows.append({
            "labelled": size,
            "apgr": float(np.mean([c["apgr"] for c in mine])),
            "ci": [float(np.mean([c["ci"][0] for c in mine])), float(np.mean([c["ci"][1] for c in mine]))],
            "vs_shipped": [float(np.mean([c["vs_shipped"][k] for c in mine])) for k in range(3)],
            "requests_sent": float(np.mean([c["requests_sent"] for c in mine])),
            "draws": len(mine),
        })
    return rows


def plot(rows: list[dict[str, Any]], shipped: dict[str, Any], band: list[float], path: Path, encoder: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    x = [r["labelled"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.axhspan(band[0], band[1], color="0.85", label="random router, 95% band")
    ax.axhline(shipped["value"], color="tab:red", linestyle="--", label=f"shipped router ({shipped['value']:.3f})")
    ax.plot(x, [r["apgr"] for r in rows], marker="o", color="tab:blue", label="retrained from logged traffic")
    ax.fill_between(x, [r["ci"][0] for r in rows], [r["ci"][1] for r in rows], color="tab:blue", alpha=0.2,
                    label="95% CI (bootstrap over held-out prompts)")
    ax.axhline(0.60, color="tab:green", linestyle=":", label="target 0.60")
    ax.set_xscale("log")
    ax.set_xticks(x, [str(v) for v in x])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("labelled requests (logged traffic with judge comparisons)")
    ax.set_ylabel("held-out APGR (600 prompts)")
    ax.set_title(f"Adaptation to RouterBench GPT-4 vs Mixtral ({encoder} encoder)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="data directory (default: $POINTSMAN_DATA_DIR or ../shared/data)")
    parser.add_argument("--encoder", default="static", choices=("static", "minilm"))
    parser.add_argument("--sizes", type=int_list(), default=",".join(map(str, SIZES)))
    parser.add_argument("--repeats", type=int, default=1, help="traffic orders drawn (the table shows the mean)")
    parser.add_argument("--warm-start", action=argparse.BooleanOptionalAction, default=True,
                        help="train with the bundled data as a prior (pointsman train's default) or without")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(resolve_data_dir(args.data))
    heldout, pool = split(rows)
    heldout_file = args.out / "heldout.jsonl"
    heldout_file.write_text("".join(json.dumps(r) + "\n" for r in heldout))
    outcomes = args.out / "outcomes.json"
    outcomes.write_text(json.dumps({hashlib.sha256(r["prompt"].encode()).hexdigest(): r["scores"] for r in rows}))
    strong = np.array([r["scores"][STRONG] for r in heldout])
    weak = np.array([r["scores"][WEAK] for r in heldout])
    print(f"{len(rows)} RouterBench prompts with both outcomes: {len(heldout)} held out, {len(pool)} in the pool",
          flush=True)

    # The shipped router on the held-out prompts, through the same eval command.
    base = args.out / "shipped"
    base.mkdir(exist_ok=True)
    config = base / "config.yaml"
    config.write_text(yaml.safe_dump(gateway_config(1, 2, base / "unused.db", args.encoder)))
    shipped = evaluate(config, heldout_file, base / "eval", None)
    shipped_apgr = shipped["report"]["routers"]["router"]["apgr"]
    band = shipped["report"]["routers"]["random"]["apgr"]["ci"]
    print(f"shipped router: APGR {shipped_apgr['value']:.3f}; random band [{band[0]:.3f}, {band[1]:.3f}]", flush=True)

    cells: list[dict[str, Any]] = []
    for draw in range(args.repeats):
        cells += run_draw(draw, pool, heldout_file, args, args.out, outcomes, shipped["scores"], strong, weak)
    table = summarise(cells, args.sizes)
    result = {"encoder": args.encoder, "warm_start": args.warm_start, "heldout": len(heldout), "pool": len(pool),
              "shipped": shipped_apgr, "random_band": band, "curve": table, "cells": cells}
    (args.out / "adaptation.json").write_text(json.dumps(result, indent=2))
    plot(table, shipped_apgr, band, args.out / "adaptation.png", args.encoder)
    lines = [
        f"# Adaptation to RouterBench GPT-4 vs Mixtral ({args.encoder} encoder"
        + (", warm start" if args.warm_start else ", no warm start") + ")",
        "",
        f"Held-out: {len(heldout)} prompts (by prompt hash). Shipped router APGR {shipped_apgr['value']:.3f} "
        f"[{shipped_apgr['ci'][0]:.3f}, {shipped_apgr['ci'][1]:.3f}]; random router 95% band "
        f"[{band[0]:.3f}, {band[1]:.3f}]. {args.repeats} traffic order(s); means over them.",
        "",
        "| labelled requests | requests sent | APGR | 95% CI | minus shipped | 95% CI (paired) |",
        "|---:|---:|---:|---|---:|---|",
    ]
    for r in table:
        d = r["vs_shipped"]
        lines.append(f"| {r['labelled']} | {r['requests_sent']:.0f} | {r['apgr']:.3f} | [{r['ci'][0]:.3f}, "
                     f"{r['ci'][1]:.3f}] | {d[0]:+.3f} | [{d[1]:+.3f}, {d[2]:+.3f}] |")
    lines += ["", "![learning curve](adaptation.png)", ""]
    (args.out / "adaptation.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
