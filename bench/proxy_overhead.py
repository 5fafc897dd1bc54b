"""Proxy overhead: the same load direct to a fast fake upstream, through Pointsman, through LiteLLM.

One run (under 3 minutes on the 2-core machine) starts the fake upstream, a Pointsman gateway
(passthrough: a concrete model name, no routing policy) and LiteLLM's proxy (its own venv, see
``litellm_env.py``), then for each concurrency (1, 16, 64) and each round drives every target in
turn with the closed-loop load generator (``loadgen.py``, its own process). Rounds are interleaved
across targets so slow drift on the machine hits every target alike; medians over rounds are
reported.

Pinning (2 cores): fake upstream and load generator on core 0, the proxy under test on core 1
(both proxies sit on core 1; only one is loaded at a time). "Added" latency is the proxy's
percentile minus the direct percentile at the same concurrency.

Printed and written to ``bench/results/proxy_overhead.{md,json}``: RPS, p50, p99, added p50/p99,
the proxy's CPU time per request, Pointsman/LiteLLM ratios, and the acceptance targets:

* added p50 at c=1 <= 0.5 ms;
* Pointsman RPS >= 5x LiteLLM's at c=16;
* p99 at c=64 bounded: no errors, RPS at c=64 >= 80% of c=16 (no throughput collapse), and
  p99 <= 3x the mean latency Little's law gives for a closed loop (c / RPS).

Run: ``.venv/bin/python bench/proxy_overhead.py [--rounds 3 --duration 2 --no-litellm]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _procs
import litellm_env
from _args import int_list

MODEL = "fake-model"
RESULTS_DIR = _procs.BENCH_DIR / "results"
METRICS = (
    "rps",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "mean_ms",
    "proxy_cpu_us",
    "proxy_core",
    "loadgen_cpu",
    "foreign_cpu",
)


@dataclass
class Target:
    """One thing under load: its chat URL and the server process (None for direct)."""

    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    rounds: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# starting things


def pointsman_command() -> list[str]:
    """The ``pointsman`` console script next to this interpreter, else ``python -m gateway.cli``."""
    script = Path(sys.executable).with_name("pointsman")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "gateway.cli"]


def write_pointsman_config(path: Path, port: int, upstream_port: int, db_path: Path, store: str = "sqlite") -> Path:
    """The passthrough config: one fake backend, one model, SQLite decision store, no health checks."""
    store_line = f"{{kind: sqlite, path: {db_path}}}" if store == "sqlite" else f"{{kind: {store}}}"
    path.write_text(
        f"""server: {{host: 127.0.0.1, port: {port}}}
backends:
  - name: fake
    base_url: http://127.0.0.1:{upstream_port}/v1
    api_key: sk-fake
    models: [{{name: {MODEL}, input_cost_per_mtok: 1.0, output_cost_per_mtok: 2.0}}]
    health: {{enabled: false}}
store: {store_line}
"""
    )
    return path


def start_pointsman(tmp: Path, upstream_port: int, cpus: set[int] | None, store: str = "sqlite") -> tuple[Target, Path]:
    """Start ``pointsman serve`` with the passthrough config (does not wait for readiness)."""
    port = _procs.free_port()
    config = write_pointsman_config(tmp / "pointsman.yaml", port, upstream_port, tmp / "bench.db", store)
    log = tmp / "pointsman.log"
    cmd = [*pointsman_command(), "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    proc = _procs.start(cmd, log, cpus=cpus, cwd=_procs.REPO_ROOT)
    return Target("pointsman", f"http://127.0.0.1:{port}/v1/chat/completions", proc), log


def start_litellm(tmp: Path, upstream_port: int, cpus: set[int] | None) -> tuple[Target, Path]:
    """Start LiteLLM's proxy aimed at the fake upstream (does not wait for readiness)."""
    port = _procs.free_port()
    config = litellm_env.write_config(tmp / "litellm.yaml", f"http://127.0.0.1:{upstream_port}/v1", MODEL)
    log = tmp / "litellm.log"
    proc = litellm_env.start(port, config, log, cpus=cpus)
    return Target("litellm", f"http://127.0.0.1:{port}/v1/chat/completions", proc), log


