"""Decision latency: how long one routing decision takes (signals + policy, no backend call).

For each encoder (``static``, ``minilm``) the script builds the routing brain exactly as the gateway
does (``gateway.routing.RoutingBrain`` from a parsed config: jailbreak block, PII redaction, a tools
rule, the cost-quality knob on the trained difficulty head, session stickiness) and times
``await brain.policies["auto"].decide(ctx)`` on real prompts from the RouteLLM data (MMLU, GSM8K and
MT-bench, MT-bench also as two-turn conversations with a real first answer), every decision on a
distinct request body.

* **c=1**: decisions one after another; latency of each.
* **c=32**: 32 tasks in one event loop, each deciding its next prompt as soon as the last one is
  done (closed loop); latency of each decision and decisions/second overall. This is where the
  encoder's micro-batching pays.

The encoder cache is off (``cache_size: 0``) so every decision pays for its encoder pass; one extra
line per encoder shows the default cache on repeated prompts. Warm-up decisions are dropped; each cell
runs several rounds and medians over rounds are reported. A breakdown of one decision at c=1 shows where
the time goes: rule signal extractors, the conversation text, the hand-off to the encoder thread, the
encoder, the difficulty head, and the policy itself (rules, knob, stickiness, plan).

The process runs like the gateway's: uvloop, ``gc.freeze()`` after start-up, the encoder on its own
worker thread with one intra-op thread (the config default). It is not pinned by default (the decision
path uses two threads: the event loop and the encoder worker); ``--cpus 0,1`` pins it.

Targets (2 cores): static p50 <= 1 ms at c=1; MiniLM p50 <= 15 ms at c=1 and >= 150 decisions/s at
c=32 (RouteLLM's published matrix-factorisation router: 155/s).

Printed (rich tables) and written to ``bench/results/decision_latency.{md,json}``; exit code 1 if a
target fails. Run from the repository root::

    .venv/bin/python bench/decision_latency.py                # both encoders, ~1-2 min
    .venv/bin/python bench/decision_latency.py --encoders static --rounds 5
    .venv/bin/python bench/decision_latency.py --max-batch 16 --encoder-threads 2   # tuning experiments
    .venv/bin/python bench/decision_latency.py --encoders static --redis redis://127.0.0.1:6379/0  # shared sessions

Trained difficulty heads must exist for each encoder (``python -m evals.train`` writes them into
``classifiers/artifacts/routers``; ``--routers-dir`` points elsewhere). The data directory is found as
the training script finds it (``--data``, ``$POINTSMAN_DATA_DIR``, or ``../shared/data``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _procs
import numpy as np
from _args import int_list

from classifiers.conversation import conversation_text
from classifiers.heads import build_features
from classifiers.provider import DEFAULT_ROUTERS_DIR, DIFFICULTY_ARTIFACT, build_extractors
from classifiers.signals import Signal
from evals.data import load_gsm8k, load_mmlu, load_mt_bench, resolve_data_dir
from gateway.config import Config, parse_config
from gateway.routing import RoutingBrain
from policies import PolicyError, RequestContext, RulePolicy

# Nothing here may download weights: the encoders load from the bundled package and the artifacts
# (torch and transformers are imported lazily, when the MiniLM encoder is built, so this is in time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
ENCODERS = ("static", "minilm")
ROUTE = "auto"
# Share of each data set in the prompt sequence (a repeating pattern of 25 slots): MMLU 76%, GSM8K 20%,
# MT-bench 4% (two thirds of those two-turn). MT-bench has only 72 clean questions, so its share is what
# keeps a default run on distinct bodies throughout.
PATTERN = ("mmlu",) * 19 + ("gsm8k",) * 5 + ("mt_bench",)
# Decisions per measured round, per encoder and concurrency (a static decision is ~50x cheaper).
DEFAULT_SIZES = {("static", 1): 400, ("static", 32): 1024, ("minilm", 1): 150, ("minilm", 32): 640}
WARMUP = {1: 32, 32: 128}
BREAKDOWN_PROMPTS = {"static": 300, "minilm": 100}
CACHE_PROMPTS = 256


# prompts -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One request body and where it came from (``mmlu``, ``gsm8k``, ``mt_bench-1``, ``mt_bench-2``)."""

    source: str
    body: dict[str, Any]


