"""What in-layer workflows cost in gateway time, measured side by side in one run.

Three questions, each answered as a difference of medians between requests sent alternately through
the same gateway (so machine noise hits both sides alike):

1. **Cascade that does not escalate vs one call.** ``cascade/cheap-first`` (the cheap model answers
   with confident logprobs, so the strong one is never called) against the cheap model by name. Both
   make exactly one upstream call of the same duration; the difference is the cascade's own work
   (asking for logprobs, scoring them, stripping them, building the response and the sub-call tree).
   Target: <= 1 ms.
2. **Fan-out of 4 beyond the slowest candidate.** ``fusion/four`` fans out to four candidates whose
   upstream delays are 10/20/30/40 ms, then a fuser call of 10 ms: its upstream critical path is
   40 + 10 ms. Gateway time = wall latency - critical path, compared with a single call's wall latency
   - its upstream delay. Target: <= 2 ms.
3. **What buffering costs in time to first token.** A streamed ``cascade/cheap-first`` must buffer the
   cheap answer before it can judge it, so its first token arrives when the whole cheap answer is
   done; a streamed call to the cheap model by name shows the first token as soon as the upstream
   sends it. The fake upstream streams 24 chunks 4 ms apart after a 10 ms first byte.

The fake upstream is this script itself (``--serve-fake PORT``, aiohttp): each model's delay is in
its upstream name (``d40`` answers after 40 ms), answers carry logprobs when asked.

Run: ``nice -n 5 .venv/bin/python bench/workflow_overhead.py [--requests 300] [--rounds 3]``.
Writes ``bench/results/workflow_overhead/{results.json,report.md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _procs

RESULTS = Path(__file__).resolve().parent / "results" / "workflow_overhead"
STREAM_CHUNKS = 24
STREAM_GAP_S = 0.004
ANSWER = "The answer is 42."


# ------------------------------------------------------------------------------------------ fake upstream
def _delay(model: str) -> float:
    """Upstream delay in seconds from a model name like ``d40`` or ``d10s`` (40, 10 ms); 0 when none."""
    digits = model[1:].rstrip("s")
    return float(digits) / 1000.0 if model.startswith("d") and digits.isdigit() else 0.0


def _logprobs(tokens: int) -> dict[str, Any]:
    entry = {
        "token": "x",
        "logprob": -0.01,
        "bytes": None,
        "top_logprobs": [
            {"token": "x", "logprob": -0.01, "bytes": None},
            {"token": "y", "logprob": -5.0, "bytes": None},
        ],
    }
    return {"content": [entry] * tokens}


async def _chat(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
    body = await request.json()
    model = str(body.get("model", ""))
    await asyncio.sleep(_delay(model))
    wants_logprobs = bool(body.get("logprobs"))
    if body.get("stream"):
        response = aiohttp.web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for index in range(STREAM_CHUNKS):
            delta = {"role": "assistant", "content": "x "} if index == 0 else {"content": "x "}
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "finish_reason": None,
                        **({"logprobs": _logprobs(1)} if wants_logprobs else {}),
                    }
                ],
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(STREAM_GAP_S)
        last = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": STREAM_CHUNKS, "total_tokens": 12 + STREAM_CHUNKS},
        }
        await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response
    # A "streaming" model (``d10s``) takes as long to answer unstreamed as its stream takes in total:
    # that is what a cascade's buffered cheap stage waits for.
    if model.endswith("s"):
        await asyncio.sleep(STREAM_CHUNKS * STREAM_GAP_S)
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
    if wants_logprobs:
        choice["logprobs"] = _logprobs(6)
    return aiohttp.web.json_response(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [choice],
            "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
        }
    )


async def _models(_request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
    return aiohttp.web.json_response({"object": "list", "data": []})


def serve_fake(port: int) -> None:
    """Run the fake upstream until killed."""
    app = aiohttp.web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    print(f"READY {port}", flush=True)
    aiohttp.web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# ------------------------------------------------------------------------------------------ gateway
def gateway_config(port: int, upstream_port: int, db: Path) -> dict[str, Any]:
    """Models named after their upstream delay; the workflows under test."""

    def model(name: str, upstream: str) -> dict[str, Any]:
        return {"name": name, "upstream_name": upstream, "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 1.0}

    return {
        "server": {"host": "127.0.0.1", "port": port},
        "backends": [
            {
                "name": "fake",
                "base_url": f"http://127.0.0.1:{upstream_port}/v1",
                "health": {"enabled": False},
                "max_concurrency": 256,
                "models": [
                    model("cheap", "d10"),
                    model("strong", "d10"),
                    model("cheap-stream", "d10s"),
                    model("strong-stream", "d10s"),
                    model("c1", "d10"),
                    model("c2", "d20"),
                    model("c3", "d30"),
                    model("c4", "d40"),
                    model("fuser", "d10"),
                ],
            }
        ],
        "workflows": [
            {
                "name": "cheap-first",
                "kind": "cascade",
                "stages": ["cheap", "strong"],
                "confidence": {"source": "logprobs", "threshold": 0.5},
            },
            {
                "name": "cheap-first-streamed",
                "kind": "cascade",
                "stages": ["cheap-stream", "strong-stream"],
                "confidence": {"source": "logprobs", "threshold": 0.5},
            },
            {
                "name": "four",
                "kind": "fusion",
                "candidates": ["c1", "c2", "c3", "c4"],
                "timeout": 5,
                "combine": {"fuser": "fuser"},
            },
        ],
        "store": {"kind": "sqlite", "path": str(db)},
    }


async def _timed(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float, dict[str, str]]:
    """(wall seconds, seconds to the first body byte, response headers) of one request."""
    started = time.perf_counter()
    async with session.post(url, json=body) as response:
        first = None
        async for _chunk in response.content.iter_any():
            if first is None:
                first = time.perf_counter()
        if response.status != 200:
            raise RuntimeError(f"{body['model']}: HTTP {response.status}")
        done = time.perf_counter()
        return done - started, (first or done) - started, dict(response.headers)


async def measure(base: str, upstream: str, requests: int) -> dict[str, dict[str, list[float]]]:
    """Alternate the compared requests; wall and first-byte times in ms per variant. The direct
    variants call the fake upstream without the gateway: what each upstream leg costs by itself
    (its delay, its HTTP and JSON work, the event loop's timer slack)."""
    messages = [{"role": "user", "content": "What is 6 x 7?"}]
    variants: dict[str, dict[str, Any]] = {
        "single (cheap by name)": {"model": "cheap", "messages": messages},
        "cascade, not escalated": {"model": "cascade/cheap-first", "messages": messages},
        "fusion of 4 + fuser": {"model": "fusion/four", "messages": messages},
        "stream: cheap by name": {"model": "cheap-stream", "messages": messages, "stream": True},
        "stream: cascade, not escalated": {
            "model": "cascade/cheap-first-streamed",
            "messages": messages,
            "stream": True,
        },
    }
    direct = {
        "direct: d10": {"model": "d10", "messages": messages},
        "direct: d40": {"model": "d40", "messages": messages},
    }
    urls = {name: f"{base}/v1/chat/completions" for name in variants} | {
        name: f"{upstream}/v1/chat/completions" for name in direct
    }
    variants |= direct
    out: dict[str, dict[str, list[float]]] = {name: {"wall": [], "first": [], "stage": []} for name in variants}
    async with aiohttp.ClientSession() as session:
        for name, body in variants.items():  # warm-up
            await _timed(session, urls[name], body)
        for _ in range(requests):
            for name, body in variants.items():
                wall, first, headers = await _timed(session, urls[name], body)
                out[name]["wall"].append(wall * 1000)
                out[name]["first"].append(first * 1000)
                if "x-pointsman-stage" in headers:
                    out[name]["stage"].append(0.0 if headers["x-pointsman-stage"].startswith("0") else 1.0)
    return out


def summarise(rounds: list[dict[str, dict[str, list[float]]]]) -> dict[str, Any]:
    """Medians per round, then the median and range over rounds of the differences that matter."""

    def med(round_: dict[str, dict[str, list[float]]], name: str, key: str) -> float:
        return statistics.median(round_[name][key])

    rows = []
    for r in rounds:
        leg10, leg40 = med(r, "direct: d10", "wall"), med(r, "direct: d40", "wall")
        single = med(r, "single (cheap by name)", "wall") - leg10  # minus its upstream leg, measured
        fusion = med(r, "fusion of 4 + fuser", "wall") - (leg40 + leg10)  # minus its critical path, measured
        rows.append(
            {
                "upstream_leg_d10_ms": leg10,
                "upstream_leg_d40_ms": leg40,
                "single_gateway_ms": single,
                "cascade_extra_ms": med(r, "cascade, not escalated", "wall") - med(r, "single (cheap by name)", "wall"),
                "fusion_gateway_ms": fusion,
                "fusion_beyond_critical_path_ms": fusion - single,
                "ttft_direct_ms": med(r, "stream: cheap by name", "first"),
                "ttft_cascade_ms": med(r, "stream: cascade, not escalated", "first"),
                "wall_stream_direct_ms": med(r, "stream: cheap by name", "wall"),
                "wall_stream_cascade_ms": med(r, "stream: cascade, not escalated", "wall"),
                "escalated_share": statistics.fmean(r["cascade, not escalated"]["stage"] or [float("nan")]),
            }
        )
    keys = rows[0].keys()
    return {
        k: {
            "median": statistics.median(row[k] for row in rows),
            "min": min(row[k] for row in rows),
            "max": max(row[k] for row in rows),
        }
        for k in keys
    } | {"rounds": rows}


def render(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The Markdown report."""

    def cell(key: str) -> str:
        s = summary[key]
        return f"{s['median']:.2f} ({s['min']:.2f} to {s['max']:.2f})"

    return "\n".join(
        [
            "# Workflow overhead (side by side, one gateway)",
            "",
            f"{meta['cpu']}, {meta['cores']} cores; {meta['requests']} requests per variant per round, "
            f"{meta['rounds']} rounds; cells: median over rounds of the per-round medians (range).",
            "",
            "| measure | ms | target |",
            "|---|---|---|",
            f"| upstream legs called directly (no gateway): d10 / d40 | {cell('upstream_leg_d10_ms')} / "
            f"{cell('upstream_leg_d40_ms')} | |",
            f"| gateway time of a single call (wall - the d10 leg) | {cell('single_gateway_ms')} | |",
            f"| cascade not escalated, extra over the single call | {cell('cascade_extra_ms')} | <= 1 ms |",
            f"| fan-out of 4 + fuser: gateway time (wall - the d40 leg - the fuser's d10 leg) "
            f"| {cell('fusion_gateway_ms')} | |",
            f"| fan-out of 4 + fuser: extra over a single call's gateway time "
            f"| {cell('fusion_beyond_critical_path_ms')} | <= 2 ms |",
            f"| streamed: time to first byte, cheap model by name | {cell('ttft_direct_ms')} | |",
            "| streamed: time to first byte, cascade (cheap answer buffered and scored) | "
            f"{cell('ttft_cascade_ms')} | |",
            f"| streamed: whole answer, cheap by name / cascade | {cell('wall_stream_direct_ms')} / "
            f"{cell('wall_stream_cascade_ms')} | |",
            "",
            f"The cascade's first byte waits for the whole cheap answer ({STREAM_CHUNKS} chunks x "
            f"{STREAM_GAP_S * 1000:.0f} ms here): buffering moves the time to first token from the upstream's "
            "first token to its last, and the whole answer then arrives at once. Escalated share in the "
            f"cascade runs: {summary['escalated_share']['median']:.2f} (must be 0: confident logprobs).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        serve_fake(args.serve_fake)
        return 0
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="wf-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        upstream_port, port = _procs.free_port(), _procs.free_port()
        config = tmp / "config.yaml"
        config.write_text(yaml.safe_dump(gateway_config(port, upstream_port, tmp / "pointsman.db")))
        upstream = _procs.start([sys.executable, __file__, "--serve-fake", str(upstream_port)], tmp / "upstream.log")
        gateway = None
        try:
            _procs.wait_http(f"http://127.0.0.1:{upstream_port}/v1/models", upstream, 30, log_path=tmp / "upstream.log")
            gateway = _procs.start(
                [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)], tmp / "gateway.log", cwd=root
            )
            _procs.wait_http(f"http://127.0.0.1:{port}/ready", gateway, 120, log_path=tmp / "gateway.log")
            rounds = []
            for index in range(args.rounds):
                rounds.append(asyncio.run(
                    measure(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{upstream_port}", args.requests)
                ))
                print(f"round {index + 1}/{args.rounds} done", flush=True)
        finally:
            _procs.stop(gateway)
            _procs.stop(upstream)
    summary = summarise(rounds)
    meta = {"cpu": _procs.cpu_model(), "cores": _procs.cpu_count(), "requests": args.requests, "rounds": args.rounds}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=2))
    report = render(summary, meta)
    (args.out / "report.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
