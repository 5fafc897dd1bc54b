"""Live cascade confidence: how well each confidence source separates a real cheap model's right answers
from its wrong ones, measured end to end through a real Pointsman gateway, and what a cascade on it costs.

The offline half of issue 12 (``cascade_quality.py``) scores *recorded* GSM8K answers of Mixtral / GPT-4
with the answer-confidence head; token logprobs and sample agreement need answers the recordings do not
have. This bench makes them live:

- **Cheap model:** the embedded SmolLM2-135M-Instruct (llama.cpp, the gateway's ``local_model``), temperature
  0 for its answer, a three-shot prompt that makes its answers gradeable (``a + b = c.`` then
  ``Answer: <number>``).
- **Strong model:** a replay fake upstream (this script, ``--serve-fake``, aiohttp) that answers every
  prompt with its correct worked solution (GSM8K: GPT-4-1106's recorded response).
- **Prompts:** a seeded generator of one- and two-step arithmetic word problems with known answers, mixed so
  that SmolLM2 gets a real share right; ``--gsm8k N`` adds GSM8K prompts GPT-4 answered correctly (graded
  against GPT-4's final number), analysed separately.
- **Per prompt, through the gateway:** ``cascade/logprobs`` (``source: logprobs, stat: mean``; the client
  asks ``logprobs: true, top_logprobs: 2`` itself, so the same response also gives ``min`` and ``margin``,
  computed with ``gateway.workflows.confidence.logprob_confidence``), ``cascade/head`` (the shipped
  answer-confidence head), ``cascade/agreement-K`` (K samples at temperature 0.7), and the strong model by
  name. The cascades run with ``threshold: 0`` and ``on_missing: accept`` so the cheap answer is always
  served and its confidence is read from the ``pointsman`` extension (``steps[i].confidence``); thresholds
  are then swept offline over the collected (confidence, cheap correct, strong correct, costs): the
  answers and confidences are live, the sweep is arithmetic. A second gateway then runs the logprobs and
  head cascades at the thresholds the sweep chose for 95% of strong quality on the first ``--verify``
  prompts and checks the live escalations, quality and cost against the sweep's prediction.
- **Costs:** a pricing assumption, not a measurement: the cheap model is priced as Mixtral-8x7B ($0.6 /
  $0.6 per Mtok), the strong one as GPT-4-1106 ($10 / $30); every call is paid (each agreement sample,
  and the strong call on escalation). Cheap tokens are the counts SmolLM2 reported through the gateway;
  the replay upstream counts ceil(chars / 4) + 4 per message (+ 3) for the prompt and ceil(chars / 4) for
  its answer.
- **Reported:** per source, the AUC of confidence vs the served cheap answer's correctness with a bootstrap
  95% CI, the cascade's cost (share of always-strong's) to reach 80% and 95% of the strong model's quality
  with paired bootstrap CIs (1,000 resamples of the prompts), against always-weak, always-strong, the
  random mix and the oracle cascade, and the live wall time per prompt of each source on this CPU.
  Also two implementation checks (agreement samples under a client ``seed``; the head's score with and
  without the few-shot turns, in-process).

Run (from the repository root; ~20 min at the defaults on 2 shared cores)::

    nice -n 5 .venv/bin/python bench/cascade_live.py [--n 150] [--samples 3,5] [--gsm8k 0] [--verify 40]
    nice -n 5 .venv/bin/python bench/cascade_live.py --n 12 --verify 6 --out /tmp/cl-debug   # a smoke run
    .venv/bin/python bench/cascade_live.py --reanalyse bench/results/cascade_live/results.json  # no gateway

Writes ``bench/results/cascade_live/{results.json,report.md,curves.png}`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _procs  # noqa: E402
from _args import int_list  # noqa: E402

from classifiers.answer_confidence import final_answer  # noqa: E402
from evals.cascade import (  # noqa: E402
    GPT4_1106_PRICES,
    MIXTRAL_8X7B_PRICES,
    Curve,
    PairTable,
    PolicySpec,
    bootstrap_costs,
    relative_cost_at,
)
from evals.metrics import percentile_ci  # noqa: E402
from evals.report import jsonable  # noqa: E402
from gateway.workflows.confidence import logprob_confidence  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cascade_live"
CHEAP = "smollm2-135m"  # the local model's own name
STRONG = "strong"
STRONG_UPSTREAM = "gpt-4-1106-replay"
TARGETS = (0.8, 0.95)
SAMPLE_TEMPERATURE = 0.7
SYSTEM = "Solve the problem. Write the calculation, then 'Answer: <number>'."
FEW_SHOT = (
    ("Sam has 3 pens. Sam gets 2 more pens. How many pens does Sam have now?", "3 + 2 = 5.\nAnswer: 5"),
    ("Eva has 9 cups. Eva gives away 4 cups. How many cups does Eva have left?", "9 - 4 = 5.\nAnswer: 5"),
    ("Max has 4 bags with 6 rocks in each bag. How many rocks does Max have?", "4 * 6 = 24.\nAnswer: 24"),
)
NAMES = ("Tom", "Ana", "Raj", "Mia", "Leo", "Sara", "Ken", "Lily", "Omar", "Eva", "Noah", "Zoe")
ITEMS = ("apples", "pencils", "marbles", "stickers", "cookies", "books", "coins", "cards", "shells", "stamps")
BOXES = ("bags", "boxes", "jars", "baskets")
# Difficulty mix: SmolLM2-135M gets roughly half the one-step single-digit problems, a few of the larger
# one-step ones and almost none of the two-step ones (measured while designing this bench).
LEVELS = (("one-step, 1 digit", 0.6), ("one-step, 2 digits", 0.2), ("two-step", 0.2))
CAPS = {"max_steps": 16, "max_seconds": 600}
LOGPROBS_MEAN = "logprobs: mean (cascade, through the gateway)"
HEAD = "answer-confidence head (shipped, cascade)"


# ------------------------------------------------------------------------------------------ prompts
@dataclass(frozen=True)
class Problem:
    """One prompt with its known answer and the strong model's (replayed) worked solution."""

    pid: str
    kind: str
    level: str
    question: str
    answer: float
    solution: str