# --------------------------------------------------------------------------------------------------
# measuring


def _busy_seconds() -> float:
    """CPU seconds spent busy on the whole machine so far (all cores, from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _procs.CLK_TCK


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cell(
    target: Target,
    c: int,
    args: argparse.Namespace,
    loadgen_cpus: set[int] | None,
    servers: list[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """Run one load-generator process against ``target``; add proxy CPU and background CPU."""
    cmd = [
        sys.executable,
        str(_procs.BENCH_DIR / "loadgen.py"),
        "--url",
        target.url,
        "-c",
        str(c),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--model",
        MODEL,
        "--json",
    ]
    if loadgen_cpus:
        cmd += ["--cpus", ",".join(str(x) for x in sorted(loadgen_cpus))]
    ours_before = sum(_procs.cpu_seconds(p.pid) for p in servers) + _children_cpu()
    busy_before, wall_before = _busy_seconds(), time.monotonic()
    proxy_before = _procs.cpu_seconds(target.proc.pid) if target.proc else 0.0
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=args.duration * 10 + 60)
    proxy_cpu = (_procs.cpu_seconds(target.proc.pid) - proxy_before) if target.proc else 0.0
    wall = time.monotonic() - wall_before
    ours = sum(_procs.cpu_seconds(p.pid) for p in servers) + _children_cpu() - ours_before
    foreign = max(0.0, _busy_seconds() - busy_before - ours) / wall
    if out.returncode != 0:
        raise RuntimeError(f"loadgen failed against {target.name} c={c}:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    sent = result["count"] + result["errors"] + result["warmup_count"]
    result["proxy_cpu_us"] = proxy_cpu / sent * 1e6 if target.proc and sent else 0.0
    # share of one core the proxy used while the load generator was sending (warmup + measured)
    loaded_s = result["warmup_s"] + result["elapsed_s"]
    result["proxy_core"] = proxy_cpu / loaded_s if target.proc and loaded_s > 0 else 0.0
    result["foreign_cpu"] = foreign
    return result


def summarize(target: Target, c: int) -> dict[str, Any]:
    """Medians over rounds of every metric; errors summed."""
    rounds = target.rounds[c]
    summary = {key: statistics.median(r[key] for r in rounds) for key in METRICS}
    summary["errors"] = sum(r["errors"] for r in rounds)
    summary["rps_spread"] = (max(r["rps"] for r in rounds) - min(r["rps"] for r in rounds)) / max(summary["rps"], 1e-9)
    first_errors = [r["first_error"] for r in rounds if r.get("first_error")]
    summary["first_error"] = first_errors[0] if first_errors else None
    return summary


# --------------------------------------------------------------------------------------------------
# reporting


def evaluate(table: dict[str, dict[int, dict[str, Any]]], concurrencies: list[int]) -> list[dict[str, Any]]:
    """The acceptance targets, each with its measured value and pass/fail (None when not measurable)."""
    checks: list[dict[str, Any]] = []
    ps, lite = table.get("pointsman"), table.get("litellm")
    if ps and 1 in concurrencies:
        added = ps[1]["added_p50_ms"]
        checks.append(
            {"target": "Pointsman added p50 at c=1 <= 0.5 ms", "value": f"{added:.3f} ms", "ok": added <= 0.5}
        )
    if ps and lite and 16 in concurrencies:
        ratio = ps[16]["rps"] / max(lite[16]["rps"], 1e-9)
        checks.append({"target": "Pointsman RPS >= 5x LiteLLM at c=16", "value": f"{ratio:.1f}x", "ok": ratio >= 5.0})
    if ps and 64 in concurrencies:
        row = ps[64]
        little = 64 / max(row["rps"], 1e-9) * 1000.0
        keep = row["rps"] / max(ps[16]["rps"], 1e-9) if 16 in ps else 1.0
        ok = row["errors"] == 0 and keep >= 0.8 and row["p99_ms"] <= 3 * little
        checks.append(
            {
                "target": "Pointsman p99 at c=64 bounded (no errors, RPS >= 80% of c=16, p99 <= 3x c/RPS)",
                "value": f"p99 {row['p99_ms']:.2f} ms, c/RPS {little:.2f} ms, RPS {keep:.0%} of c=16, "
                f"{row['errors']} errors",
                "ok": ok,
            }
        )
    return checks


def build_rows(targets: list[Target], concurrencies: list[int]) -> dict[str, dict[int, dict[str, Any]]]:
    table: dict[str, dict[int, dict[str, Any]]] = {}
    for target in targets:
        table[target.name] = {c: summarize(target, c) for c in concurrencies}
    direct = table.get("direct")
    for rows in table.values():
        for c, row in rows.items():
            base = direct[c] if direct else None
            row["added_p50_ms"] = row["p50_ms"] - base["p50_ms"] if base else float("nan")
            row["added_p99_ms"] = row["p99_ms"] - base["p99_ms"] if base else float("nan")
    return table


def render_markdown(
    table: dict[str, dict[int, dict[str, Any]]],
    concurrencies: list[int],
    checks: list[dict[str, Any]],
    meta: dict[str, Any],
) -> str:
    lines = [
        "# Proxy overhead",
        "",
        f"{meta['date']} - {meta['cpu']} x {meta['cores']} cores, Python {meta['python']}, "
        f"litellm {meta.get('litellm_version', '-')}",
        f"{meta['rounds']} rounds x {meta['duration']:g}s (+{meta['warmup']:g}s warmup) per cell, medians; "
        f"pinning: {meta['pinning']}; background CPU (other processes) in the kept cells: up to "
        f"{meta['max_foreign_cpu']:.0%} of one core ({meta['noisy_retries']} noisy cells re-run)",
        "",
        "| c | target | RPS | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy CPU us/req | proxy core | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in concurrencies:
        for name, rows in table.items():
            r = rows[c]
            added = "" if name == "direct" else f"{r['added_p50_ms']:.3f}"
            added99 = "" if name == "direct" else f"{r['added_p99_ms']:.3f}"
            cpu = "" if name == "direct" else f"{r['proxy_cpu_us']:.0f}"
            core = "" if name == "direct" else f"{r['proxy_core']:.0%}"
            lines.append(
                f"| {c} | {name} | {r['rps']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {added} | "
                f"{added99} | {cpu} | {core} | {r['errors']} |"
            )
    if "pointsman" in table and "litellm" in table:
        lines += [
            "",
            "| c | Pointsman/LiteLLM RPS | LiteLLM/Pointsman added p50 | LiteLLM/Pointsman CPU per request |",
            "|---:|---:|---:|---:|",
        ]
        for c in concurrencies:
            ps, lite = table["pointsman"][c], table["litellm"][c]
            lines.append(
                f"| {c} | {ps['rps'] / max(lite['rps'], 1e-9):.1f}x | "
                f"{lite['added_p50_ms'] / max(ps['added_p50_ms'], 1e-9):.1f}x | "
                f"{lite['proxy_cpu_us'] / max(ps['proxy_cpu_us'], 1e-9):.1f}x |"
            )
    if checks:
        lines += ["", "| target | measured | result |", "|---|---|---|"]
        lines += [f"| {ch['target']} | {ch['value']} | {'PASS' if ch['ok'] else 'FAIL'} |" for ch in checks]
    return "\n".join(lines) + "\n"


def print_rich(
    table: dict[str, dict[int, dict[str, Any]]],
    concurrencies: list[int],
    checks: list[dict[str, Any]],
    meta: dict[str, Any],
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    main = Table(title=f"Proxy overhead ({meta['rounds']} rounds x {meta['duration']:g}s, medians; {meta['pinning']})")
    for col in (
        "c",
        "target",
        "RPS",
        "p50 ms",
        "p99 ms",
        "added p50",
        "added p99",
        "proxy CPU us/req",
        "proxy core",
        "errors",
    ):
        main.add_column(col, justify="left" if col == "target" else "right", no_wrap=True)
    for c in concurrencies:
        for name, rows in table.items():
            r = rows[c]
            proxy = name != "direct"
            main.add_row(
                str(c),
                name,
                f"{r['rps']:.0f}",
                f"{r['p50_ms']:.3f}",
                f"{r['p99_ms']:.3f}",
                f"{r['added_p50_ms']:+.3f}" if proxy else "",
                f"{r['added_p99_ms']:+.3f}" if proxy else "",
                f"{r['proxy_cpu_us']:.0f}" if proxy else "",
                f"{r['proxy_core']:.0%}" if proxy else "",
                f"[red]{r['errors']}[/red]" if r["errors"] else "0",
                end_section=name == list(table)[-1],
            )
    console.print(main)
    if "pointsman" in table and "litellm" in table:
        ratios = Table(title="Pointsman vs LiteLLM")
        for col in ("c", "RPS ratio (P/L)", "added p50 ratio (L/P)", "CPU/req ratio (L/P)"):
            ratios.add_column(col, justify="right")
        for c in concurrencies:
            ps, lite = table["pointsman"][c], table["litellm"][c]
            ratios.add_row(
                str(c),
                f"{ps['rps'] / max(lite['rps'], 1e-9):.1f}x",
                f"{lite['added_p50_ms'] / max(ps['added_p50_ms'], 1e-9):.1f}x",
                f"{lite['proxy_cpu_us'] / max(ps['proxy_cpu_us'], 1e-9):.1f}x",
            )
        console.print(ratios)
    for ch in checks:
        mark = "[green]PASS[/green]" if ch["ok"] else "[red]FAIL[/red]"
        console.print(f"{mark}  {ch['target']}: {ch['value']}")
    if meta["max_foreign_cpu"] > 0.25:
        console.print(
            f"[yellow]warning: other processes used up to {meta['max_foreign_cpu']:.0%} of a core "
            "in a kept cell; numbers are noisy[/yellow]"
        )


# --------------------------------------------------------------------------------------------------


def _litellm_version() -> str:
    pip = litellm_env.VENV_DIR / "bin" / "python"
    out = subprocess.run(
        [str(pip), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    """Start everything, measure, print and write the results."""
    parser = argparse.ArgumentParser(description="proxy overhead: direct vs Pointsman vs LiteLLM")
    parser.add_argument("--concurrency", type=int_list(), default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per cell and round")
    parser.add_argument("--warmup", type=float, default=0.5, help="unrecorded seconds before each cell")
    parser.add_argument("--prime", type=float, default=1.5, help="unrecorded load on each proxy at start")
    parser.add_argument("--targets", default="direct,pointsman,litellm")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM (same as leaving it out of --targets)")
    parser.add_argument(
        "--pointsman-store",
        choices=("sqlite", "none"),
        default="sqlite",
        help="Pointsman's decision store (none: to see what recording costs)",
    )
    parser.add_argument(
        "--noise-limit",
        type=float,
        default=0.25,
        help="background CPU (cores) above which a cell counts as noisy and is run again",
    )
    parser.add_argument("--noisy-retries", type=int, default=2, help="extra attempts for a noisy cell")
    parser.add_argument(
        "--time-budget", type=float, default=170.0, help="re-run noisy cells only while the run fits in this (s)"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--keep-logs", action="store_true", help="print where the server logs are kept")
    args = parser.parse_args(argv)

    started = time.monotonic()
    concurrencies = args.concurrency
    wanted = [t for t in args.targets.split(",") if t and not (args.no_litellm and t == "litellm")]
    pin = not args.no_pin and _procs.cpu_count() >= 2
    side_cpus, proxy_cpus = ({0}, {1}) if pin else (None, None)
    pinning = "upstream+loadgen on core 0, proxy on core 1" if pin else "not pinned"

    tmp_dir = tempfile.mkdtemp(prefix="bench-overhead-")
    tmp = Path(tmp_dir)
    servers: list[subprocess.Popen[bytes]] = []
    targets: list[Target] = []
    try:
        up_port = _procs.free_port()
        up_log = tmp / "upstream.log"
        upstream = _procs.start(
            [sys.executable, str(_procs.BENCH_DIR / "fake_upstream.py"), "--port", str(up_port)], up_log, cpus=side_cpus
        )
        servers.append(upstream)
        direct = Target("direct", f"http://127.0.0.1:{up_port}/v1/chat/completions")
        waits: list[tuple[Target, Path]] = []
        if "pointsman" in wanted:
            waits.append(start_pointsman(tmp, up_port, proxy_cpus, args.pointsman_store))
        if "litellm" in wanted:
            litellm_env.ensure_installed()
            waits.append(start_litellm(tmp, up_port, proxy_cpus))
        servers += [t.proc for t, _ in waits if t.proc]
        _procs.wait_http(f"http://127.0.0.1:{up_port}/v1/models", upstream, 15, log_path=up_log)
        if "direct" in wanted:
            targets.append(direct)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        for target, log in waits:
            _procs.wait_http(target.url, target.proc, 120, body=body, log_path=log)
            targets.append(target)
        print(
            f"servers ready after {time.monotonic() - started:.1f}s: " + ", ".join(t.name for t in targets), flush=True
        )
        # LiteLLM imports much of itself lazily on its first requests; a short unrecorded load on
        # every proxy first keeps that one-time cost out of the first measured round.
        prime = argparse.Namespace(duration=0.2, warmup=args.prime)
        for target in targets:
            if target.proc is not None and args.prime > 0:
                run_cell(target, 8, prime, side_cpus, servers)

        max_foreign = 0.0
        retried = cells_done = 0
        total_cells = len(concurrencies) * args.rounds * len(targets)
        measuring_since = time.monotonic()
        for c in concurrencies:
            for round_no in range(args.rounds):
                for target in targets:
                    result = run_cell(target, c, args, side_cpus, servers)
                    # This machine is shared: when other processes took a real share of the CPU
                    # during a cell, run it again (bounded) and keep the quietest attempt.
                    cells_done += 1
                    for _ in range(args.noisy_retries):
                        cell_s = (time.monotonic() - measuring_since) / (cells_done + retried)
                        projected = time.monotonic() - started + cell_s * (total_cells - cells_done + 1)
                        if result["foreign_cpu"] <= args.noise_limit or projected > args.time_budget:
                            break
                        retried += 1
                        again = run_cell(target, c, args, side_cpus, servers)
                        result = min(result, again, key=lambda r: r["foreign_cpu"])
                    target.rounds.setdefault(c, []).append(result)
                    max_foreign = max(max_foreign, result["foreign_cpu"])
                    print(
                        f"  c={c:<3d} round {round_no + 1} {target.name:10s} rps={result['rps']:8.0f} "
                        f"p50={result['p50_ms']:.3f}ms p99={result['p99_ms']:.3f}ms "
                        f"errors={result['errors']}"
                        + (f" ({result['first_error']})" if result.get("first_error") else ""),
                        flush=True,
                    )
    finally:
        for proc in reversed(servers):
            _procs.stop(proc)
        if args.keep_logs:
            print(f"server logs kept in {tmp}")
        else:
            for path in tmp.iterdir():
                path.unlink()
            tmp.rmdir()

    table = build_rows(targets, concurrencies)
    checks = evaluate(table, concurrencies)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _procs.cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "duration": args.duration,
        "warmup": args.warmup,
        "pinning": pinning,
        "max_foreign_cpu": max_foreign,
        "noisy_retries": retried,
        "elapsed_s": time.monotonic() - started,
    }
    if "litellm" in table:
        meta["litellm_version"] = _litellm_version()
    print_rich(table, concurrencies, checks, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "proxy_overhead.md").write_text(render_markdown(table, concurrencies, checks, meta))
    raw = {t.name: {str(c): t.rounds[c] for c in concurrencies} for t in targets}
    summary = {name: {str(c): row for c, row in rows.items()} for name, rows in table.items()}
    (args.out / "proxy_overhead.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "checks": checks, "rounds": raw}, indent=2)
    )
    print(f"wrote {args.out / 'proxy_overhead.md'} and .json in {time.monotonic() - started:.0f}s total")
    return 0 if all(ch["ok"] for ch in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
