"""Which async HTTP client should the gateway use upstream? Measure them doing the proxy's job.

Each client variant runs in its own process (pinned to one core, as the gateway would be), drives
the fast fake upstream (pinned to the other core) with ``c`` closed-loop concurrent POSTs of a chat
request for a fixed time, and reads every answer in full. Reported: requests per second, latency
p50/p99, and the client process's CPU time per request (the number that decides how much of the
gateway's one core the upstream call eats).

Variants:

* ``aiohttp``          ClientSession + TCPConnector(limit=1000), what gateway/upstream.py used until 2026-12-07
* ``http1``            the gateway's own keep-alive HTTP/1.1 client (``gateway/http1.py``), what it uses now
* ``httpx``            httpx.AsyncClient() defaults (max 100 connections, 20 kept alive)
* ``httpx-bigpool``    httpx with Limits(1000, 1000): the "large keep-alive pool" setting
* ``httpx-sharded``    8 httpx clients with small pools, round-robin: keeps the pool scans short
* ``httpx2``           httpx2.AsyncClient() defaults (the maintained fork; same default limits)
* ``httpx2-bigpool``   httpx2 with Limits(1000, 1000)

Run: ``python bench/upstream_client.py [--duration 2 --rounds 2 --concurrency 1,16,64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import _procs
from _args import int_list
from loadgen import chat_body, percentile

VARIANTS = ("http1", "aiohttp", "httpx", "httpx-bigpool", "httpx-sharded", "httpx2", "httpx2-bigpool")
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-fake"}


async def _make_sender(variant: str, url: str, body: bytes, stack: AsyncExitStack) -> Callable[[], Awaitable[int]]:
    """Build ``send()`` for one variant: POST ``body``, read the whole answer, return the status."""
    if variant == "aiohttp":
        import aiohttp

        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=60))
        )

        async def send_aiohttp() -> int:
            async with session.post(url, data=body, headers=HEADERS) as resp:
                await resp.read()
                return resp.status

        return send_aiohttp

    if variant == "http1":
        from gateway.http1 import Http1Pool

        pool = Http1Pool()
        stack.push_async_callback(pool.close)

        async def send_http1() -> int:
            resp = await pool.request("POST", url, HEADERS, body)
            while await resp.readany():
                pass
            return resp.status

        return send_http1

    hx: Any
    if variant.startswith("httpx2"):
        import httpx2

        hx = httpx2
    else:
        import httpx

        hx = httpx
    if variant in ("httpx", "httpx2"):
        clients = [await stack.enter_async_context(hx.AsyncClient())]
    elif variant.endswith("-bigpool"):
        limits = hx.Limits(max_connections=1000, max_keepalive_connections=1000)
        clients = [await stack.enter_async_context(hx.AsyncClient(limits=limits))]
    elif variant == "httpx-sharded":
        limits = hx.Limits(max_connections=128, max_keepalive_connections=128)
        clients = [await stack.enter_async_context(hx.AsyncClient(limits=limits)) for _ in range(8)]
    else:
        raise ValueError(f"unknown variant {variant!r}")
    turn = [0]

    async def send_httpx() -> int:
        turn[0] += 1
        client = clients[turn[0] % len(clients)]
        resp = await client.post(url, content=body, headers=HEADERS)
        return int(resp.status_code)

    return send_httpx


async def _drive(variant: str, url: str, concurrency: int, duration: float, warmup: float) -> dict[str, Any]:
    body = chat_body("fake-model")
    latencies: list[float] = []
    errors = 0
    async with AsyncExitStack() as stack:
        send = await _make_sender(variant, url, body, stack)

        async def worker(deadline: float, record: bool) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                try:
                    status = await send()
                except Exception:  # counted, the run goes on
                    status = 0
                if record:
                    if status == 200:
                        latencies.append((time.perf_counter() - start) * 1000.0)
                    else:
                        errors += 1

        deadline = time.perf_counter() + warmup
        await asyncio.gather(*(worker(deadline, False) for _ in range(concurrency)))
        cpu0 = _procs.cpu_seconds(os.getpid())
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(t0 + duration, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        cpu = _procs.cpu_seconds(os.getpid()) - cpu0
    latencies.sort()
    return {
        "variant": variant,
        "concurrency": concurrency,
        "count": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "cpu_us_per_req": cpu / max(1, len(latencies)) * 1e6,
        "cpu_util": cpu / elapsed,
    }


def _worker_main(args: argparse.Namespace) -> int:
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(_drive(args.worker, args.url, args.c, args.duration, args.warmup))
    print(json.dumps(result))
    return 0


def _run_cell(variant: str, url: str, c: int, duration: float, warmup: float, cpu: int | None) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        variant,
        "--url",
        url,
        "--c",
        str(c),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
    ]

    def _pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    out = subprocess.run(cmd, capture_output=True, text=True, check=False, preexec_fn=_pin, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} c={c} failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    """Start the fake upstream, measure every variant at every concurrency, print a table."""
    parser = argparse.ArgumentParser(description="compare upstream HTTP clients")
    parser.add_argument("--concurrency", type=int_list(), default="1,16,64")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=2, help="repeats per cell; medians are reported")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--json-out", type=Path, default=None)
    # worker mode (internal)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--c", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker_main(args)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    pin = not args.no_pin and _procs.cpu_count() >= 2
    upstream_cpus, client_cpu = ({0}, 1) if pin else (None, None)
    concurrencies = args.concurrency
    variants = []
    for variant in (v for v in args.variants.split(",") if v):
        module = {"aiohttp": "aiohttp", "http1": "httptools"}.get(variant, variant.split("-")[0])
        if importlib.util.find_spec(module) is None:
            console.print(f"[yellow]skipping {variant}: {module} is not installed[/yellow]")
        else:
            variants.append(variant)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        port = _procs.free_port()
        log = Path(tmp) / "upstream.log"
        upstream = _procs.start(
            [sys.executable, str(_procs.BENCH_DIR / "fake_upstream.py"), "--port", str(port)],
            log,
            cpus=upstream_cpus,
        )
        try:
            _procs.wait_http(f"http://127.0.0.1:{port}/v1/models", upstream, 15, log_path=log)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            for c in concurrencies:
                for variant in variants:
                    rounds = [
                        _run_cell(variant, url, c, args.duration, args.warmup, client_cpu) for _ in range(args.rounds)
                    ]
                    merged = {
                        key: statistics.median(r[key] for r in rounds)
                        for key in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req", "cpu_util")
                    }
                    merged.update(variant=variant, concurrency=c, errors=sum(r["errors"] for r in rounds))
                    results.append(merged)
                    console.print(
                        f"  {variant:15s} c={c:<3d} rps={merged['rps']:7.0f} "
                        f"p50={merged['p50_ms']:.3f}ms cpu/req={merged['cpu_us_per_req']:.0f}us"
                    )
        finally:
            _procs.stop(upstream)

    table = Table(
        title="Upstream HTTP client, driving the fake upstream (medians of "
        f"{args.rounds} x {args.duration:g}s; client on 1 core)"
    )
    for col in ("client", "c", "RPS", "p50 ms", "p99 ms", "CPU us/req", "client CPU", "errors"):
        table.add_column(col, justify="left" if col == "client" else "right", no_wrap=True)
    for r in results:
        table.add_row(
            r["variant"],
            str(r["concurrency"]),
            f"{r['rps']:.0f}",
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['cpu_us_per_req']:.0f}",
            f"{r['cpu_util']:.0%}",
            str(r["errors"]),
        )
    console.print(table)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
