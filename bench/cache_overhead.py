"""Response-cache overhead at c=1: what a cache hit costs in gateway time, beside the routing decision.

One Pointsman gateway (static encoder; SQLite store) serves three copies of the same ``rules`` route
(cost-quality knob on the difficulty head): ``auto`` (no cache), ``auto-exact`` (``cache: {}``) and
``auto-sem`` (``cache: {mode: semantic}``), in front of the fast fake upstream (``fake_upstream.py``,
0 ms). One client sends sequential requests (c=1) on one keep-alive connection, kinds interleaved in
rounds, and the medians of the rounds are reported:

* ``route``: ``POST /v1/route`` with the request: the routing decision alone (auth, body, the policy's
  signals and decision) and no backend call — the baseline of ``hit-exact``.
* ``route-var``: ``POST /v1/route`` with the near-duplicates of ``hit-sem`` (each a new text, so the
  routing encoder's LRU cache misses as it does for them) — the baseline of ``hit-sem``.
* ``hit-exact``: the same request on ``auto-exact``, primed: decision + key + lookup + replay.
* ``hit-sem``: near-duplicates on ``auto-sem`` whose exact key misses (each text differs, so the
  encoder's own LRU cache misses too) and whose embedding matches the primed entry: decision + key +
  exact lookup + one encoder pass + the similarity search + replay.
* ``forward``: the same request on ``auto`` (no cache), a real upstream call.

What is compared, and why: a hit's whole life is inside the gateway (no upstream), so its client wall
time minus ``/v1/route``'s, over the same connection and body, is the cache's cost beyond the decision
(``/v1/route`` also renders a longer explanation, so this slightly understates it). Two more views
bound it from the inside: ``lookup_ms`` (the cache's own time per request, stored in the decision record:
keys, store lookup, embedding, search) and ``x-pointsman-overhead-ms`` (gateway time, upstream waits
excluded) of a hit against a forwarded request. Target: hit - route <= 0.5 ms at p50 (static encoder).

Pinning (2 cores): client and fake upstream on core 0, gateway on core 1.
Printed and written to ``bench/results/cache_overhead.{md,json}``.

Run: ``.venv/bin/python bench/cache_overhead.py [--requests 300 --rounds 5]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _procs
import httpx

RESULTS_DIR = _procs.BENCH_DIR / "results"
TARGET_MS = 0.5
SYSTEM = "You are a helpful assistant for a travel agency. Answer briefly."
QUESTION = "What documents do I need to travel from France to Japan for two weeks?"
KINDS = ("route", "hit-exact", "route-var", "hit-sem", "forward")


def write_config(path: Path, port: int, upstream_port: int, db: Path) -> Path:
    route = ("    policy: rules\n"
             "    cost_quality: {signal: difficulty, strong: strong-model, weak: weak-model, threshold: 0.5}\n")
    path.write_text(
        f"""server: {{host: 127.0.0.1, port: {port}}}
backends:
  - name: fake
    base_url: http://127.0.0.1:{upstream_port}/v1
    health: {{enabled: false}}
    models:
      - {{name: strong-model, input_cost_per_mtok: 5.0, output_cost_per_mtok: 15.0}}
      - {{name: weak-model, input_cost_per_mtok: 0.2, output_cost_per_mtok: 0.6}}