def _one_step(rng: random.Random, op: str, name: str, item: str, a: int, b: int) -> tuple[str, int, str]:
    box = rng.choice(BOXES)
    if op == "add":
        question = rng.choice((
            f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?",
            f"There are {a} {item} on a table. {name} puts {b} more {item} on the table. "
            f"How many {item} are on the table now?",
            f"{name} had {a} {item} and found {b} more. How many {item} does {name} have in total?",
        ))
        return question, a + b, f"{name} starts with {a} {item} and adds {b}: {a} + {b} = {a + b}.\nAnswer: {a + b}"
    if op == "sub":
        question = rng.choice((
            f"{name} has {a} {item}. {name} gives away {b} {item}. How many {item} does {name} have left?",
            f"There are {a} {item} in a box. {name} takes out {b} {item}. How many {item} are still in the box?",
            f"{name} had {a} {item} and lost {b} of them. How many {item} does {name} have now?",
        ))
        return question, a - b, f"{name} starts with {a} {item} and {b} are gone: {a} - {b} = {a - b}.\nAnswer: {a - b}"
    question = rng.choice((
        f"{name} has {a} {box} with {b} {item} in each. How many {item} does {name} have?",
        f"There are {a} {box} and each holds {b} {item}. How many {item} are there in all?",
        f"{name} buys {a} packs of {item}. Each pack has {b} {item}. How many {item} does {name} buy?",
    ))
    return question, a * b, f"{a} groups of {b} {item}: {a} * {b} = {a * b}.\nAnswer: {a * b}"


def make_problem(rng: random.Random, index: int) -> Problem:
    """One seeded word problem: one-step with single digits, one-step with a two-digit number, or two-step."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    level = rng.choices([lv for lv, _ in LEVELS], weights=[w for _, w in LEVELS])[0]
    if level.startswith("one-step"):
        op = rng.choice(("add", "sub", "mul"))
        if level == "one-step, 1 digit":
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            if op == "sub":
                a, b = max(a, b) + 1, min(a, b)
        elif op == "mul":
            a, b = rng.randint(2, 9), rng.randint(11, 15)
        else:
            a, b = rng.randint(11, 30), rng.randint(2, 9)
        question, answer, solution = _one_step(rng, op, name, item, a, b)
        return Problem(f"s{index:04d}", f"{level} {op}", level, question, float(answer), solution)
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
    op = rng.choice(("add-add", "mul-add", "add-sub"))
    if op == "add-add":
        question = (f"{name} has {a} {item}. {name} finds {b} more and then buys {c} more. "
                    f"How many {item} does {name} have now?")
        answer = a + b + c
        solution = f"{a} + {b} = {a + b}, then {a + b} + {c} = {answer}.\nAnswer: {answer}"
    elif op == "mul-add":
        box = rng.choice(BOXES)
        question = (f"{name} has {a} {box} with {b} {item} in each and {c} more {item} outside. "
                    f"How many {item} does {name} have in total?")
        answer = a * b + c
        solution = f"{a} * {b} = {a * b} in the {box}, plus {c}: {a * b} + {c} = {answer}.\nAnswer: {answer}"
    else:
        c = min(c, a + b - 1)
        question = (f"{name} has {a} {item} and gets {b} more. Then {name} gives {c} away. "
                    f"How many {item} does {name} have left?")
        answer = a + b - c
        solution = f"{a} + {b} = {a + b}, then {a + b} - {c} = {answer}.\nAnswer: {answer}"
    return Problem(f"s{index:04d}", f"two-step {op}", level, question, float(answer), solution)


def synthetic_problems(n: int, seed: int) -> list[Problem]:
    """``n`` seeded problems (distinct questions)."""
    rng = random.Random(seed)
    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < n:
        problem = make_problem(rng, len(out))
        if problem.question not in seen:
            seen.add(problem.question)
            out.append(problem)
    return out


def gsm8k_problems(n: int, seed: int, data_dir: Path | None) -> list[Problem]:
    """``n`` seeded GSM8K prompts (contaminated ones dropped) that GPT-4-1106 answered correctly and whose
    final number can be read; the reference answer is GPT-4's final number, its response the replay."""
    from evals.data import resolve_data_dir
    from evals.train_answer_confidence import load_gsm8k_answers

    data = load_gsm8k_answers(resolve_data_dir(str(data_dir) if data_dir else None))
    rows = []
    for i, (prompt, response, good) in enumerate(zip(data.prompts, data.strong_answers, data.strong_good, strict=True)):
        value, _ = final_answer(response)
        if good and value is not None:
            rows.append(Problem(f"g{i:04d}", "gsm8k", "gsm8k", prompt, float(value), response.strip()))
    random.Random(seed).shuffle(rows)
    return rows[:n]


def messages(question: str) -> list[dict[str, str]]:
    """The chat sent for one problem: the system prompt, three worked examples, the question."""
    out = [{"role": "system", "content": SYSTEM}]
    for user, assistant in FEW_SHOT:
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*out, {"role": "user", "content": question}]


def same_number(a: float | None, b: float) -> bool:
    """Graded as right: the answer's final number equals the reference (within 0.005 or 0.1%)."""
    if a is None or not math.isfinite(a):
        return False
    d = abs(a - b)
    return d <= 0.005 + 1e-9 or d <= 1e-3 * max(abs(a), abs(b))


def grade(text: str, answer: float) -> bool:
    """Right when the text's final number (``classifiers.answer_confidence.final_answer``) is the answer."""
    return same_number(final_answer(text)[0], answer)


# ------------------------------------------------------------------------------------------ fake upstream
def _estimate_prompt_tokens(body: dict[str, Any]) -> int:
    msgs = body.get("messages") or []
    return 3 + sum(4 + math.ceil(len(str(m.get("content") or "")) / 4) for m in msgs if isinstance(m, dict))


