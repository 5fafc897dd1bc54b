"""Does a body of very many tiny messages stall everyone else? Small-request latency while one is served.

``bench/event_loop.py`` measures text-heavy bodies (a few messages of megabytes each). This is the other
shape of a large body: ``--messages`` (default 240,000) messages of a few characters each, about 8 MB of
JSON, where the cost is in walking the parsed structure (the decode's depth / duplicate-key walk, the
conversation text the encoder reads) rather than in scanning text.

A real gateway (``python -m gateway.cli serve``) runs the production-shaped ``auto`` route of
``bench/event_loop.py`` (PII redaction, a jailbreak rule, the knob on the static encoder's
``difficulty``) against ``bench/fake_upstream.py``. Each round: one client sends small ``auto``
requests back to back (c=1) for as long as the big body takes; the big body is sent from a process
of its own. Reported per round: the small requests' count, p50 and worst latency while the big one
was in flight, the big one's status, latency and model; and a baseline round without the big body.
Medians over ``--rounds`` (default 3).

Run: ``.venv/bin/python bench/many_messages.py`` (about half a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _procs
from event_loop import gateway_config, small_body


def many_messages_body(count: int) -> bytes:
    """A chat body of ``count`` tiny messages, alternating user / assistant, ending on a user turn."""
    messages = [{"role": "assistant" if i % 2 else "user", "content": f"m{i % 10}"} for i in range(count - 1)]
    messages.append({"role": "user", "content": "What is 2 + 2?"})
    return json.dumps({"model": "auto", "max_tokens": 16, "messages": messages}).encode()


async def one_round(url: str, big: Path | None, offset: int, seconds: float) -> dict[str, float | int | str]:
    """Small requests back to back while ``big`` (if any) is served, else for ``seconds``."""
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    out: dict[str, float | int | str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        sender = None
        if big is not None:
            sender = await asyncio.create_subprocess_exec(
                sys.executable, str(_procs.BENCH_DIR / "event_loop.py"), "--send-one", url, str(big),
                "--at", repr(time.time() + 1.0), stdout=asyncio.subprocess.PIPE,
            )
            waiting = asyncio.ensure_future(sender.communicate())
        deadline = time.perf_counter() + seconds
        index = 0
        while (not waiting.done()) if sender is not None else time.perf_counter() < deadline:
            sent = time.perf_counter()
            async with session.post(url, data=small_body(offset + index), headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"a small request got {resp.status}")
            latencies.append((time.perf_counter() - sent) * 1000.0)
            index += 1
        if sender is not None:
            stdout, _ = await waiting
            result = json.loads(stdout)
            out.update(big_status=result["status"], big_s=result["latency_s"], big_model=result["model"])
    latencies.sort()
    out.update(small=len(latencies), p50_ms=statistics.median(latencies), max_ms=latencies[-1])
    return out


async def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="pointsman-many-"))
    up_port, guarded_port, gw_port = _procs.free_port(), _procs.free_port(), _procs.free_port()
    procs = []
    try:
        for port, name in ((up_port, "upstream"), (guarded_port, "guarded")):
            procs.append(_procs.start(
                [sys.executable, str(_procs.BENCH_DIR / "fake_upstream.py"), "--port", str(port)],
                work / f"{name}.log"))
            _procs.wait_http(f"http://127.0.0.1:{port}/v1/models", procs[-1], 30, log_path=work / f"{name}.log")
        config = gateway_config(f"http://127.0.0.1:{up_port}/v1", f"http://127.0.0.1:{guarded_port}/v1", gw_port,
                                args.scan_workers)
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        procs.append(_procs.start([sys.executable, "-m", "gateway.cli", "serve", "--config", str(work / "config.yaml")],
                                  work / "gateway.log", cwd=work, env={"PYTHONPATH": str(_procs.REPO_ROOT)}))
        _procs.wait_http(f"http://127.0.0.1:{gw_port}/health", procs[-1], 120, log_path=work / "gateway.log")
        url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        big = work / "big.json"
        big.write_bytes(many_messages_body(args.messages))
        print(f"big body: {args.messages} messages, {big.stat().st_size / 1e6:.1f} MB", flush=True)
        await one_round(url, None, 9_000_000, 2.0)  # warm-up
        rows = []
        for r in range(args.rounds):
            base = await one_round(url, None, r * 100_000, 3.0)
            loaded = await one_round(url, big, r * 100_000 + 50_000, 0.0)
            rows.append((base, loaded))
            print(f"round {r + 1}: without: {base['small']} small, p50 {base['p50_ms']:.1f} ms, "
                  f"max {base['max_ms']:.1f} ms | with: {loaded['small']} small, p50 {loaded['p50_ms']:.1f} ms, "
                  f"max {loaded['max_ms']:.1f} ms; big: {loaded['big_status']} in {loaded['big_s']:.2f} s "
                  f"({loaded['big_model']})", flush=True)
    finally:
        for proc in reversed(procs):
            _procs.stop(proc)
    print(f"median over {args.rounds} rounds: small max without "
          f"{statistics.median(b['max_ms'] for b, _ in rows):.1f} ms, "
          f"with {statistics.median(w['max_ms'] for _, w in rows):.1f} ms; small p50 with "
          f"{statistics.median(w['p50_ms'] for _, w in rows):.1f} ms; big body "
          f"{statistics.median(w['big_s'] for _, w in rows):.2f} s")
    if args.keep:
        print(f"kept the logs in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=240_000, help="messages in the big body")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians reported")
    parser.add_argument("--scan-workers", type=int, default=None, help="classifiers.scan_workers")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, config)")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
