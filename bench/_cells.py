"""A gateway under test as a subprocess, and one load-generator cell against it (``loadgen.py``).

Shared by the side-by-side overhead benches (``compare_overhead.py``, ``limits_overhead.py``): start
each gateway variant from its config, run the same cells against each, take medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _procs

#: What a cell's summary takes the median of over rounds.
SUMMARY_KEYS = ("rps", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "gateway_cpu_us")


@dataclass
class Gateway:
    """One gateway process under test and its results per concurrency (a list of rounds)."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    rounds: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


def start_gateway(name: str, config: Path, port: int, log: Path, cpus: set[int] | None) -> Gateway:
    """``pointsman serve --config config`` (listening on ``port``, as the config says), pinned to ``cpus``."""
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
    return Gateway(name, port, _procs.start(cmd, log, cpus=cpus, cwd=_procs.REPO_ROOT), log)


def run_cell(gateway: Gateway, c: int, model: str, args: argparse.Namespace, cpus: set[int] | None) -> dict[str, Any]:
    """One loadgen run at concurrency ``c`` (``args.duration``, ``args.warmup``), plus the gateway's CPU
    time per request sent (its whole process tree)."""
    cmd = [
        sys.executable, str(_procs.BENCH_DIR / "loadgen.py"), "--url", gateway.url, "-c", str(c),
        "--duration", str(args.duration), "--warmup", str(args.warmup), "--model", model, "--json",
    ]
    if cpus:
        cmd += ["--cpus", ",".join(str(x) for x in sorted(cpus))]
    before = _procs.cpu_seconds(gateway.proc.pid)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=args.duration * 10 + 60)
    if out.returncode != 0:
        raise RuntimeError(f"loadgen failed against {gateway.name} c={c}:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    sent = result["count"] + result["errors"] + result["warmup_count"]
    result["gateway_cpu_us"] = (_procs.cpu_seconds(gateway.proc.pid) - before) / max(sent, 1) * 1e6
    return result


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of :data:`SUMMARY_KEYS`, and the errors of all rounds."""
    summary: dict[str, Any] = {key: statistics.median(r[key] for r in rounds) for key in SUMMARY_KEYS}
    summary["errors"] = sum(r["errors"] for r in rounds)
    return summary