def serve_fake(port: int, answers_path: Path) -> None:
    """The strong model: replays each question's correct solution (looked up by the last user message)."""
    import aiohttp.web

    answers: dict[str, str] = json.loads(answers_path.read_text())

    async def chat(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        body = await request.json()
        users = [m for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
        question = str(users[-1].get("content", "")) if users else ""
        text = answers.get(question, "I do not know.")
        prompt_tokens, completion_tokens = _estimate_prompt_tokens(body), math.ceil(len(text) / 4)
        return aiohttp.web.json_response({
            "id": "replay",
            "object": "chat.completion",
            "created": 0,
            "model": str(body.get("model", STRONG_UPSTREAM)),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    async def models(_request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response({"object": "list", "data": [{"id": STRONG_UPSTREAM, "object": "model"}]})

    app = aiohttp.web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    aiohttp.web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# ------------------------------------------------------------------------------------------ gateway
def _cascade(name: str, confidence: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "kind": "cascade", "stages": [CHEAP, STRONG], "confidence": confidence, "caps": CAPS}


def collect_workflows(samples: Sequence[int]) -> list[dict[str, Any]]:
    """Data-collection cascades: threshold 0 and ``on_missing: accept`` serve the cheap answer always,
    so every prompt's cheap answer and confidence come back (the schema caps thresholds at 1.0)."""
    never: dict[str, Any] = {"threshold": 0.0, "on_missing": "accept"}
    return [
        _cascade("logprobs", {"source": "logprobs", "stat": "mean", **never}),
        _cascade("head", {"source": "head", **never}),
        *[_cascade(f"agreement-{k}", {"source": "agreement", "samples": k, "temperature": SAMPLE_TEMPERATURE, **never})
          for k in samples],
    ]


def verify_workflows(thresholds: dict[str, float]) -> list[dict[str, Any]]:
    """The cascades at the thresholds the sweep chose (the gateway's defaults: missing confidence escalates)."""
    out = []
    if "logprobs" in thresholds:
        out.append(_cascade("logprobs-at-95",
                            {"source": "logprobs", "stat": "mean", "threshold": thresholds["logprobs"]}))
    if "head" in thresholds:
        out.append(_cascade("head-at-95", {"source": "head", "threshold": thresholds["head"]}))
    return out


def gateway_config(port: int, upstream_port: int, workflows: list[dict[str, Any]]) -> dict[str, Any]:
    """The embedded SmolLM2 (``local_model``) and the replay upstream as ``strong`` (GPT-4-1106 prices)."""
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "local_model": {"enabled": True},
        "backends": [{
            "name": "replay",
            "base_url": f"http://127.0.0.1:{upstream_port}/v1",
            "health": {"enabled": False},
            "models": [{
                "name": STRONG,
                "upstream_name": STRONG_UPSTREAM,
                "input_cost_per_mtok": GPT4_1106_PRICES.input_per_mtok,
                "output_cost_per_mtok": GPT4_1106_PRICES.output_per_mtok,
            }],
        }],
        "workflows": workflows,
        "store": {"kind": "none"},
    }


class Gateway:
    """A replay upstream and a gateway (with its embedded model) started for one phase, stopped after."""

    def __init__(self, tmp: Path, answers: dict[str, str], workflows: list[dict[str, Any]], tag: str) -> None:
        import yaml

        self.tmp, self.tag = tmp, tag
        self.upstream_port, self.port = _procs.free_port(), _procs.free_port()
        answers_path = tmp / "answers.json"
        answers_path.write_text(json.dumps(answers))
        self.config = tmp / f"config-{tag}.yaml"
        self.config.write_text(yaml.safe_dump(gateway_config(self.port, self.upstream_port, workflows)))
        self.upstream = _procs.start(
            [sys.executable, __file__, "--serve-fake", str(self.upstream_port), "--answers", str(answers_path)],
            tmp / f"upstream-{tag}.log",
        )
        self.gateway: Any = None
        try:
            _procs.wait_http(f"http://127.0.0.1:{self.upstream_port}/v1/models", self.upstream, 30,
                             log_path=tmp / f"upstream-{tag}.log")
            self.gateway = _procs.start(
                [sys.executable, "-m", "gateway.cli", "serve", "--config", str(self.config)],
                tmp / f"gateway-{tag}.log", cwd=ROOT,
            )
            _procs.wait_http(f"{self.url}/ready", self.gateway, 300, log_path=tmp / f"gateway-{tag}.log")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        _procs.stop(self.gateway)
        _procs.stop(self.upstream)


# ------------------------------------------------------------------------------------------ live calls
async def _post(session: Any, url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float, dict[str, str]]:
    """(response JSON, wall seconds, headers); raises on a non-200."""
    started = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        payload = await response.json(content_type=None)
        wall = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{body['model']}: HTTP {response.status}: {json.dumps(payload)[:400]}")
        return payload, wall, dict(response.headers)


def _text(completion: dict[str, Any]) -> str:
    content = completion["choices"][0]["message"].get("content")
    return content if isinstance(content, str) else ""


def _workflow_call(completion: dict[str, Any], wall: float, headers: dict[str, str], answer: float) -> dict[str, Any]:
    """What one cascade answer tells: the served text, its grade, the checked stage's confidence, the
    cheap calls' tokens (every sample counted), the strong call if it escalated, latencies."""
    ext = completion.get("pointsman") or {}
    steps = ext.get("steps") or []
    cheap = [s for s in steps if s.get("model") == CHEAP or str(s.get("model", "")).startswith(CHEAP)]
    strong = [s for s in steps if s not in cheap]
    confidences = [s.get("confidence") for s in cheap if s.get("confidence") is not None]
    text = _text(completion)
    return {
        "text": text,
        "correct": grade(text, answer),
        "confidence": confidences[-1] if confidences else None,
        "escalated": bool(ext.get("escalated")),
        "stage": headers.get("x-pointsman-stage"),
        "cheap_calls": len(cheap),
        "cheap_prompt_tokens": sum(int(s.get("prompt_tokens") or 0) for s in cheap),
        "cheap_completion_tokens": sum(int(s.get("completion_tokens") or 0) for s in cheap),
        "strong_calls": len(strong),
        "strong_cost_usd_gateway": sum(float(s.get("cost_usd") or 0.0) for s in strong),
        "step_latency_ms": [s.get("latency_ms") for s in steps],
        "wall_s": wall,
        "capped": ext.get("capped"),
        "degraded": ext.get("degraded"),
    }


async def collect(url: str, problems: Sequence[Problem], samples: Sequence[int], max_tokens: int,
                  progress: Callable[[Iterable[Problem]], Iterable[Problem]]) -> list[dict[str, Any]]:
    """Every source's cheap answer and confidence, and the strong answer, per problem, interleaved."""
    import aiohttp

    records = []
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for problem in progress(problems):
            msgs = messages(problem.question)
            base = {"messages": msgs, "max_tokens": max_tokens, "temperature": 0}
            record: dict[str, Any] = {**asdict(problem)}
            completion, wall, headers = await _post(
                session, url, {**base, "model": "cascade/logprobs", "logprobs": True, "top_logprobs": 2}
            )
            call = _workflow_call(completion, wall, headers, problem.answer)
            # The client asked for logprobs, so the gateway leaves them on the answer: all three stats from
            # the one call, computed exactly as the gateway does.
            call["stats"] = {stat: logprob_confidence(completion, stat) for stat in ("mean", "min", "margin")}
            record["logprobs"] = call
            completion, wall, headers = await _post(session, url, {**base, "model": "cascade/head"})
            record["head"] = _workflow_call(completion, wall, headers, problem.answer)
            for k in samples:
                # No client ``seed`` here: the gateway would pass it to every sample (see the seed check).
                completion, wall, headers = await _post(session, url, {**base, "model": f"cascade/agreement-{k}"})
                record[f"agreement-{k}"] = _workflow_call(completion, wall, headers, problem.answer)
            completion, wall, headers = await _post(session, url, {**base, "model": STRONG})
            usage = completion.get("usage") or {}
            record["strong"] = {
                "text": _text(completion),
                "correct": grade(_text(completion), problem.answer),
                "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "completion_tokens": int(usage.get("completion_tokens") or 0),
                "wall_s": wall,
            }
            records.append(record)
    return records


async def seed_check(url: str, problems: Sequence[Problem], k: int, max_tokens: int) -> dict[str, Any]:
    """The agreement cascade with and without a client ``seed`` on a few prompts: the gateway passes the
    client's seed to every sample, and a backend that honours it returns K identical samples."""
    import aiohttp

    out: dict[str, list[float | None]] = {"without seed": [], "with seed 7": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for problem in problems:
            body = {"model": f"cascade/agreement-{k}", "messages": messages(problem.question),
                    "max_tokens": max_tokens, "temperature": 0}
            for label, extra in (("without seed", {}), ("with seed 7", {"seed": 7})):
                completion, _, _ = await _post(session, url, {**body, **extra})
                out[label].append(_workflow_call(completion, 0.0, {}, problem.answer)["confidence"])
    return {"prompts": len(problems), "samples": k, "confidence": out,
            "all_agree_share": {label: float(np.mean([c == 1.0 for c in v])) for label, v in out.items()}}


async def cache_check(url: str, problems: Sequence[Problem], other: Problem, max_tokens: int) -> dict[str, Any]:
    """Why a greedy answer can differ between two identical calls: each prompt asked of the cheap model by
    name, with and without logprobs, "cold" (right after another prompt) and "warm" (right after itself,
    so llama.cpp reuses the whole prompt from its cache and re-evaluates only the last token)."""
    import aiohttp

    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def ask(problem: Problem, logprobs: bool) -> str:
            body: dict[str, Any] = {"model": CHEAP, "messages": messages(problem.question),
                                    "max_tokens": max_tokens, "temperature": 0}
            if logprobs:
                body |= {"logprobs": True, "top_logprobs": 2}
            return _text((await _post(session, url, body))[0])

        for problem in problems:
            row: dict[str, Any] = {"pid": problem.pid}
            for logprobs in (False, True):
                await ask(other, False)
                row[f"cold, logprobs={logprobs}"] = await ask(problem, logprobs)
                row[f"warm, logprobs={logprobs}"] = await ask(problem, logprobs)
            rows.append(row)
    same = lambda a, b: float(np.mean([r[a] == r[b] for r in rows])) if rows else float("nan")  # noqa: E731
    return {
        "prompts": len(rows),
        "logprobs_same_answer_cold": same("cold, logprobs=False", "cold, logprobs=True"),
        "logprobs_same_answer_warm": same("warm, logprobs=False", "warm, logprobs=True"),
        "cold_same_as_warm_without_logprobs": same("cold, logprobs=False", "warm, logprobs=False"),
        "rows": rows,
    }


async def verify(url: str, problems: Sequence[Problem], names: Sequence[str], max_tokens: int,
                 progress: Callable[[Iterable[Problem]], Iterable[Problem]]) -> dict[str, list[dict[str, Any]]]:
    """Run the cascades at their chosen thresholds (nothing forced): what the gateway really does."""
    import aiohttp

    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for problem in progress(problems):
            for name in names:
                body = {"model": f"cascade/{name}-at-95", "messages": messages(problem.question),
                        "max_tokens": max_tokens, "temperature": 0}
                completion, wall, headers = await _post(session, url, body)
                out[name].append({"pid": problem.pid, **_workflow_call(completion, wall, headers, problem.answer)})
    return out


# ------------------------------------------------------------------------------------------ analysis
@dataclass(frozen=True)
class Source:
    """A confidence source: which live call served the cheap answer, and which of its numbers is the
    confidence (``stat`` None: the cascade's own, from the extension; else a logprob stat of that call)."""

    name: str
    call: str
    stat: str | None = None

    def confidence(self, record: dict[str, Any]) -> float | None:
        call = record[self.call]
        value = call["confidence"] if self.stat is None else call["stats"][self.stat]
        return None if value is None else float(value)


def sources(samples: Sequence[int]) -> list[Source]:
    """The sources compared, all measured through the gateway."""
    return [
        Source(LOGPROBS_MEAN, "logprobs"),
        Source("logprobs: min (same answer's logprobs)", "logprobs", "min"),
        Source("logprobs: margin (same answer's logprobs)", "logprobs", "margin"),
        Source(HEAD, "head"),
        *[Source(f"agreement: {k} samples at T={SAMPLE_TEMPERATURE} (cascade)", f"agreement-{k}") for k in samples],
    ]


def auc(correct: np.ndarray, score: np.ndarray) -> float:
    """P(score of a right answer > score of a wrong one), ties counted half (NaN with one class only)."""
    y = np.asarray(correct, dtype=bool)
    s = np.asarray(score, dtype=float)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def _cost(prices: Any, prompt: np.ndarray, completion: np.ndarray) -> np.ndarray:
    return np.asarray(prices.call_cost(prompt, completion), dtype=float)


def table_for(records: Sequence[dict[str, Any]], call: str) -> PairTable:
    """Per prompt: strong / served-cheap correctness, the strong call's cost and the cheap calls' cost."""
    strong = [r["strong"] for r in records]
    cheap = [r[call] for r in records]
    return PairTable(
        strong_quality=np.array([s["correct"] for s in strong], dtype=float),
        weak_quality=np.array([c["correct"] for c in cheap], dtype=float),
        strong_cost=_cost(GPT4_1106_PRICES, np.array([s["prompt_tokens"] for s in strong], dtype=float),
                          np.array([s["completion_tokens"] for s in strong], dtype=float)),
        weak_cost=_cost(MIXTRAL_8X7B_PRICES, np.array([c["cheap_prompt_tokens"] for c in cheap], dtype=float),
                        np.array([c["cheap_completion_tokens"] for c in cheap], dtype=float)),
    )


def escalation_of(confidence: Sequence[float | None]) -> np.ndarray:
    """1 - confidence; a missing confidence escalates first (the gateway's default, ``on_missing: escalate``)."""
    return np.array([2.0 if c is None else 1.0 - float(c) for c in confidence])


def operating_point(curve: Curve, table: PairTable, target: float) -> dict[str, float] | None:
    """The cheapest single threshold reaching ``target`` x strong quality (no mixing of two thresholds)."""
    need = target * table.strong_mean_quality - 1e-12
    ok = np.flatnonzero(curve.quality >= need)
    if len(ok) == 0:
        return None
    best = ok[np.argmin(curve.cost[ok])]
    return {"escalation_threshold": float(curve.threshold[best]), "quality": float(curve.quality[best]),
            "relative_cost": float(curve.cost[best] / table.strong_mean_cost),
            "escalated_share": float(curve.strong_calls[best])}


def gateway_threshold(escalation_threshold: float, confidences: Sequence[float | None]) -> float:
    """A gateway threshold (escalate when confidence < it) that escalates exactly the prompts with
    1 - confidence >= ``escalation_threshold``: halfway between the highest escalated confidence and the
    next collected one (the extension rounds confidences to 6 decimals; a midpoint is robust to that)."""
    if not math.isfinite(escalation_threshold):
        return 0.0
    boundary = 1.0 - escalation_threshold
    above = sorted(c for c in confidences if c is not None and c > boundary + 1e-9)
    return 1.0 if not above else (boundary + above[0]) / 2


def analyse(records: Sequence[dict[str, Any]], samples: Sequence[int], draws: int, seed: int) -> dict[str, Any]:
    """AUCs, costs at 80/95% with paired bootstrap CIs (every policy sees the same resampled prompts, so
    differences to the random mix have valid intervals too), baselines, latencies; curves for the plot."""
    n = len(records)
    greedy = table_for(records, "logprobs")
    rng = np.random.default_rng(seed)
    idx_draws = [rng.integers(0, n, n) for _ in range(draws)]  # the draws bootstrap_costs makes with this seed
    curves: dict[str, dict[str, list[float]]] = {}
    gain = greedy.strong_quality - greedy.weak_quality
    baselines: dict[str, Any] = {}
    mix_boot: dict[float, np.ndarray] = {}
    for name, spec in (("random mix", PolicySpec("random mix", "mix")),
                       ("oracle cascade (escalates exactly the prompts it gains on)",
                        PolicySpec("oracle", "cascade", gain))):
        boot = bootstrap_costs(greedy, [spec], TARGETS, draws, seed)[spec.name]
        mix_boot = boot if spec.kind == "mix" else mix_boot
        curve = spec.curve(greedy)
        baselines[name] = {f"{t:g}": {"relative_cost": relative_cost_at(curve, greedy, t),
                                      "ci95": list(percentile_ci(boot[t]))} for t in TARGETS}
        curves[name] = {"relative_cost": (curve.cost / greedy.strong_mean_cost).tolist(),
                        "quality_share": (curve.quality / greedy.strong_mean_quality).tolist()}
    out_sources: dict[str, Any] = {}
    for src in sources(samples):
        table = table_for(records, src.call)
        conf = [src.confidence(r) for r in records]
        escalation = escalation_of(conf)
        y = table.weak_quality > 0.5
        score = -escalation
        boot_auc = np.array([auc(y[i], score[i]) for i in idx_draws])
        spec = PolicySpec(src.name, "cascade", escalation)
        boot = bootstrap_costs(table, [spec], TARGETS, draws, seed)[src.name]
        curve = spec.curve(table)
        costs = {}
        for t in TARGETS:
            point = relative_cost_at(curve, table, t)
            mix_point = baselines["random mix"][f"{t:g}"]["relative_cost"]
            costs[f"{t:g}"] = {"relative_cost": point, "ci95": list(percentile_ci(boot[t])),
                               "unreached_share": float(np.mean(~np.isfinite(boot[t]))),
                               "minus_random_mix": point - mix_point,
                               "minus_random_mix_ci95": list(percentile_ci(boot[t] - mix_boot[t])),
                               "single_threshold": operating_point(curve, table, t)}
        latency = [r[src.call]["wall_s"] for r in records]
        out_sources[src.name] = {
            "call": src.call,
            "cheap_accuracy": float(table.weak_quality.mean()),
            "missing_confidence": int(sum(c is None for c in conf)),
            "auc": auc(y, score),
            "auc_ci95": list(percentile_ci(boot_auc)),
            "costs": costs,
            "cheap_calls_per_prompt": float(np.mean([r[src.call]["cheap_calls"] for r in records])),
            "cheap_cost_share": float(table.weak_cost.mean() / table.strong_mean_cost),
            "latency_s": {"median": statistics.median(latency), "mean": statistics.fmean(latency),
                          "p90": float(np.percentile(latency, 90))},
        }
        curves[src.name] = {"relative_cost": (curve.cost / table.strong_mean_cost).tolist(),
                            "quality_share": (curve.quality / table.strong_mean_quality).tolist()}
    return {
        "prompts": n,
        "always_weak": {"quality": float(greedy.weak_quality.mean()),
                        "quality_share": float(greedy.weak_quality.mean() / greedy.strong_mean_quality),
                        "relative_cost": float(greedy.weak_cost.mean() / greedy.strong_mean_cost)},
        "always_strong": {"quality": greedy.strong_mean_quality, "relative_cost": 1.0,
                          "cost_usd_per_prompt": greedy.strong_mean_cost},
        "sources": out_sources,
        "baselines": baselines,
        "accuracy_by_level": _by(records, "level"),
        "accuracy_by_kind": _by(records, "kind"),
        "_curves": curves,
    }


def _by(records: Sequence[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r[key], []).append(r)
    return {g: {"prompts": len(rs), "greedy_accuracy": float(np.mean([r["logprobs"]["correct"] for r in rs]))}
            for g, rs in sorted(groups.items())}


def consistency(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Checks on the collected data: greedy answers equal across the logprobs and head calls, the
    extension's mean equal to the same stat computed from the returned logprobs, nothing escalated."""
    diffs = [abs(r["logprobs"]["confidence"] - r["logprobs"]["stats"]["mean"]) for r in records
             if r["logprobs"]["confidence"] is not None and r["logprobs"]["stats"]["mean"] is not None]
    calls = [k for k in records[0] if k in ("logprobs", "head") or k.startswith("agreement-")] if records else []
    return {
        "greedy_text_same_in_logprobs_and_head_calls": float(np.mean(
            [r["logprobs"]["text"] == r["head"]["text"] for r in records])),
        "extension_mean_vs_recomputed_max_abs_diff": max(diffs) if diffs else None,
        "escalated_in_collection": int(sum(r[c]["escalated"] for r in records for c in calls)),
        "strong_correct_share": float(np.mean([r["strong"]["correct"] for r in records])),
    }


def head_without_history(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """In-process diagnostic (not through the gateway): the shipped head on the question alone vs on the
    whole conversation the gateway renders (system prompt and few-shot turns included)."""
    from classifiers.answer_confidence import AnswerConfidence
    from classifiers.conversation import conversation_text

    head = AnswerConfidence.load()
    texts = [r["head"]["text"] for r in records]
    y = np.array([r["head"]["correct"] for r in records], dtype=bool)
    bare = head.score_many([(r["question"], t) for r, t in zip(records, texts, strict=True)])
    whole = head.score_many([(conversation_text({"messages": messages(r["question"])}), t)
                             for r, t in zip(records, texts, strict=True)])
    gw = np.array([r["head"]["confidence"] if r["head"]["confidence"] is not None else np.nan for r in records])
    return {"auc_question_only": auc(y, bare), "auc_whole_conversation_in_process": auc(y, whole),
            "max_abs_diff_in_process_vs_gateway": float(np.nanmax(np.abs(whole - gw))) if len(gw) else None}


def check_verification(records: Sequence[dict[str, Any]], live: dict[str, list[dict[str, Any]]],
                       thresholds: dict[str, float]) -> dict[str, Any]:
    """Live cascades at the chosen thresholds vs what the sweep predicts for the same prompts."""
    by_pid = {r["pid"]: r for r in records}
    out = {}
    for name, runs in live.items():
        threshold = thresholds[name]
        predicted, actual, pred_correct, live_correct, live_cost, pred_cost = [], [], [], [], [], []
        for run in runs:
            r = by_pid[run["pid"]]
            conf = r[name]["confidence"]
            esc = conf is None or conf < threshold
            predicted.append(esc)
            actual.append(run["escalated"])
            pred_correct.append(r["strong"]["correct"] if esc else r[name]["correct"])
            live_correct.append(run["correct"])
            cheap = float(MIXTRAL_8X7B_PRICES.call_cost(run["cheap_prompt_tokens"], run["cheap_completion_tokens"]))
            live_cost.append(cheap + run["strong_cost_usd_gateway"])
            strong = float(GPT4_1106_PRICES.call_cost(r["strong"]["prompt_tokens"], r["strong"]["completion_tokens"]))
            base = float(MIXTRAL_8X7B_PRICES.call_cost(r[name]["cheap_prompt_tokens"],
                                                       r[name]["cheap_completion_tokens"]))
            pred_cost.append(base + (strong if esc else 0.0))
        strong_unit = float(np.mean([GPT4_1106_PRICES.call_cost(by_pid[x["pid"]]["strong"]["prompt_tokens"],
                                                                by_pid[x["pid"]]["strong"]["completion_tokens"])
                                     for x in runs]))
        out[name] = {
            "threshold": threshold,
            "prompts": len(runs),
            "same_decision": float(np.mean(np.array(predicted) == np.array(actual))),
            "escalated_predicted": float(np.mean(predicted)),
            "escalated_live": float(np.mean(actual)),
            "quality_predicted": float(np.mean(pred_correct)),
            "quality_live": float(np.mean(live_correct)),
            "relative_cost_predicted": float(np.mean(pred_cost) / strong_unit),
            "relative_cost_live": float(np.mean(live_cost) / strong_unit),
            "latency_s_median_live": statistics.median(x["wall_s"] for x in runs),
            "latency_s_median_escalated": (statistics.median(x["wall_s"] for x in runs if x["escalated"])
                                           if any(x["escalated"] for x in runs) else None),
        }
    return out


# ------------------------------------------------------------------------------------------ output
def _pct(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{100 * value:.1f}%"


def _ci(values: Sequence[float], pct: bool = True) -> str:
    lo, hi = values
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "[n/a]"
    return f"[{100 * lo:.1f}, {100 * hi:.1f}]" if pct else f"[{lo:.3f}, {hi:.3f}]"


def _points(value: float, ci: Sequence[float]) -> str:
    """A difference of cost shares in percentage points with its CI."""
    if not np.isfinite(value):
        return "n/a"
    lo, hi = ci
    return f"{100 * value:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" if np.isfinite(lo) else f"{100 * value:+.1f}"


def render_set(res: dict[str, Any], title: str) -> list[str]:
    """One prompt set's tables."""
    weak, strong = res["always_weak"], res["always_strong"]
    lines = [
        f"### {title} ({res['prompts']} prompts)",
        "",
        f"SmolLM2-135M (temperature 0) is right on **{_pct(weak['quality'])}** of the prompts; the strong "
        f"replay on {_pct(strong['quality'])}. Always-weak costs {_pct(weak['relative_cost'])} of always-strong "
        f"(always-strong: ${strong['cost_usd_per_prompt'] * 1000:.3f} per 1,000 prompts at the assumed prices). "
        "Costs: share of always-strong's; \u0394 mix: minus the random mix, in points, paired bootstrap CI.",
        "",
        "| confidence source | served cheap answer right | AUC [95% CI] | cost at 80% [CI] | \u0394 mix at 80% "
        "| cost at 95% [CI] | \u0394 mix at 95% | cheap calls / prompt (their cost) | escalated at 95% (one threshold) "
        "| wall s / prompt, median (mean) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in res["sources"].items():
        c80, c95 = s["costs"]["0.8"], s["costs"]["0.95"]
        op = c95["single_threshold"]
        right = round(s["cheap_accuracy"] * res["prompts"])
        few = min(right, res["prompts"] - right)
        count = f"{right} right" if right <= res["prompts"] - right else f"{res['prompts'] - right} wrong"
        auc_cell = (f"n/a (only {count})" if few < 5 or not np.isfinite(s["auc"])
                    else f"{s['auc']:.3f} {_ci(s['auc_ci95'], pct=False)}")
        lines.append(
            f"| {name} | {_pct(s['cheap_accuracy'])} | {auc_cell} | {_pct(c80['relative_cost'])} {_ci(c80['ci95'])} "
            f"| {_points(c80['minus_random_mix'], c80['minus_random_mix_ci95'])} "
            f"| {_pct(c95['relative_cost'])} {_ci(c95['ci95'])} "
            f"| {_points(c95['minus_random_mix'], c95['minus_random_mix_ci95'])} | {s['cheap_calls_per_prompt']:.1f} "
            f"({_pct(s['cheap_cost_share'])}) | {_pct(op['escalated_share']) if op else 'n/a'} "
            f"| {s['latency_s']['median']:.2f} ({s['latency_s']['mean']:.2f}) |"
        )
    for name, b in res["baselines"].items():
        lines.append(f"| *{name}* | | | {_pct(b['0.8']['relative_cost'])} {_ci(b['0.8']['ci95'])} | "
                     f"| {_pct(b['0.95']['relative_cost'])} {_ci(b['0.95']['ci95'])} | | | | |")
    lines += [f"| *always-weak* | {_pct(weak['quality'])} | | quality {_pct(weak['quality_share'])} of strong | "
              f"| | | 1.0 ({_pct(weak['relative_cost'])}) | 0% | |",
              "| *always-strong* | | | 100% | | 100% | | 0 | 100% | |", ""]
    lines += ["Greedy accuracy by difficulty: " + "; ".join(
        f"{k} {_pct(v['greedy_accuracy'])} of {v['prompts']}" for k, v in res["accuracy_by_level"].items()) + ".", ""]
    return lines


def render(result: dict[str, Any]) -> str:
    """The Markdown report."""
    meta = result["meta"]
    lines = [
        "# Live cascade confidence (SmolLM2-135M through a real gateway)",
        "",
        f"{meta['date']}, {meta['cpu']}, {meta['cores']} cores (shared); {meta['n']} synthetic prompts (seed "
        f"{meta['seed']}), max_tokens {meta['max_tokens']}, agreement samples {meta['samples']} at T="
        f"{SAMPLE_TEMPERATURE}; {meta['draws']} bootstrap resamples; live collection {meta['collect_s']:.0f} s, "
        f"whole run {meta['runtime_s']:.0f} s.",
        "",
        "**Live:** every answer, its correctness and its confidence (through the gateway's cascades), the "
        "wall times. **Assumed:** the prices (cheap = Mixtral-8x7B $0.6/$0.6, strong = GPT-4-1106 $10/$30 per "
        "Mtok) and therefore every cost share; the strong model is a replay that is right by construction. "
        "**Arithmetic:** the threshold sweep over the collected confidences (cost at 80/95% of strong quality "
        "interpolates between two thresholds, as in `cascade_quality.py`). Costs are a share of always-strong's, "
        "every cheap call counted (each agreement sample), plus the strong call on escalation.",
        "",
        *render_set(result["synthetic"], "Synthetic arithmetic word problems"),
    ]
    if "gsm8k" in result:
        g = result["gsm8k"]
        lines += render_set(g, "GSM8K (GPT-4-1106 right; graded against its final number)")
        if g["always_weak"]["quality"] * g["prompts"] < 5:
            lines += ["SmolLM2 gets almost no GSM8K prompt right: with under 5 right answers the AUCs and "
                      "cascade costs above cannot be estimated meaningfully (a cascade simply escalates "
                      "everything).", ""]
    checks = result["checks"]
    lines += ["## Checks", "",
              f"- Greedy answer identical in the logprobs and head calls: "
              f"{_pct(checks['greedy_text_same_in_logprobs_and_head_calls'])} of prompts.",
              f"- Cascade's `steps[0].confidence` vs `stat: mean` recomputed from the returned logprobs: max "
              f"|diff| {checks['extension_mean_vs_recomputed_max_abs_diff']}.",
              f"- Escalations during collection (threshold 0, `on_missing: accept`): "
              f"{checks['escalated_in_collection']}; strong replay graded right on "
              f"{_pct(checks['strong_correct_share'])}."]
    head = result.get("head_diagnostic")
    if head:
        lines.append(f"- Head, in-process (offline diagnostic): AUC {head['auc_question_only']:.3f} on the "
                     f"question alone vs {head['auc_whole_conversation_in_process']:.3f} on the whole "
                     "conversation (system prompt and few-shot turns), which is what the gateway scores "
                     f"(in-process vs gateway max |diff| {head['max_abs_diff_in_process_vs_gateway']:.2g}).")
    seed = result.get("seed_check")
    if seed:
        lines.append(f"- Agreement with a client `seed` ({seed['prompts']} prompts, {seed['samples']} samples): "
                     f"all samples agree on {_pct(seed['all_agree_share']['with seed 7'])} of prompts with "
                     f"`seed: 7` vs {_pct(seed['all_agree_share']['without seed'])} without: the gateway "
                     "passes the client's seed to every sample.")
    cache = result.get("cache_check")
    if cache:
        lines.append(f"- The {cache['prompts']} prompts whose greedy answers differed, re-asked of the model by name: "
                     f"with vs without logprobs the same answer on {_pct(cache['logprobs_same_answer_cold'])} "
                     f"(cold) / {_pct(cache['logprobs_same_answer_warm'])} (warm); cold vs warm prompt cache the "
                     f"same on {_pct(cache['cold_same_as_warm_without_logprobs'])}. (Warm: the same prompt again, "
                     "so llama.cpp reuses it from its cache and re-evaluates only its last token.)")
    ver = result.get("verification")
    if ver:
        lines += ["", "## Live cascades at the sweep's 95% threshold", "",
                  f"A second gateway runs each cascade at the single threshold that reaches 95% of strong quality "
                  f"on all {meta['n']} prompts (in-sample), with the gateway's defaults (missing confidence "
                  "escalates), on the first prompts; predicted = the sweep's arithmetic on the collected data for "
                  "the same prompts.", "",
                  "| cascade | threshold | prompts | same decision | escalated pred / live | quality pred / live "
                  "| cost pred / live | wall s median (escalated) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, v in ver.items():
            esc = v["latency_s_median_escalated"]
            lines.append(
                f"| {name} | {v['threshold']:.4f} | {v['prompts']} | {_pct(v['same_decision'])} "
                f"| {_pct(v['escalated_predicted'])} / {_pct(v['escalated_live'])} "
                f"| {_pct(v['quality_predicted'])} / {_pct(v['quality_live'])} "
                f"| {_pct(v['relative_cost_predicted'])} / {_pct(v['relative_cost_live'])} "
                f"| {v['latency_s_median_live']:.2f} ({'n/a' if esc is None else f'{esc:.2f}'}) |")
    lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Quality (share of strong) vs cost (share of always-strong's) per source, per prompt set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [k for k in ("synthetic", "gsm8k") if k in result]
    fig, axes = plt.subplots(1, len(sets), figsize=(10 * len(sets), 6.5), squeeze=False)
    for ax, key in zip(axes[0], sets, strict=True):
        res = result[key]
        for name, c in res["_curves"].items():
            x, y = 100 * np.array(c["relative_cost"]), 100 * np.array(c["quality_share"])
            order = np.argsort(x, kind="stable")
            style = ":" if name.startswith(("oracle", "random")) else "-"
            ax.plot(x[order], y[order], style, lw=1.3, label=name)
        ax.scatter([100 * res["always_weak"]["relative_cost"], 100], [100 * res["always_weak"]["quality_share"], 100],
                   color="k", zorder=5)
        for t in TARGETS:
            ax.axhline(100 * t, color="grey", ls="--", lw=0.7)
        ax.set(xlabel="cost, % of always-strong (every call counted; assumed prices)",
               ylabel="quality, % of the strong model's", xlim=(0, 105),
               title=f"{key}: live SmolLM2-135M cascades ({res['prompts']} prompts)")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _progress(desc: str) -> Callable[[Iterable[Any]], Iterable[Any]]:
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, total=len(it) if isinstance(it, Sequence) else None, file=sys.stderr,
                           dynamic_ncols=True)


def print_markdown(text: str) -> None:
    """Render the report with rich when it is installed."""
    try:
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=220).print(Markdown(text))
    except ImportError:
        print(text)


def _thresholds(res: dict[str, Any], records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The gateway thresholds of the logprobs-mean and head cascades at the 95% single-threshold point."""
    out = {}
    for call, name in (("logprobs", LOGPROBS_MEAN), ("head", HEAD)):
        op = res["sources"][name]["costs"]["0.95"]["single_threshold"]
        if op is not None:
            out[call] = gateway_threshold(op["escalation_threshold"], [r[call]["confidence"] for r in records])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=150, help="synthetic prompts (default 150)")
    # 2..16: what a cascade's agreement source takes (workflows: samples); checked before the gateway starts.
    parser.add_argument("--samples", type=int_list(minimum=2, maximum=16), default="3,5",
                        help="agreement sample counts, comma-separated (default 3,5)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--gsm8k", type=int, default=0, metavar="N", help="also N GSM8K prompts (needs ../shared/data)")
    parser.add_argument("--gsm8k-max-tokens", type=int, default=96)
    parser.add_argument("--data", type=Path, help="data directory (default POINTSMAN_DATA_DIR or ../shared/data)")
    parser.add_argument("--verify", type=int, default=40, help="prompts for the live check at the chosen thresholds")
    parser.add_argument("--seed-check", type=int, default=6, help="prompts for the client-seed agreement check")
    parser.add_argument("--cache-check", type=int, default=8,
                        help="prompts whose two greedy answers differed, re-asked cold and warm")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--reanalyse", type=Path, help="redo the analysis of a results.json (no gateway)")
    parser.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--answers", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        serve_fake(args.serve_fake, args.answers)
        return 0
    started = time.perf_counter()
    samples = args.samples
    if args.reanalyse:
        old = json.loads(args.reanalyse.read_text())
        meta, raw = old["meta"], old["records"]
        samples = meta["samples"]
        verification_runs, seed_result = old.get("verification_runs"), old.get("seed_check")
        cache_result = old.get("cache_check")
    else:
        problems = synthetic_problems(args.n, args.seed)
        gsm = gsm8k_problems(args.gsm8k, args.seed, args.data) if args.gsm8k else []
        answers = {p.question: p.solution for p in [*problems, *gsm]}
        raw = {}
        with tempfile.TemporaryDirectory(prefix="cascade-live-") as tmp_name:
            tmp = Path(tmp_name)
            gateway = Gateway(tmp, answers, collect_workflows(samples), "collect")
            try:
                t0 = time.perf_counter()
                raw["synthetic"] = asyncio.run(collect(gateway.url, problems, samples, args.max_tokens,
                                                       _progress("live: synthetic")))
                collect_s = time.perf_counter() - t0
                if gsm:
                    raw["gsm8k"] = asyncio.run(collect(gateway.url, gsm, samples, args.gsm8k_max_tokens,
                                                       _progress("live: gsm8k")))
                seed_result = (asyncio.run(seed_check(gateway.url, problems[: args.seed_check], min(samples),
                                                      args.max_tokens)) if args.seed_check else None)
                differ = [p for p, r in zip(problems, raw["synthetic"], strict=True)
                          if r["logprobs"]["text"] != r["head"]["text"]][: args.cache_check]
                other = next((p for p in problems if p not in differ), problems[0])
                cache_result = (asyncio.run(cache_check(gateway.url, differ, other, args.max_tokens))
                                if differ else None)
            finally:
                gateway.stop()
            res = analyse(raw["synthetic"], samples, args.draws, args.seed)
            thresholds = _thresholds(res, raw["synthetic"])
            verification_runs = None
            if args.verify and thresholds:
                gateway = Gateway(tmp, answers, verify_workflows(thresholds), "verify")
                try:
                    runs = asyncio.run(verify(gateway.url, problems[: args.verify], list(thresholds),
                                              args.max_tokens, _progress("live: verify")))
                finally:
                    gateway.stop()
                verification_runs = {"thresholds": thresholds, "runs": runs}
        meta = {"date": time.strftime("%Y-%m-%d"), "cpu": _procs.cpu_model(), "cores": _procs.cpu_count(),
                "n": args.n, "gsm8k": args.gsm8k, "seed": args.seed, "samples": samples,
                "max_tokens": args.max_tokens, "gsm8k_max_tokens": args.gsm8k_max_tokens, "draws": args.draws,
                "collect_s": collect_s, "system": SYSTEM, "few_shot": FEW_SHOT,
                "prices_usd_per_mtok": {"cheap (as Mixtral-8x7B)": asdict(MIXTRAL_8X7B_PRICES),
                                        "strong (as GPT-4-1106)": asdict(GPT4_1106_PRICES)}}
    result: dict[str, Any] = {"meta": meta}
    result["synthetic"] = analyse(raw["synthetic"], samples, args.draws, args.seed)
    if raw.get("gsm8k"):
        result["gsm8k"] = analyse(raw["gsm8k"], samples, args.draws, args.seed)
    result["checks"] = consistency(raw["synthetic"])
    result["head_diagnostic"] = head_without_history(raw["synthetic"])
    result["seed_check"] = seed_result
    result["cache_check"] = cache_result
    if verification_runs:
        result["verification"] = check_verification(raw["synthetic"], verification_runs["runs"],
                                                    verification_runs["thresholds"])
    meta["runtime_s"] = meta.get("runtime_s", time.perf_counter() - started)
    report = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "curves.png")
    for key in ("synthetic", "gsm8k"):
        if key in result:
            result[key] = {k: v for k, v in result[key].items() if k != "_curves"} | {"curves": result[key]["_curves"]}
    payload = {**result, "records": raw, "verification_runs": verification_runs}
    (args.out / "results.json").write_text(json.dumps(jsonable(payload), indent=1))
    (args.out / "report.md").write_text(report)
    print_markdown(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