def _first_answers(data_dir: Path) -> dict[int, list[str]]:
    """Real first-turn answers (GPT-4 and Mixtral) per MT-bench question, from the judge's transcripts."""
    answers: dict[int, list[str]] = {}
    with (data_dir / "routellm" / "mt_bench" / "judgements.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            if int(row.get("turn", 0)) != 2:
                continue
            text: str = row["user_prompt"]
            _, sep, rest = text.partition("### Assistant A:\n")
            answer, sep2, _rest = rest.partition("\n\n### User:\n")
            if sep and sep2 and answer.strip():
                answers.setdefault(int(row["question_id"]), []).append(answer.strip())
    return answers


def _mt_bench_prompts(data_dir: Path) -> list[Prompt]:
    """Every clean MT-bench question as a one-turn body, plus one two-turn body per recorded first answer."""
    answers = _first_answers(data_dir)
    # load_mt_bench drops contaminated questions; question ids come back through the first turn.
    ids = {}
    with (data_dir / "routellm" / "mt_bench" / "question.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                q = json.loads(line)
                ids[q["turns"][0]] = int(q["question_id"])
    out: list[Prompt] = []
    for record in load_mt_bench(data_dir):
        first = record.turns[0]
        out.append(Prompt("mt_bench-1", {"messages": [{"role": "user", "content": first}]}))
        if len(record.turns) < 2:
            continue
        for answer in answers.get(ids.get(first, -1), []):
            out.append(
                Prompt(
                    "mt_bench-2",
                    {
                        "messages": [
                            {"role": "user", "content": first},
                            {"role": "assistant", "content": answer},
                            {"role": "user", "content": record.turns[1]},
                        ]
                    },
                )
            )
    return out


class PromptStream:
    """Distinct request bodies in a fixed data-set mix; a pool that runs dry starts over (counted)."""

    def __init__(self, data_dir: Path, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.pools: dict[str, list[Prompt]] = {
            "mmlu": [Prompt("mmlu", _user(r.prompt)) for r in load_mmlu(data_dir)],
            "gsm8k": [Prompt("gsm8k", _user(r.prompt)) for r in load_gsm8k(data_dir)],
            "mt_bench": _mt_bench_prompts(data_dir),
        }
        for pool in self.pools.values():
            rng.shuffle(pool)
        self._next = dict.fromkeys(self.pools, 0)
        self._slot = 0
        self.recycled = 0

    def take(self, n: int) -> list[Prompt]:
        """The next ``n`` bodies of the sequence."""
        out = []
        for _ in range(n):
            name = PATTERN[self._slot % len(PATTERN)]
            self._slot += 1
            pool, index = self.pools[name], self._next[name]
            if index >= len(pool):
                index = 0
                self.recycled += 1
            out.append(pool[index % len(pool)])
            self._next[name] = index + 1
        return out

    def reset(self) -> None:
        """Start the sequence again (each encoder sees the same prompts)."""
        self._next = dict.fromkeys(self.pools, 0)
        self._slot = 0
        self.recycled = 0


def _user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# the routing brain -------------------------------------------------------------------------------


def split_spec(spec: str) -> tuple[str, str | None]:
    """``"minilm@onnx"`` -> ``("minilm", "onnx")``; a plain encoder name has no runtime override."""
    name, _, runtime = spec.partition("@")
    return name, runtime or None


def default_specs() -> list[str]:
    """Both encoders; plus MiniLM on ``onnx`` side by side when the default runtime resolves to another one."""
    from classifiers.encoders import resolve_runtime

    specs = list(ENCODERS)
    if resolve_runtime(os.environ.get("POINTSMAN_MINILM_RUNTIME") or "auto") != "onnx":
        specs.append("minilm@onnx")
    return specs


def bench_config(
    encoder: str,
    cache_size: int,
    routers_dir: Path | None,
    max_batch: int,
    threads: int | None,
    runtime: str | None = None,
    redis_url: str | None = None,
) -> Config:
    """The black-box routing test's ``auto`` route, with the encoder and cache under test.

    ``redis_url``: keep the route's sticky sessions in that Redis (``shared_state.kind: redis``), as
    replicas do; default in-process.

    ``POINTSMAN_MINILM_RUNTIME`` (onnx | torch) and ``POINTSMAN_MINILM_DTYPE`` (torch only) pick the
    MiniLM variant; unset means the gateway's defaults.
    """
    classifiers: dict[str, Any] = {"encoder": encoder, "cache_size": cache_size, "max_batch": max_batch}
    if threads is not None:
        classifiers["encoder_threads"] = threads
    for key, env in (("minilm_runtime", "POINTSMAN_MINILM_RUNTIME"), ("minilm_dtype", "POINTSMAN_MINILM_DTYPE")):
        if os.environ.get(env):
            classifiers[key] = os.environ[env]
    if runtime is not None:
        classifiers["minilm_runtime"] = runtime
        if runtime == "onnx":
            classifiers.pop("minilm_dtype", None)  # ONNX Runtime runs float32 only
    if routers_dir is not None:
        classifiers["routers_dir"] = str(routers_dir)
    shared_state: dict[str, Any] = {"kind": "memory"}
    if redis_url:
        shared_state = {"kind": "redis", "url": redis_url, "key_prefix": f"pointsman-bench-{os.getpid()}:"}
    return parse_config(
        {
            "shared_state": shared_state,
            "backends": [
                {
                    "name": "bench",
                    "base_url": "http://127.0.0.1:9/v1",  # never called: decisions only
                    "health": {"enabled": False},
                    "models": [
                        {"name": "small-model", "input_cost_per_mtok": 0.6, "output_cost_per_mtok": 0.6},
                        {"name": "big-model", "input_cost_per_mtok": 10, "output_cost_per_mtok": 30, "tags": ["tools"]},
                    ],
                }
            ],
            "classifiers": classifiers,
            "routes": [
                {
                    "name": ROUTE,
                    "policy": "rules",
                    "rules": [
                        {
                            "name": "block-jailbreak",
                            "priority": 100,
                            "when": {"signal": "jailbreak", "op": "ge", "value": 0.8},
                            "action": {"block": "blocked by policy", "status": 403},
                        },
                        {
                            "name": "redact-pii",
                            "priority": 90,
                            "when": {"signal": "pii", "op": "truthy"},
                            "action": {"redact": ["email", "credit_card"]},
                        },
                        {
                            "name": "tools-need-big",
                            "priority": 50,
                            "when": {"signal": "tools", "op": "truthy"},
                            "action": {"route": "big-model"},
                        },
                    ],
                    "cost_quality": {
                        "signal": "difficulty",
                        "strong": "big-model",
                        "weak": "small-model",
                        "threshold": 0.5,
                    },
                    "sticky": {"enabled": True, "ttl": 600, "escalate": True},
                }
            ],
        }
    )


async def start_brain(config: Config) -> RoutingBrain:
    """Build and start the brain; then freeze the start-up heap as the gateway does after start-up."""
    brain = RoutingBrain(config)
    await brain.start()
    if brain.encoder is None:
        raise SystemExit("the bench route needs the difficulty head, but the brain loaded no encoder")
    gc.collect()
    gc.freeze()
    return brain


def _context(index: int, prompt: Prompt) -> RequestContext:
    return RequestContext(
        request_id=f"bench-{index}", endpoint="chat.completions", route=ROUTE, body=prompt.body, headers={}
    )


# measuring ---------------------------------------------------------------------------------------


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cell:
    """One measured round: per-decision latencies (ms) and what the machine did meanwhile."""

    latencies_ms: list[float]
    wall_s: float
    cpu_s: float
    foreign_cpu: float  # cores' worth of other processes' CPU during the round
    blocked: int
    mean_batch: float

    def summary(self) -> dict[str, float]:
        lat = np.asarray(self.latencies_ms)
        return {
            "n": len(lat),
            "p50_ms": float(np.percentile(lat, 50)),
            "p90_ms": float(np.percentile(lat, 90)),
            "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()),
            "mean_ms": float(lat.mean()),
            "decisions_per_s": len(lat) / self.wall_s,
            "cpu_ms_per_decision": 1000 * self.cpu_s / len(lat),
            "foreign_cpu": self.foreign_cpu,
            "blocked": self.blocked,
            "mean_batch": self.mean_batch,
        }


async def run_cell(brain: RoutingBrain, prompts: Sequence[Prompt], concurrency: int) -> Cell:
    """Decide every prompt with ``concurrency`` closed-loop tasks; latency of each decision."""
    policy = brain.policies[ROUTE]
    encoder = brain.encoder
    assert encoder is not None
    before = encoder.stats()
    latencies: list[float] = []
    blocked = 0
    feed: Iterator[tuple[int, Prompt]] = iter(enumerate(prompts))

    async def worker() -> None:
        nonlocal blocked
        for index, prompt in feed:
            ctx = _context(index, prompt)
            t0 = time.perf_counter()
            try:
                await policy.decide(ctx)
            except PolicyError:
                blocked += 1  # a jailbreak block is a decision too, and costs the same signals
            latencies.append((time.perf_counter() - t0) * 1000)

    busy0, cpu0, t0 = _busy_seconds(), _own_cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = _own_cpu() - cpu0
    foreign = max(0.0, (_busy_seconds() - busy0) - cpu) / wall
    after = encoder.stats()
    batches = after.batches - before.batches
    mean_batch = (after.encoded - before.encoded) / batches if batches else 0.0
    return Cell(latencies, wall, cpu, foreign, blocked, mean_batch)


def combine(cells: Sequence[Cell]) -> dict[str, Any]:
    """Medians over rounds of each round's statistics, plus the rounds themselves."""
    rounds = [cell.summary() for cell in cells]
    keys = rounds[0].keys()
    row: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in keys}
    row["n"] = int(sum(r["n"] for r in rounds))
    row["max_foreign_cpu"] = max(r["foreign_cpu"] for r in rounds)
    row["rounds"] = rounds
    return row


# where one decision's time goes ------------------------------------------------------------------


class FixedSignals:
    """A signal provider that hands back signals computed beforehand: times the policy alone."""

    def __init__(self) -> None:
        self.signals: dict[str, Signal] = {}

    async def compute(self, names: set[str], ctx: Any) -> dict[str, Signal]:
        return {name: self.signals[name] for name in names if name in self.signals}


async def breakdown(brain: RoutingBrain, prompts: Sequence[Prompt]) -> dict[str, Any]:
    """Time each stage of a c=1 decision separately on the same prompts (median and mean, microseconds).

    Stages: each rule extractor the route uses; ``conversation_text``; the encoder called directly;
    the batching front (``await BatchingEncoder.encode`` minus the direct call: hashing, the future,
    the hop to the worker thread and back); the head (features + calibrated probability); the policy
    with the signals already computed (rules, knob, stickiness, plan); and the whole ``decide``.
    """
    policy = brain.policies[ROUTE]
    assert isinstance(policy, RulePolicy)
    batching = brain.encoder
    assert batching is not None
    raw_encoder = batching.encoder
    head = brain.heads.difficulty
    assert head is not None
    cheap = bool(head.manifest.get("feature_schema", {}).get("cheap"))
    extractors = build_extractors()
    rule_names = sorted(n for n in policy.needed_signals if n in extractors)
    fixed = FixedSignals()
    policy_only = RulePolicy(ROUTE, policy.config, fixed, policy.models)
    stages: dict[str, list[float]] = {f"signal: {n}": [] for n in rule_names}
    for name in (
        "conversation_text",
        "encoder (direct)",
        "batching front (cache, thread hop unless inline)",
        "head (features + proba)",
        "policy (rules, knob, sticky, plan)",
        "whole decide()",
    ):
        stages[name] = []
    pc = time.perf_counter

    for index, prompt in enumerate(prompts):
        body = prompt.body
        signals: dict[str, Signal] = {}
        for name in rule_names:
            t = pc()
            signals[name] = extractors[name].extract(body)
            stages[f"signal: {name}"].append(pc() - t)
        t = pc()
        text = conversation_text(body, max_chars=2000)
        stages["conversation_text"].append(pc() - t)
        t = pc()
        vector = raw_encoder.encode([text])[0]
        direct = pc() - t
        stages["encoder (direct)"].append(direct)
        t = pc()
        await batching.encode(text)
        stages["batching front (cache, thread hop unless inline)"].append(max(0.0, pc() - t - direct))
        t = pc()
        features = build_features(vector[None, :], [text] if cheap else None)
        p_strong = float(head.predict_proba(features)[0][-1])
        stages["head (features + proba)"].append(pc() - t)
        signals["difficulty"] = Signal("difficulty", p_strong, abs(p_strong - 0.5) * 2)
        fixed.signals = signals
        t = pc()
        with contextlib.suppress(PolicyError):
            await policy_only.decide(_context(index, prompt))
        stages["policy (rules, knob, sticky, plan)"].append(pc() - t)
        t = pc()
        with contextlib.suppress(PolicyError):
            await policy.decide(_context(index, prompt))
        stages["whole decide()"].append(pc() - t)

    whole = stages.pop("whole decide()")
    whole_mean = statistics.fmean(whole)
    out: dict[str, Any] = {}
    for name, values in stages.items():
        out[name] = _stage(values, whole_mean)
    # Stages timed one by one add up to about the whole; the gap is the asyncio task and call glue.
    sums = [sum(parts) for parts in zip(*stages.values(), strict=True)]
    out["sum of the stages"] = _stage(sums, whole_mean)
    out["whole decide()"] = _stage(whole, whole_mean)
    return out


def _stage(values: Sequence[float], whole_mean: float) -> dict[str, float]:
    mean = statistics.fmean(values)
    return {"median_us": 1e6 * statistics.median(values), "mean_us": 1e6 * mean, "share_of_decide": mean / whole_mean}


# the run -----------------------------------------------------------------------------------------


@dataclass
class EncoderResult:
    """Everything measured for one encoder."""

    encoder: str
    encoder_id: str
    head: str
    load_s: float
    runtime: str = "-"  # what the built encoder reports, e.g. "torchscript bfloat16, 2 worker(s)"
    cells: dict[int, dict[str, Any]] = field(default_factory=dict)
    cached: dict[int, dict[str, Any]] = field(default_factory=dict)
    breakdown: dict[str, Any] = field(default_factory=dict)
    recycled: int = 0


async def bench_encoder(
    encoder: str, stream: PromptStream, args: argparse.Namespace, progress: Any, task: Any
) -> EncoderResult:
    """Measure one encoder: warm-up, rounds at each concurrency, the breakdown, the cache-on line."""
    stream.reset()
    t0 = time.perf_counter()
    spec, (encoder, runtime) = encoder, split_spec(encoder)
    config = bench_config(encoder, 0, args.routers_dir, args.max_batch, args.encoder_threads, runtime, args.redis)
    brain = await start_brain(config)
    head = brain.heads.difficulty
    assert brain.encoder is not None and head is not None
    artifact = Path(brain.heads.sources.get("difficulty", "?")).name
    result = EncoderResult(spec, brain.encoder.id, f"{head.kind} ({artifact})", time.perf_counter() - t0)
    result.runtime = getattr(brain.encoder.encoder, "runtime", "in-process")
    try:
        for c in args.concurrency:
            await run_cell(brain, stream.take(WARMUP.get(c, 4 * c)), c)
            n = args.decisions or DEFAULT_SIZES.get((encoder, c), 256)
            cells = []
            for _ in range(args.rounds):
                cells.append(await run_cell(brain, stream.take(n), c))
                progress.advance(task)
            result.cells[c] = combine(cells)
        result.breakdown = await breakdown(brain, stream.take(BREAKDOWN_PROMPTS[encoder]))
        progress.advance(task)
    finally:
        await brain.close()
    result.recycled = stream.recycled

    # The default cache on repeated prompts: one pass fills it, the measured pass hits it every time.
    brain = await start_brain(
        bench_config(encoder, 10_000, args.routers_dir, args.max_batch, args.encoder_threads, runtime, args.redis)
    )
    try:
        stream.reset()
        repeated = stream.take(CACHE_PROMPTS)
        await run_cell(brain, repeated, 1)
        for c in args.concurrency:
            result.cached[c] = combine([await run_cell(brain, repeated, c)])
        progress.advance(task)
    finally:
        await brain.close()
    return result


def evaluate(results: Mapping[str, EncoderResult]) -> list[dict[str, Any]]:
    """The acceptance targets that the measured encoders and concurrencies cover."""
    checks = []
    static, minilm = results.get("static"), results.get("minilm")
    if static is not None and 1 in static.cells:
        p50 = static.cells[1]["p50_ms"]
        checks.append({"target": "static encoder: p50 at c=1 <= 1 ms", "value": f"{p50:.3f} ms", "ok": p50 <= 1.0})
    if minilm is not None and 1 in minilm.cells:
        p50 = minilm.cells[1]["p50_ms"]
        checks.append({"target": "MiniLM: p50 at c=1 <= 15 ms", "value": f"{p50:.2f} ms", "ok": p50 <= 15.0})
    if minilm is not None and 32 in minilm.cells:
        rate = minilm.cells[32]["decisions_per_s"]
        checks.append(
            {
                "target": "MiniLM: >= 150 decisions/s at c=32 (RouteLLM MF router: 155/s)",
                "value": f"{rate:.0f}/s",
                "ok": rate >= 150.0,
            }
        )
    return checks


# output ------------------------------------------------------------------------------------------

ROW_COLUMNS = (
    "encoder",
    "c",
    "cache",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "decisions/s",
    "CPU ms/decision",
    "mean batch",
    "background CPU",
)


def _rows(results: Mapping[str, EncoderResult]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, res in results.items():
        for label, table in (("off", res.cells), ("on, all hits", res.cached)):
            for c, r in table.items():
                rows.append(
                    (
                        name,
                        str(c),
                        label,
                        f"{r['p50_ms']:.3f}",
                        f"{r['p90_ms']:.3f}",
                        f"{r['p99_ms']:.3f}",
                        f"{r['decisions_per_s']:.0f}",
                        f"{r['cpu_ms_per_decision']:.3f}",
                        f"{r['mean_batch']:.1f}" if r["mean_batch"] else "-",
                        f"{r['max_foreign_cpu']:.2f}",
                    )
                )
    return rows


def _breakdown_rows(res: EncoderResult) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for stage, v in res.breakdown.items():
        rows.append((stage, f"{v['median_us']:.1f}", f"{v['mean_us']:.1f}", f"{v['share_of_decide']:.0%}"))
    return rows


def render_markdown(results: Mapping[str, EncoderResult], checks: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Decision latency",
        "",
        f"{meta['date']} - {meta['cpu']} ({meta['cores']} cores), Python {meta['python']}, {meta['loop']}, "
        f"{meta['pinning']}, sticky sessions {meta['sessions']}. "
        f"{meta['rounds']} rounds per cell, medians over rounds; cache off unless stated "
        f"(the cache-on line is one round over {CACHE_PROMPTS} repeated prompts). Encoder threads "
        f"{meta['encoder_threads']}, MiniLM runtime "
        + (", ".join(f"{spec}: {v}" for spec, v in meta["minilm_variants"].items()) or "not measured")
        + f", max batch {meta['max_batch']}. "
        f"{meta['elapsed_s']:.0f} s in all.",
        "",
        "| " + " | ".join(ROW_COLUMNS) + " |",
        "|" + "|".join("---" if col in ("encoder", "cache") else "---:" for col in ROW_COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(results)]
    lines += ["", "| target | measured | result |", "|---|---|---|"]
    lines += [f"| {ch['target']} | {ch['value']} | {'PASS' if ch['ok'] else 'FAIL'} |" for ch in checks]
    for res in results.values():
        lines += [
            "",
            f"## One decision at c=1, stage by stage: {res.encoder} ({res.encoder_id}, head {res.head})",
            "",
            "| stage | median us | mean us | share of decide() |",
            "|---|---:|---:|---:|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in _breakdown_rows(res)]
    return "\n".join(lines) + "\n"


def print_rich(results: Mapping[str, EncoderResult], checks: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    table = Table(
        title=(
            f"Decision latency (signals + policy, no backend; {meta['rounds']} rounds, medians; "
            f"{meta['pinning']}; sessions {meta['sessions']})"
        )
    )
    for col in ROW_COLUMNS:
        table.add_column(col, justify="left" if col in ("encoder", "cache") else "right", no_wrap=True)
    for row in _rows(results):
        table.add_row(*row)
    console.print(table)
    for res in results.values():
        stages = Table(title=f"{res.encoder}: one decision at c=1, stage by stage (head {res.head})")
        for col in ("stage", "median us", "mean us", "share of decide()"):
            stages.add_column(col, justify="left" if col == "stage" else "right")
        for row in _breakdown_rows(res):
            stages.add_row(*row)
        console.print(stages)
    for ch in checks:
        mark = "[green]PASS[/green]" if ch["ok"] else "[red]FAIL[/red]"
        console.print(f"{mark}  {ch['target']}: {ch['value']}")
    if meta["max_foreign_cpu"] > 0.25:
        console.print(
            f"[yellow]warning: other processes used up to {meta['max_foreign_cpu']:.2f} cores during "
            "a measured round; numbers are noisy[/yellow]"
        )


def _check_heads(encoders: Sequence[str], routers_dir: Path | None) -> None:
    root = routers_dir or DEFAULT_ROUTERS_DIR
    missing = [e for e in encoders if not (root / DIFFICULTY_ARTIFACT.format(encoder=e) / "manifest.json").exists()]
    if missing:
        raise SystemExit(
            f"no trained difficulty head for {', '.join(missing)} under {root}: "
            "run `python -m evals.train` first (or pass --routers-dir)"
        )


def _run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    started = time.monotonic()
    _check_heads(sorted({split_spec(spec)[0] for spec in args.encoders}), args.routers_dir)
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    pinning = f"pinned to cores {sorted(args.cpus)}" if args.cpus else "not pinned"
    stream = PromptStream(resolve_data_dir(args.data))
    loop_name = "asyncio"
    runner_factory: Callable[[], Any] | None = None
    try:
        import uvloop

        runner_factory, loop_name = uvloop.new_event_loop, f"uvloop {uvloop.__version__}"
    except ImportError:  # the gateway falls back the same way
        pass

    results: dict[str, EncoderResult] = {}
    steps = len(args.encoders) * (len(args.concurrency) * args.rounds + 2)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as prog:
        task = prog.add_task("decision latency", total=steps)
        for encoder in args.encoders:
            prog.update(task, description=f"{encoder}")
            coro: Awaitable[EncoderResult] = bench_encoder(encoder, stream, args, prog, task)
            with asyncio.Runner(loop_factory=runner_factory) as runner:
                results[encoder] = runner.run(coro)  # type: ignore[arg-type]
            gc.unfreeze()
            res = results[encoder]
            cells = ", ".join(
                f"c={c}: p50 {r['p50_ms']:.3f} ms, {r['decisions_per_s']:.0f}/s" for c, r in res.cells.items()
            )
            prog.console.print(f"{encoder} ({res.encoder_id}, loaded in {res.load_s:.1f}s): {cells}")

    checks = evaluate(results)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _procs.cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "loop": loop_name,
        "pinning": pinning,
        # Sticky sessions in Redis (one pipelined round trip per decision, a second when a session
        # escalates) or in-process; bench keys expire with the route's 600 s TTL.
        "sessions": "redis" if args.redis else "in-process",
        "rounds": args.rounds,
        "max_batch": args.max_batch,
        "encoder_threads": args.encoder_threads if args.encoder_threads is not None else "default",
        "minilm_variants": {spec: res.runtime for spec, res in results.items() if split_spec(spec)[0] == "minilm"},
        "prompt_mix": {
            "mmlu": PATTERN.count("mmlu") / len(PATTERN),
            "gsm8k": PATTERN.count("gsm8k") / len(PATTERN),
            "mt_bench": PATTERN.count("mt_bench") / len(PATTERN),
        },
        "pool_sizes": {k: len(v) for k, v in stream.pools.items()},
        "recycled_prompts": {name: res.recycled for name, res in results.items()},
        "max_foreign_cpu": max(
            (r["max_foreign_cpu"] for res in results.values() for r in res.cells.values()), default=0.0
        ),
        "elapsed_s": time.monotonic() - started,
    }
    print_rich(results, checks, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decision_latency.md").write_text(render_markdown(results, checks, meta))
    payload = {
        "meta": meta,
        "checks": checks,
        "encoders": {
            name: {
                "encoder_id": res.encoder_id,
                "head": res.head,
                "load_s": res.load_s,
                "cache_off": {str(c): r for c, r in res.cells.items()},
                "cache_on_repeated": {str(c): r for c, r in res.cached.items()},
                "breakdown_c1": res.breakdown,
            }
            for name, res in results.items()
        },
    }
    (args.out / "decision_latency.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out / 'decision_latency.md'} and .json in {meta['elapsed_s']:.0f}s")
    return 0 if all(ch["ok"] for ch in checks) else 1


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure, print and write the results."""
    parser = argparse.ArgumentParser(description="routing decision latency (signals + policy, no backend)")
    parser.add_argument(
        "--encoders",
        default=None,
        help="comma-separated: static, minilm, or minilm@RUNTIME (onnx, torchscript, torch) for a side-by-side "
        "run (default: static,minilm, plus minilm@onnx where the default MiniLM runtime is another one)",
    )
    parser.add_argument("--concurrency", type=int_list(), default="1,32", help="comma-separated concurrencies")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per cell (medians are reported)")
    parser.add_argument(
        "--decisions",
        type=int,
        default=0,
        help="decisions per round (default: per encoder and concurrency, sized to ~1-4 s)",
    )
    parser.add_argument("--max-batch", type=int, default=32, help="classifiers.max_batch")
    parser.add_argument(
        "--encoder-threads", type=int, default=None, help="classifiers.encoder_threads (default: the gateway's)"
    )
    parser.add_argument("--routers-dir", type=Path, default=None, help="trained router artifacts")
    parser.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="keep sticky sessions in this Redis, as replicas do (default: in-process)",
    )
    parser.add_argument("--data", default=None, help="data directory (holds routellm/)")
    parser.add_argument("--cpus", type=int_list(minimum=0, allow_empty=True), default="",
                        help="pin this process to these cores, e.g. 0,1 (default: not pinned)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    from classifiers.encoders import MINILM_RUNTIMES

    args.encoders = [e for e in args.encoders.split(",") if e] if args.encoders else default_specs()
    unknown = {spec for spec in args.encoders if split_spec(spec)[0] not in ENCODERS}
    bad_runtime = {
        spec
        for spec in args.encoders
        if split_spec(spec)[1] not in (None, *MINILM_RUNTIMES) or spec.startswith("static@")
    }
    if unknown or bad_runtime:
        parser.error(
            f"unknown encoder(s): {', '.join(sorted(unknown | bad_runtime))} "
            f"(static, minilm, minilm@{{{','.join(MINILM_RUNTIMES)}}})"
        )
    args.cpus = set(args.cpus)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
