"""Rate-limit and budget overhead: the same gateway with and without ``limits`` / ``budgets``, side by side.

Two Pointsman gateways, identical (auth with the load generator's key ``sk-bench``, ``shared_state`` on
the Redis at ``--redis``, a concrete fake model) but for the key's ``limits`` (requests and tokens per
minute) and ``budgets`` (day and month), serve the fast fake upstream (``fake_upstream.py``). Limits and
budgets are set far above the load, so nothing is refused: the "limits" gateway pays one Redis round
trip (the ``RESERVE`` script: two GCRA buckets and two budget counters) before forwarding each request,
and one more (``SETTLE``) after answering it, off the request's path.

Pinning (2 cores): fake upstream and load generator on core 0, both gateways on core 1 (only one is
loaded at a time); Redis is not pinned. Rounds are interleaved (off, limits, off, ...) and medians
reported. Upstream latency 0 ms by default (the gateway's own cost is all there is to see).

Target: the p50 at c=1 moves by <= 0.5 ms (issue 14). Printed and written to
``bench/results/limits_overhead.{md,json}``.

Run: ``.venv/bin/python bench/limits_overhead.py [--concurrency 1,16 --rounds 5 --duration 3 --redis URL]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import _procs
from _args import int_list
from _cells import Gateway, run_cell, summarize
from _cells import start_gateway as start_process

RESULTS_DIR = _procs.BENCH_DIR / "results"
MODEL = "fake-model"
TARGET_P50_MS = 0.5


def write_config(path: Path, port: int, upstream_port: int, db: Path, redis_url: str, prefix: str,
                 limits: bool) -> Path:
    import hashlib

    digest = hashlib.sha256(b"sk-bench").hexdigest()
    quota = (
        "    limits: {requests_per_minute: 10000000, tokens_per_minute: 1000000000}\n"
        "    budgets: [{period: day, usd: 1000000}, {period: month, usd: 1000000}]\n"
        if limits else ""
    )
    path.write_text(
        f"""server: {{host: 127.0.0.1, port: {port}}}
auth:
  api_keys:
  - name: bench
    sha256: {digest}
{quota}backends:
  - name: fake
    base_url: http://127.0.0.1:{upstream_port}/v1
    health: {{enabled: false}}
    models:
      - {{name: {MODEL}, input_cost_per_mtok: 2.5, output_cost_per_mtok: 10.0}}
