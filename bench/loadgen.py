"""Closed-loop HTTP load generator for the proxy benchmarks.

``concurrency`` workers each keep one keep-alive connection and send the next request as soon as the
previous answer has been read completely, for a fixed duration (after a warmup whose samples are
dropped) or a fixed request count. It records every request's latency and reports requests per
second, latency percentiles, errors, and its own CPU use (so a saturated load generator is visible
instead of silently capping the numbers).

It uses aiohttp with one ``TCPConnector`` sized to the concurrency, and uvloop when installed.
Run it in its own process so it does not share an event loop with what it measures:

    python bench/loadgen.py --url http://127.0.0.1:9001/v1/chat/completions -c 16 --duration 3 --json

``--cpus 0`` pins the process to core 0 (``os.sched_setaffinity``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from _args import int_list


@dataclass
class LoadResult:
    """What one load run measured. Latencies are in milliseconds."""

    concurrency: int
    count: int
    errors: int
    elapsed_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    loadgen_cpu: float  # CPU seconds used by this process / wall seconds of the measured phase
    warmup_count: int = 0  # requests sent during the unrecorded warmup
    warmup_s: float = 0.0  # how long the warmup really took (the last answers arrive after its deadline)
    first_error: str | None = None
    statuses: dict[str, int] = field(default_factory=dict)


def chat_body(model: str, stream: bool = False) -> bytes:
    """A small chat request, the same for every target."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say hello in five words."},
        ],
        "max_tokens": 16,
    }
    if stream:
        payload["stream"] = True
    return json.dumps(payload).encode()


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (``q`` in 0..100); 0.0 for an empty list."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(q / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(
    url: str,
    body: bytes,
    concurrency: int,
    duration: float | None = 3.0,
    requests: int | None = None,
    warmup: float = 0.5,
    request_timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Drive ``url`` with ``concurrency`` closed-loop workers and return the measured result.

    Exactly one of ``duration`` (seconds) or ``requests`` (total count) bounds the measured phase.
    """
    if (duration is None) == (requests is None):
        raise ValueError("give exactly one of duration or requests")
    send_headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    send_headers.update(headers or {})
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=request_timeout)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors = 0
    first_error: str | None = None
    budget = [requests or 0]
    warmup_count = 0

    async with aiohttp.ClientSession(
        connector=connector, timeout=client_timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
    ) as session:

        async def one(record: bool) -> None:
            nonlocal errors, first_error, warmup_count
            if not record:
                warmup_count += 1
            start = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=send_headers) as resp:
                    await resp.read()
                    status = resp.status
            except Exception as exc:  # any failure counts as an error sample; the run goes on
                if record:
                    errors += 1
                    if first_error is None:
                        first_error = f"{type(exc).__name__}: {exc}"
                return
            if not record:
                return
            key = str(status)
            statuses[key] = statuses.get(key, 0) + 1
            if status == 200:
                latencies.append((time.perf_counter() - start) * 1000.0)
            else:
                errors += 1
                if first_error is None:
                    first_error = f"HTTP {status}"

        async def timed_worker(deadline: float, record: bool) -> None:
            while time.perf_counter() < deadline:
                await one(record)

        async def counted_worker() -> None:
            while budget[0] > 0:
                budget[0] -= 1
                await one(True)

        warmup_started = time.perf_counter()
        if warmup > 0:
            deadline = warmup_started + warmup
            await asyncio.gather(*(timed_worker(deadline, False) for _ in range(concurrency)))
        warmup_s = time.perf_counter() - warmup_started

        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        if duration is not None:
            deadline = t0 + duration
            await asyncio.gather(*(timed_worker(deadline, True) for _ in range(concurrency)))
        else:
            await asyncio.gather(*(counted_worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        cpu = _cpu_seconds() - cpu0

    latencies.sort()
    count = len(latencies)
    return LoadResult(
        concurrency=concurrency,
        count=count,
        errors=errors,
        elapsed_s=elapsed,
        rps=count / elapsed if elapsed > 0 else 0.0,
        p50_ms=percentile(latencies, 50),
        p90_ms=percentile(latencies, 90),
        p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1] if latencies else 0.0,
        mean_ms=sum(latencies) / count if count else 0.0,
        loadgen_cpu=cpu / elapsed if elapsed > 0 else 0.0,
        warmup_count=warmup_count,
        warmup_s=warmup_s,
        first_error=first_error,
        statuses=statuses,
    )


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints a JSON object with ``--json``, a one-line summary otherwise."""
    parser = argparse.ArgumentParser(description="closed-loop HTTP load generator")
    parser.add_argument("--url", required=True)
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=None, help="seconds of measured load")
    parser.add_argument("--requests", type=int, default=None, help="total requests instead of a duration")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of unrecorded load first")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--stream", action="store_true", help='send "stream": true')
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--cpus", type=int_list(minimum=0, allow_empty=True), default=None,
                        help="pin to these cores, e.g. 0 or 0,1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.duration is None and args.requests is None:
        args.duration = 3.0
    if args.cpus:
        os.sched_setaffinity(0, set(args.cpus))
    result: LoadResult = _run(
        run_load(
            args.url,
            chat_body(args.model, args.stream),
            args.concurrency,
            duration=args.duration,
            requests=args.requests,
            warmup=args.warmup,
            request_timeout=args.timeout,
        )
    )
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"c={result.concurrency} n={result.count} err={result.errors} rps={result.rps:.0f} "
            f"p50={result.p50_ms:.3f}ms p99={result.p99_ms:.3f}ms max={result.max_ms:.3f}ms "
            f"loadgen_cpu={result.loadgen_cpu:.0%}"
            + (f" first_error={result.first_error}" if result.first_error else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
