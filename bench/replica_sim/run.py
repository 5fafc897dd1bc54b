"""One simulation run: a trace at one rate through the gateway's selection code onto N engines.

Each request is routed as the gateway routes it (:mod:`gateway.balancing`): its raw JSON body is hashed
into prefix blocks, the policy chooses among the replicas by their ``outstanding`` /
``tokens_in_flight``, ``served`` updates the policy's belief, and the request joins the chosen engine.
The engines' caches are modelled separately (:mod:`bench.replica_sim.kvcache`): the policy's prefix
index is only a belief about them. Sessions are closed loops: a turn is sent when the previous one has
completed and its tool (or the user) has taken its time.

Metrics cover requests that arrive in ``[warmup, duration)``: TTFT (arrival at the gateway to the end
of the step that computes the prompt's last token), cache hit rate (prompt tokens served from the
cache / prompt tokens), throughput (their output tokens and count per second of the window), and load
imbalance (max / mean over replicas of the tokens computed for them: uncached prompt + output).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.replica_sim.engine import Engine, Request
from bench.replica_sim.profile import EngineProfile
from bench.replica_sim.traces import Session, TraceParams, trace
from gateway.balancing import Affinity, make_policy, prefix_blocks
from gateway.balancing.select import DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, LoadKind, PolicyName

#: What the gateway assumes a request will generate when it has no ``max_tokens`` (select.Affinity).
EXPECTED_OUTPUT = 256


@dataclass(frozen=True, slots=True)
class RunSpec:
    """Everything that determines a run."""

    mix: str
    rate: float
    replicas: int
    policy: PolicyName
    seed: int
    load: LoadKind = "requests"
    balance_abs: float = DEFAULT_BALANCE_ABS
    balance_rel: float = DEFAULT_BALANCE_REL
    duration: float = 300.0
    warmup: float = 60.0
    profile: EngineProfile = field(default_factory=EngineProfile)
    trace: TraceParams = field(default_factory=TraceParams)
    slo: float | None = None  # stop early once the TTFT p99 can no longer meet it
    drain_limit: float = 600.0  # give up this long after ``duration`` (overload)
    drain: bool = False  # run every session to its end (tests), not just until the window is measured


@dataclass(slots=True)
class RunResult:
    """What one run measured."""

    rate: float
    requests: int  # measured requests (arrived in the window)
    ttft_p50: float
    ttft_p99: float
    hit_rate: float
    imbalance: float
    output_tok_s: float
    request_s: float
    aborted: bool  # stopped early: the SLO was already missed
    reasons: dict[str, int]
    evicted_share: float  # blocks evicted / blocks cached, over the run (cache pressure)
    issued: int  # requests routed (measured or not)
    completed: int  # requests finished
    wall_s: float

    def meets(self, slo: float) -> bool:
        return not self.aborted and self.requests > 0 and self.ttft_p99 <= slo


_ARRIVE, _EPOCH = 0, 1


def simulate(spec: RunSpec, observe: Callable[[Request], None] | None = None) -> RunResult:
    """Run ``spec`` to the end of its window (or until it can no longer meet ``spec.slo``);
    ``observe`` sees every request as it finishes."""
    wall = time.perf_counter()
    sessions = trace(spec.mix, spec.seed, spec.trace).sessions_until(spec.duration, spec.rate)
    # Every turn of every session bounds the measured requests from above: more SLO misses than 1% of
    # it and the p99 cannot meet the SLO any more.
    bound = sum(len(s.turns) for _, s in sessions)
    allowed = int(0.01 * bound) if spec.slo is not None else None

    now = 0.0
    events: list[tuple[float, int, int, object, int]] = []
    tick = itertools.count()
    ttfts: list[float] = []
    violations = 0
    pending = 0  # requests that arrived before ``duration`` and have no first token yet
    issued = completed = 0
    prompt_total = cached_total = output_total = 0
    work = [0] * spec.replicas
    reasons: Counter[str] = Counter()
    block = spec.profile.block_tokens

    def on_first_token(req: Request, t: float) -> None:
        nonlocal violations, pending, prompt_total, cached_total, output_total
        if req.arrival < spec.duration:
            pending -= 1
        if req.measured:
            ttfts.append(req.ttft)
            prompt_total += req.prompt
            cached_total += req.cached
            output_total += req.output
            work[req.replica] += req.prompt - req.cached + req.output
            if spec.slo is not None and req.ttft > spec.slo:
                violations += 1

    def on_finish(req: Request, t: float) -> None:
        nonlocal completed
        completed += 1
        if observe is not None:
            observe(req)
        engine = engines[req.replica]
        engine.outstanding -= 1
        engine.tokens_in_flight -= req.load_tokens
        session = req.session
        assert isinstance(session, Session)
        turn_index = req.rid & 0xFF
        if turn_index + 1 < len(session.turns):
            delay = session.turns[turn_index].delay
            heapq.heappush(events, (t + delay, next(tick), _ARRIVE, session, turn_index + 1))

    engines = [Engine(i, spec.profile, on_first_token, on_finish) for i in range(spec.replicas)]
    policy = make_policy(
        spec.policy, load=spec.load, balance_abs=spec.balance_abs, balance_rel=spec.balance_rel,
        clock=lambda: now,
    )
    want_blocks = policy.needs_blocks or spec.load == "tokens"

    for start, session in sessions:
        heapq.heappush(events, (start, next(tick), _ARRIVE, session, 0))

    aborted = False
    while events:
        t, _, kind, obj, arg = heapq.heappop(events)
        now = t
        if kind == _EPOCH:
            engine = obj
            assert isinstance(engine, Engine)
            if arg != engine.version:
                continue  # superseded plan
            end = engine.epoch_end(now)
            if end is not None:
                heapq.heappush(events, (end, next(tick), _EPOCH, engine, engine.version))
        else:
            assert isinstance(obj, Session)
            session = obj
            turn = session.turns[arg]
            body = session.body(turn.messages)
            affinity = Affinity(
                blocks=prefix_blocks(body) if want_blocks else None, session=session.key,
                output_tokens=EXPECTED_OUTPUT,
            )
            choice = policy.choose(engines, affinity)
            policy.served(choice, affinity)
            chosen = choice.replica
            assert isinstance(chosen, Engine)
            engine = chosen
            reasons[choice.reason] += 1
            engine.outstanding += 1
            engine.tokens_in_flight += choice.load_tokens
            prompt = session.prompt_tokens(turn.messages)
            path = session.path(turn.messages, block)
            out_owned = (prompt + turn.output) // block - prompt // block
            req = Request(
                (session.index << 8) | arg, session, now, prompt, turn.output, path, turn.out_uid, out_owned,
                spec.warmup <= now < spec.duration,
            )
            req.load_tokens = choice.load_tokens
            issued += 1
            if now < spec.duration:
                pending += 1
            end = engine.enqueue(req, now)
            if end is not None:
                heapq.heappush(events, (end, next(tick), _EPOCH, engine, engine.version))
        if allowed is not None and violations > allowed:
            aborted = True
            break
        if now >= spec.duration and pending == 0 and not spec.drain:
            break
        if now > spec.duration + spec.drain_limit:
            aborted = True
            break

    window = spec.duration - spec.warmup
    arr = np.asarray(ttfts) if ttfts else np.asarray([np.inf])
    busy = np.asarray(work, dtype=float)
    cached_blocks = sum(e.cache.tree_blocks + e.cache.evicted_blocks for e in engines)
    evicted = sum(e.cache.evicted_blocks for e in engines)
    return RunResult(
        rate=spec.rate,
        requests=len(ttfts),
        ttft_p50=float(np.percentile(arr, 50)),
        ttft_p99=float(np.percentile(arr, 99)) if not aborted else float("inf"),
        hit_rate=cached_total / prompt_total if prompt_total else 0.0,
        imbalance=float(busy.max() / busy.mean()) if busy.sum() > 0 else 1.0,
        output_tok_s=output_total / window,
        request_s=len(ttfts) / window,
        aborted=aborted,
        reasons=dict(reasons),
        evicted_share=evicted / cached_blocks if cached_blocks else 0.0,
        issued=issued,
        completed=completed,
        wall_s=time.perf_counter() - wall,
    )
