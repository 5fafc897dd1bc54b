"""What the benchmark runs: goodput searches (policy grid, sensitivity and balance sweeps) and TTFT
curves, as picklable jobs grouped into tasks for a process pool.

A *search* is one (mix, replicas, seed, policy and its parameters, variant) goodput search. Searches
that share (mix, replicas, seed, variant) form one task, run in one process: least-outstanding first,
and its goodput is the starting guess of the others (fewer bracketing probes), and the trace is
generated once per task (:func:`bench.replica_sim.traces.trace`).

SLOs (TTFT p99): agent mix 3 s, the interactive target commonly quoted for an agent or chat step
(e.g. the vLLM/H100 prefill-decode write-up summarised at signalbreak.io: "3 s TTFT"); an idle replica
needs ~1.6 s to prefill the p99 agent prompt (30k tokens) with nothing cached, so every policy can meet
it at a low rate. Plain chat 1 s: its prompts are short (an idle replica prefills the p99 one in
~0.1 s), so the SLO bounds queueing. The ``prefill`` sensitivity variants scale the SLO with the
prefill time, so that the same prompts stay feasible without a cache.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.replica_sim.profile import EngineProfile
from bench.replica_sim.run import RunResult, RunSpec, simulate
from bench.replica_sim.search import Goodput, find_goodput
from bench.replica_sim.traces import TraceParams
from gateway.balancing.select import DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, LoadKind, PolicyName

POLICIES: tuple[PolicyName, ...] = (
    "round_robin", "least_outstanding", "session_affinity", "prefix_affinity", "cache_aware",
)


@dataclass(frozen=True, slots=True)
class MixSettings:
    """Per-mix SLO, window and the first guess of the goodput per replica."""

    slo: float
    duration: float
    warmup: float
    guess_per_replica: float
    unit: str


MIXES: dict[str, MixSettings] = {
    # Agent sessions last minutes: a 60 s warm-up fills the caches, 240 s are measured.
    "agent": MixSettings(slo=3.0, duration=300.0, warmup=60.0, guess_per_replica=0.55, unit="sessions/s"),
    # Chats are short: 90 s measured hold tens of thousands of requests at 8 replicas.
    "chat": MixSettings(slo=1.0, duration=120.0, warmup=30.0, guess_per_replica=26.0, unit="requests/s"),
}


@dataclass(frozen=True, slots=True)
class Variant:
    """An engine-profile / trace variant for the sensitivity sweep (``base``: the documented defaults)."""

    name: str
    group: str  # which parameter it varies ("" for the base)
    kv: float = 1.0
    prefill_speed: float = 1.0
    decode_cost: float = 1.0
    trace: dict[str, float] = field(default_factory=dict)

    def profile(self) -> EngineProfile:
        return EngineProfile().scaled(kv=self.kv, prefill_speed=self.prefill_speed, decode_cost=self.decode_cost)

    def trace_params(self) -> TraceParams:
        return replace(TraceParams(), **self.trace)  # type: ignore[arg-type]

    def slo_scale(self) -> float:
        return 1.0 / self.prefill_speed


BASE = Variant("base", "")
SENSITIVITY: tuple[Variant, ...] = (
    Variant("KV x0.25 (100k tokens)", "KV capacity", kv=0.25),
    Variant("KV x0.5 (200k tokens)", "KV capacity", kv=0.5),
    Variant("KV x2 (800k tokens)", "KV capacity", kv=2.0),
    Variant("prefill x0.33 (A100-like)", "prefill speed", prefill_speed=1 / 3),
    Variant("prefill x2", "prefill speed", prefill_speed=2.0),
    Variant("decode x0.5", "decode cost", decode_cost=0.5),
    Variant("decode x2", "decode cost", decode_cost=2.0),
    Variant("turns mean 6", "session length", trace={"turns_mean": 6.0}),
    Variant("turns mean 24", "session length", trace={"turns_mean": 24.0}),
    Variant("tool result x0.5", "tool-result size", trace={"result_median": 350.0}),
    Variant("tool result x2", "tool-result size", trace={"result_median": 1400.0}),
    Variant("burstiness CV 1 (Poisson)", "burstiness", trace={"cv": 1.0}),
    Variant("burstiness CV 5", "burstiness", trace={"cv": 5.0}),
)
QUICK_SENSITIVITY = ("KV x0.25 (100k tokens)", "prefill x2", "burstiness CV 1 (Poisson)")
VARIANTS: dict[str, Variant] = {v.name: v for v in (BASE, *SENSITIVITY)}

#: cache_aware's load bounds tried in the balance sweep: (load, balance_abs, balance_rel).
BALANCE: tuple[tuple[LoadKind, float, float], ...] = (
    ("requests", 2.0, 1.5), ("requests", 4.0, 1.5), ("requests", 8.0, 1.5), ("requests", 16.0, 1.5),
    ("requests", 64.0, 1.5), ("requests", 4.0, 1.25), ("requests", 4.0, 2.0),
    ("tokens", 8192.0, 1.5), ("tokens", 32768.0, 1.5), ("tokens", 131072.0, 1.5),
)
BALANCE_AGENT_REPLICAS = (2, 8, 16)
QUICK_BALANCE: tuple[tuple[LoadKind, float, float], ...] = (
    ("requests", 2.0, 1.5), ("requests", 16.0, 1.5), ("tokens", 32768.0, 1.5),
)
#: The gateway's default (``backends[].balancing`` in gateway/config.py): chosen from this sweep.
DEFAULT_BALANCE: tuple[LoadKind, float, float] = ("requests", DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL)


@dataclass(frozen=True, slots=True)
class Search:
    """One goodput search."""

    mix: str
    replicas: int
    seed: int
    policy: PolicyName
    load: LoadKind = "requests"
    balance_abs: float = DEFAULT_BALANCE_ABS
    balance_rel: float = DEFAULT_BALANCE_REL
    variant: str = "base"

    def spec(self) -> tuple[RunSpec, float]:
        """The run spec (rate 0) and the SLO of this search."""
        mix = MIXES[self.mix]
        variant = VARIANTS[self.variant]
        spec = RunSpec(
            self.mix, 0.0, self.replicas, self.policy, self.seed, load=self.load, balance_abs=self.balance_abs,
            balance_rel=self.balance_rel, duration=mix.duration, warmup=mix.warmup, profile=variant.profile(),
            trace=variant.trace_params(),
        )
        return spec, mix.slo * variant.slo_scale()


@dataclass(frozen=True, slots=True)
class Curve:
    """TTFT against rate for one policy (no search): the runs behind the p99-vs-rate plot."""

    mix: str
    replicas: int
    seed: int
    policy: PolicyName
    rates: tuple[float, ...]


def grid_searches(mixes: list[str], replicas: list[int], seeds: int) -> list[Search]:
    return [Search(m, n, s, p) for m in mixes for n in replicas for s in range(seeds) for p in POLICIES]


def sensitivity_searches(seeds: int, names: tuple[str, ...] | None = None) -> list[Search]:
    variants = [v for v in SENSITIVITY if names is None or v.name in names]
    return [
        Search("agent", 8, s, p, variant=v.name)
        for v in variants for s in range(seeds) for p in ("least_outstanding", "cache_aware")
    ]


def balance_searches(
    mixes: list[str], seeds: int, grid: tuple[tuple[LoadKind, float, float], ...], agent_replicas: tuple[int, ...],
) -> list[Search]:
    """cache_aware with each load bound (and least_outstanding, the reference) at 8 replicas; the agent
    mix also at ``agent_replicas`` (a default must hold across deployment sizes)."""
    out: list[Search] = []
    for m in mixes:
        for n in (agent_replicas if m == "agent" else (8,)):
            for s in range(seeds):
                out.append(Search(m, n, s, "least_outstanding"))
                for load, absolute, relative in grid:
                    out.append(Search(m, n, s, "cache_aware", load, absolute, relative))
    return out


@dataclass(frozen=True, slots=True)
class Tail:
    """One run at a moderate load (~65% of cache_aware's goodput): the TTFT tail a load bound gives
    where goodput cannot tell bounds apart."""

    mix: str
    replicas: int
    seed: int
    policy: PolicyName
    load: LoadKind = "requests"
    balance_abs: float = DEFAULT_BALANCE_ABS
    balance_rel: float = DEFAULT_BALANCE_REL

    @property
    def rate(self) -> float:
        return (0.4 if self.mix == "agent" else 17.0) * self.replicas


def tail_runs(
    mixes: list[str], seeds: int, grid: tuple[tuple[LoadKind, float, float], ...], agent_replicas: tuple[int, ...],
) -> list[Tail]:
    out: list[Tail] = []
    for m in mixes:
        for n in (agent_replicas if m == "agent" else (8,)):
            for s in range(seeds):
                out += [Tail(m, n, s, p) for p in ("least_outstanding", "session_affinity", "prefix_affinity")]
                bounds = dict.fromkeys((DEFAULT_BALANCE, *grid))
                out += [Tail(m, n, s, "cache_aware", load, a, r) for load, a, r in bounds]
    return out


def run_tail(tail: Tail) -> dict[str, Any]:
    mix = MIXES[tail.mix]
    clock = time.process_time()
    spec = RunSpec(
        tail.mix, tail.rate, tail.replicas, tail.policy, tail.seed, load=tail.load, balance_abs=tail.balance_abs,
        balance_rel=tail.balance_rel, duration=mix.duration, warmup=mix.warmup, slo=4 * mix.slo,
    )
    return {**asdict(tail), "rate": tail.rate, **_metrics(simulate(spec)), "cpu_s": time.process_time() - clock}


def curves(mixes: list[str], points: int) -> list[Curve]:
    """Rates from 0.3x to 1.5x of the per-mix guess at 8 replicas, for every policy, seed 0."""
    out: list[Curve] = []
    for m in mixes:
        top = MIXES[m].guess_per_replica * 8
        rates = tuple(round(top * (0.3 + 1.2 * i / (points - 1)), 3) for i in range(points))
        out.extend(Curve(m, 8, 0, p, rates) for p in POLICIES)
    return out


def group(searches: list[Search]) -> list[list[Search]]:
    """Deduplicated searches in tasks of one (mix, replicas, seed, variant), least-outstanding first,
    the most expensive tasks (most replicas) first so the pool's tail is short."""
    tasks: dict[tuple[str, int, int, str], list[Search]] = {}
    for search in dict.fromkeys(searches):
        tasks.setdefault((search.mix, search.replicas, search.seed, search.variant), []).append(search)
    for jobs in tasks.values():
        jobs.sort(key=lambda s: s.policy != "least_outstanding")
    return [tasks[k] for k in sorted(tasks, key=lambda k: (-k[1], k[0] != "chat", k[2]))]


def run_task(jobs: list[Search], rel_tol: float) -> list[dict[str, Any]]:
    """Run a task's searches in order (in a worker process); JSON-ready records."""
    out = []
    guess = None
    for job in jobs:
        clock = time.process_time()
        spec, slo = job.spec()
        first = guess or MIXES[job.mix].guess_per_replica * job.replicas * _variant_guess(job)
        result = find_goodput(spec, slo, first, rel_tol=rel_tol)
        if job.policy == "least_outstanding" and result.rate > 0:
            guess = result.rate * 1.1
        out.append({**_record(job, slo, result), "cpu_s": time.process_time() - clock})
    return out


def _variant_guess(job: Search) -> float:
    """A rough scale of a variant's capacity, to start its bracketing closer."""
    variant = VARIANTS[job.variant]
    return min(variant.prefill_speed, 1.0) * min(variant.kv, 1.0) ** 0.5


def run_curve(curve: Curve) -> list[dict[str, Any]]:
    """The curve's runs; a run stops early once 1% of its requests exceed 4x the SLO (shown as off
    the chart), which keeps overloaded points cheap."""
    mix = MIXES[curve.mix]
    out = []
    for rate in curve.rates:
        clock = time.process_time()
        spec = RunSpec(
            curve.mix, rate, curve.replicas, curve.policy, curve.seed, duration=mix.duration, warmup=mix.warmup,
            slo=4 * mix.slo,
        )
        result = simulate(spec)
        out.append({**asdict(curve), "rate": rate, **_metrics(result), "cpu_s": time.process_time() - clock})
    return out


def _metrics(result: RunResult) -> dict[str, Any]:
    data = asdict(result)
    for key in ("ttft_p50", "ttft_p99"):
        if data[key] == float("inf"):
            data[key] = None  # JSON has no infinity
    return data


def _record(job: Search, slo: float, result: Goodput) -> dict[str, Any]:
    return {
        **asdict(job), "slo": slo, "goodput": result.rate,
        "at": _metrics(result.at) if result.at is not None else None,
        "probes": [[rate, met, None if p99 == float("inf") else p99] for rate, met, p99 in result.probes],
        "wall_s": result.wall_s,
    }