classifiers: {{encoder: static}}
store: {{kind: sqlite, path: {db}, flush_interval: 0.2}}
routes:
  - name: auto
{route}  - name: auto-exact
{route}    cache: {{}}
  - name: auto-sem
{route}    cache: {{mode: semantic}}
"""
    )
    return path


def body(route: str, question: str = QUESTION) -> dict[str, Any]:
    return {"model": route, "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}


def variant(i: int) -> str:
    """A near-duplicate of QUESTION with its own text (trailing spaces, case): a semantic, not exact, match."""
    base = QUESTION.lower() if i % 2 else QUESTION
    return base + " " * (1 + i % 7) + "?" * (i // 7 % 3)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_kind(client: httpx.Client, base: str, kind: str, n: int, offset: int) -> dict[str, Any]:
    walls: list[float] = []
    overheads: list[float] = []
    ids: list[str] = []
    for i in range(n):
        if kind == "route":
            url, payload = f"{base}/v1/route", body("auto-exact")
        elif kind == "route-var":
            url, payload = f"{base}/v1/route", body("auto-sem", variant(offset + i))
        elif kind == "hit-exact":
            url, payload = f"{base}/v1/chat/completions", body("auto-exact")
        elif kind == "hit-sem":
            url, payload = f"{base}/v1/chat/completions", body("auto-sem", variant(offset + i))
        else:
            url, payload = f"{base}/v1/chat/completions", body("auto")
        started = time.perf_counter()
        response = client.post(url, json=payload)
        walls.append((time.perf_counter() - started) * 1000.0)
        if response.status_code != 200:
            raise RuntimeError(f"{kind}: HTTP {response.status_code}: {response.text[:300]}")
        if kind.startswith("hit") and response.headers.get("x-pointsman-cache") != "hit":
            raise RuntimeError(f"{kind}: expected a cache hit, got {response.headers.get('x-pointsman-cache')}")
        if not kind.startswith("route") and "x-pointsman-overhead-ms" in response.headers:
            overheads.append(float(response.headers["x-pointsman-overhead-ms"]))
        ids.append(response.headers["x-pointsman-request-id"])
    out: dict[str, Any] = {"wall_p50": percentile(walls, 0.5), "wall_p99": percentile(walls, 0.99),
                           "wall_mean": statistics.fmean(walls), "ids": ids}
    if overheads:
        out["overhead_p50"] = percentile(overheads, 0.5)
        out["overhead_p99"] = percentile(overheads, 0.99)
    return out


def lookup_ms(db: Path, ids: list[str]) -> list[float]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            f"SELECT decision FROM decisions WHERE request_id IN ({','.join('?' * len(ids))})", ids
        ).fetchall()
    finally:
        con.close()
    return [float(json.loads(r[0])["cache"]["lookup_ms"]) for r in rows if r[0] and "cache" in json.loads(r[0])]


def render(summary: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    lines = [
        "# Response-cache overhead (c=1, static encoder)",
        "",
        f"{meta['date']} · {meta['cpu']} · {meta['cores']} cores · {meta['requests']} requests x {meta['rounds']} "
        "rounds per kind, medians of the rounds",
        "",
        "| kind | wall p50 (ms) | wall p99 (ms) | gateway time p50 (ms) | lookup_ms p50 / p99 |",
        "|---|---|---|---|---|",
    ]
    for kind in KINDS:
        s = summary[kind]
        gw = f"{s['overhead_p50']:.3f}" if "overhead_p50" in s else "-"
        lk = f"{s['lookup_p50']:.3f} / {s['lookup_p99']:.3f}" if "lookup_p50" in s else "-"
        lines.append(f"| {kind} | {s['wall_p50']:.3f} | {s['wall_p99']:.3f} | {gw} | {lk} |")
    lines += [
        "",
        f"- exact hit - /v1/route, wall p50: **{meta['exact_minus_route']:+.3f} ms**",
        f"- semantic hit - /v1/route (same near-duplicate texts), wall p50: **{meta['sem_minus_route']:+.3f} ms**",
        f"- target: <= {TARGET_MS} ms -> {'PASS' if meta['pass'] else 'FAIL'}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per kind per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args(argv)
    cores = _procs.cpu_count()
    side = None if args.no_pin or cores < 2 else {0}
    gw_cpus = None if side is None else {1}
    tmp = Path(tempfile.mkdtemp(prefix="pointsman-cache-bench-"))
    upstream_port, port = _procs.free_port(), _procs.free_port()
    upstream = _procs.start([sys.executable, str(_procs.BENCH_DIR / "fake_upstream.py"), "--port", str(upstream_port)],
                            tmp / "upstream.log", cpus=side)
    db = tmp / "decisions.db"
    config = write_config(tmp / "config.yaml", port, upstream_port, db)
    gateway = _procs.start([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)], tmp / "gw.log",
                           cpus=gw_cpus, cwd=_procs.REPO_ROOT)
    if side is not None:
        os.sched_setaffinity(0, side)
    base = f"http://127.0.0.1:{port}"
    try:
        _procs.wait_http(f"{base}/health", gateway, 120, log_path=tmp / "gw.log")
        with httpx.Client(timeout=30) as client:
            for route in ("auto-exact", "auto-sem"):  # prime the entries
                primed = client.post(f"{base}/v1/chat/completions", json=body(route))
                assert primed.status_code == 200, primed.text
            time.sleep(0.2)
            for kind in KINDS:  # warm-up
                run_kind(client, base, kind, 100, 10_000)
            rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
            for r in range(args.rounds):
                for kind in KINDS:
                    rounds[kind].append(run_kind(client, base, kind, args.requests, r * args.requests))
        time.sleep(1.0)  # the decision records are flushed
        summary: dict[str, dict[str, float]] = {}
        for kind, results in rounds.items():
            s = {key: statistics.median(r[key] for r in results) for key in results[0] if key != "ids"}
            if kind.startswith("hit"):
                looked = lookup_ms(db, [i for r in results for i in r["ids"]])
                s["lookup_p50"], s["lookup_p99"] = percentile(looked, 0.5), percentile(looked, 0.99)
            summary[kind] = s
    finally:
        _procs.stop(gateway)
        _procs.stop(upstream)
    exact_minus = summary["hit-exact"]["wall_p50"] - summary["route"]["wall_p50"]
    sem_minus = summary["hit-sem"]["wall_p50"] - summary["route-var"]["wall_p50"]
    meta = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": _procs.cpu_model(),
            "cores": cores, "requests": args.requests, "rounds": args.rounds, "exact_minus_route": exact_minus,
            "sem_minus_route": sem_minus, "pass": max(exact_minus, sem_minus) <= TARGET_MS}
    text = render(summary, meta)
    print(text)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "cache_overhead.md").write_text(text)
    (RESULTS_DIR / "cache_overhead.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=2))
    return 0 if meta["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