store: {{kind: sqlite, path: {db}}}
shared_state: {{kind: redis, url: "{redis_url}", key_prefix: "{prefix}"}}
"""
    )
    return path


def start_gateway(name: str, tmp: Path, upstream_port: int, redis_url: str, prefix: str,
                  cpus: set[int] | None) -> Gateway:
    port = _procs.free_port()
    config = write_config(tmp / f"{name}.yaml", port, upstream_port, tmp / f"{name}.db", redis_url, prefix,
                          name == "limits")
    return start_process(name, config, port, tmp / f"{name}.log", cpus)


def refused(gateway: Gateway) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{gateway.port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("pointsman_quota_refused_total{", "pointsman_shared_state_unavailable_total{")))


def render(table: dict[int, dict[str, dict[str, Any]]], checks: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Rate-limit and budget overhead",
        "",
        f"{meta['date']} - {meta['cpu']} x {meta['cores']} cores, Python {meta['python']}; "
        f"{meta['rounds']} rounds x {meta['duration']:g}s (+{meta['warmup']:g}s warmup) per cell, interleaved, "
        f"medians; pinning: {meta['pinning']}; upstream delay {meta['delay_ms']:g} ms; Redis {meta['redis']}; "
        f"machine load average at start {meta['load_at_start']:.1f}",
        "limits gateway: the key has requests and tokens per minute and a day and a month budget (never reached); "
        "off gateway: the same key without them. Both: shared_state redis, auth on.",
        "",
        "| c | gateway | RPS | p50 ms | p90 ms | p99 ms | gateway CPU us/req | errors | p50 added |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, rows in table.items():
        base = rows["off"]["p50_ms"]
        for name, r in rows.items():
            added = "" if name == "off" else f"{r['p50_ms'] - base:+.3f} ms"
            lines.append(
                f"| {c} | {name} | {r['rps']:.0f} | {r['p50_ms']:.3f} | {r['p90_ms']:.3f} | {r['p99_ms']:.3f} | "
                f"{r['gateway_cpu_us']:.0f} | {r['errors']} | {added} |"
            )
    lines += ["", "| target | measured | result |", "|---|---|---|"]
    verdicts = {True: "PASS", False: "FAIL", None: "-"}
    lines += [f"| {ch['target']} | {ch['value']} | {verdicts[ch['ok']]} |" for ch in checks]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="p50 with rate limits + budgets on Redis vs without")
    parser.add_argument("--concurrency", type=int_list(), default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    concurrencies = args.concurrency

    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    pin = not args.no_pin and _procs.cpu_count() >= 2
    side, gateway_cpus = ({0}, {1}) if pin else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    prefix = f"pointsman-bench-{uuid.uuid4().hex[:8]}:"
    servers: list[subprocess.Popen[bytes]] = []
    try:
        up_port = _procs.free_port()
        upstream = _procs.start(
            [sys.executable, str(_procs.BENCH_DIR / "fake_upstream.py"), "--port", str(up_port),
             "--delay-ms", str(args.delay_ms)], tmp / "upstream.log", cpus=side,
        )
        servers.append(upstream)
        gateways = [start_gateway(name, tmp, up_port, args.redis, prefix, gateway_cpus) for name in ("off", "limits")]
        servers += [g.proc for g in gateways]
        _procs.wait_http(f"http://127.0.0.1:{up_port}/v1/models", upstream, 15, log_path=tmp / "upstream.log")
        for gateway in gateways:
            _procs.wait_http(f"http://127.0.0.1:{gateway.port}/health", gateway.proc, 120, log_path=gateway.log)
        prime = argparse.Namespace(duration=0.3, warmup=1.0)
        for gateway in gateways:
            run_cell(gateway, 8, MODEL, prime, side)
        for c in concurrencies:
            for round_no in range(args.rounds):
                for gateway in gateways:
                    result = run_cell(gateway, c, MODEL, args, side)
                    gateway.rounds.setdefault(c, []).append(result)
                    print(f"  c={c:<3d} round {round_no + 1} {gateway.name:7s} rps={result['rps']:7.0f} "
                          f"p50={result['p50_ms']:.3f}ms p99={result['p99_ms']:.3f}ms errors={result['errors']}",
                          flush=True)
        refusals = refused(gateways[1])
    finally:
        for proc in reversed(servers):
            _procs.stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        _drop_keys(args.redis, prefix)

    table = {c: {g.name: summarize(g.rounds[c]) for g in gateways} for c in concurrencies}
    checks = []
    for c, rows in table.items():
        added = rows["limits"]["p50_ms"] - rows["off"]["p50_ms"]
        ok = added <= TARGET_P50_MS if c == 1 else None
        label = "p50 added by limits + budgets on Redis" + (f" <= {TARGET_P50_MS} ms" if c == 1 else " (info)")
        checks.append({"target": f"{label} (c={c})", "value": f"{added:+.3f} ms", "ok": ok})
    checks.append({"target": "no request refused or metered without Redis", "value": f"{refusals:.0f}",
                   "ok": refusals == 0})
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": _procs.cpu_model(),
        "cores": _procs.cpu_count(), "python": platform.python_version(), "rounds": args.rounds,
        "duration": args.duration, "warmup": args.warmup, "delay_ms": args.delay_ms, "redis": args.redis,
        "pinning": "upstream+loadgen on core 0, gateways on core 1 (Redis unpinned)" if pin else "not pinned",
        "load_at_start": load_at_start, "elapsed_s": time.monotonic() - started,
    }
    report = render(table, checks, meta)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "limits_overhead.md").write_text(report)
    (args.out / "limits_overhead.json").write_text(json.dumps(
        {"meta": meta, "checks": checks, "table": {str(c): rows for c, rows in table.items()},
         "rounds": {g.name: {str(c): g.rounds[c] for c in concurrencies} for g in gateways}}, indent=2))
    return 0 if all(ch["ok"] is not False for ch in checks) else 1


def _drop_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
