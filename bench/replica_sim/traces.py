"""Synthetic traces: agent sessions (tool-call loops with growing context) and plain chat.

Arrivals: sessions (agent mix) or conversations (chat) start by a Gamma renewal process with
coefficient of variation ``cv`` (shape ``1/cv**2``): BurstGPT (Wang et al. 2024, arXiv 2401.17644)
found real LLM-service arrivals far burstier than Poisson and fitted Gamma inter-arrivals; cv 3 is the
default, the sweep covers 1-5. The process is drawn at unit rate and divided by the rate, and each
session's content comes from its own seed, so runs at different rates or under different policies see
the same sessions (common random numbers: goodput searches and policy comparisons are paired).

**Agent sessions** (defaults in :class:`TraceParams`): one of 4 agent types, each with its own system
prompt + tool definitions of 2.5k-7k tokens (tool schemas cost ~500 tokens each; 5-14 tools), shared by
every session of that type; a user task (lognormal, median 150 tokens); then a closed tool-call loop of
K turns, K geometric with mean 12 (NVIDIA AIPerf's published agentic-code trace: 13,167 requests from
1,131 sessions = 11.6 turns a session). Each turn returns a tool call (median 120 output tokens); the
client appends it and the tool's result (lognormal, median 700, mean ~1,150, capped at 8k tokens: tool
output is most of an agent's transcript) and sends the next turn after the tool runs (lognormal,
median 1 s, capped at 30 s). The last turn answers (median 350 tokens). A session stops early when the
next prompt would pass ``max_context`` (32k: the ``max_model_len`` an 8B deployment typically serves).
Measured on seed 0: 10 turns a session after the cap, prompts of 13k tokens on average (p50
11.5k, p99 30k), sessions ending at 16k tokens on average, ~10% of them at the cap.

**Plain chat**: 75% single-turn, else 2-4 turns after a human think time (lognormal, median 15 s);
60% carry one of 20 application system prompts (100-800 tokens, Zipf popularity), the rest none; user
messages lognormal (median 150, mean ~250 tokens, ShareGPT-like), answers median 200 tokens. The
agent mix has a share of such chats (15% of sessions).

Rate units: agent mix = sessions started per second (agent and chat sessions together); chat = requests
per second (conversations start at ``rate / mean turns``).

Requests are real JSON bodies: each message's bytes are built once (~4 bytes per token of synthetic
text; identical bytes for a shared system prompt; a unique id plus random filler otherwise) and a
turn's body is ``{"model":"m","messages":[...]}`` over the messages so far, so the gateway's prefix
hashing sees what it would see in production.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import xxhash

#: Bytes of synthetic text per token (the gateway assumes the same, gateway.balancing.prefix).
BYTES_PER_TOKEN = 4
_FILLER = bytes(random.Random(20240131).choices(b"abcdefghijklmnopqrstuvwxyz     ", k=1 << 20))
_HEAD = b'{"model":"m","messages":['
_TAIL = b"]}"


@dataclass(frozen=True, slots=True)
class TraceParams:
    """Trace shape; the defaults are the documented baseline (see the module docstring)."""

    cv: float = 3.0
    agent_share: float = 0.85
    agent_types: int = 4
    system_tokens: tuple[int, ...] = (2500, 4000, 5500, 7000)
    task_median: float = 150.0
    turns_mean: float = 12.0
    turns_max: int = 60
    call_median: float = 120.0
    final_median: float = 350.0
    result_median: float = 700.0
    result_sigma: float = 1.0
    result_max: int = 8000
    tool_delay_median: float = 1.0
    max_context: int = 32_768
    chat_multi_share: float = 0.25
    chat_think_median: float = 15.0
    chat_apps: int = 20
    chat_system_share: float = 0.6
    chat_user_median: float = 150.0
    chat_answer_median: float = 200.0

    def chat_turns_mean(self) -> float:
        return 1.0 + self.chat_multi_share * 2.0  # multi-turn chats have 2-4 turns (mean 3)


@dataclass(slots=True)
class Segment:
    """One message: a unique id (its position is fixed by the messages before it), tokens, JSON bytes."""

    uid: int
    tokens: int
    data: bytes


@dataclass(slots=True)
class Turn:
    """A request of a session: its prompt is the first ``messages`` segments; ``output`` tokens come
    back as segment ``out_uid`` (re-sent as the next turn's assistant message when there is one);
    the next turn follows ``delay`` seconds after this one completes."""

    messages: int
    output: int
    out_uid: int
    delay: float


@dataclass(slots=True)
class Session:
    """A conversation: segments, turns, and its start on the unit-rate arrival clock (divide by the
    session rate for seconds)."""

    index: int
    kind: str  # "agent" | "chat"
    start: float
    key: int  # the gateway's 64-bit session key hash
    segments: list[Segment]
    turns: list[Turn]
    _ends: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        ends = []
        total = 0
        for seg in self.segments:
            total += seg.tokens
            ends.append(total)
        self._ends = ends

    def prompt_tokens(self, messages: int) -> int:
        return self._ends[messages - 1] if messages else 0

    def body(self, messages: int) -> bytes:
        """The raw request body of a turn whose prompt is the first ``messages`` segments."""
        return _HEAD + b",".join(seg.data for seg in self.segments[:messages]) + _TAIL

    def path(self, messages: int, block: int) -> list[tuple[int, int]]:
        """The engine's view of the prompt: (segment id, blocks ending in that segment)."""
        out = []
        begin = 0
        for seg, end in zip(self.segments[:messages], self._ends[:messages], strict=True):
            out.append((seg.uid, end // block - begin // block))
            begin = end
        return out


def _message(role: str, uid: int, tokens: int, rng: random.Random) -> bytes:
    size = max(tokens * BYTES_PER_TOKEN - 40, 16)
    offset = rng.randrange(0, len(_FILLER) - size)
    text = f"{uid:016x} ".encode() + _FILLER[offset:offset + size]
    return b'{"role":"' + role.encode() + b'","content":"' + text + b'"}'


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(max(rng.lognormvariate(math.log(median), sigma), lo), hi))


def _geometric(rng: random.Random, mean: float, cap: int) -> int:
    p = 1.0 / mean
    return min(1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p)), cap)


class TraceGenerator:
    """Sessions of one mix for one seed, in arrival order on the unit-rate clock (see :func:`trace`)."""

    def __init__(self, mix: str, seed: int, params: TraceParams) -> None:
        if mix not in ("agent", "chat"):
            raise ValueError(f"unknown mix {mix!r}")
        self.mix = mix
        self.seed = seed
        self.params = params
        self._arrivals = random.Random(f"arrivals/{mix}/{seed}")
        self._clock = 0.0  # unit-rate clock of the last session generated
        self._sessions: list[Session] = []
        shared = random.Random(f"shared/{seed}")  # shared prompts: the same bytes in every session
        self._agent_systems = [
            Segment(i + 1, tokens, _message("system", i + 1, tokens, shared))
            for i, tokens in enumerate(params.system_tokens[: params.agent_types])
        ]
        self._app_systems = []
        for i in range(params.chat_apps):
            tokens = int(100 + 700 * shared.random())
            self._app_systems.append(Segment(1000 + i, tokens, _message("system", 1000 + i, tokens, shared)))
        weights = [1.0 / (i + 1) ** 1.1 for i in range(params.chat_apps)]
        total = sum(weights)
        self._app_cdf = list(_cumulative([w / total for w in weights]))

    def sessions_until(self, horizon: float, rate: float) -> list[tuple[float, Session]]:
        """``(start in seconds, session)`` for every session that starts before ``horizon`` seconds at
        ``rate`` (sessions/s for the agent mix, requests/s for chat). Sessions are generated once and
        kept, so runs of the same trace at other rates reuse them."""
        p = self.params
        session_rate = rate if self.mix == "agent" else rate / p.chat_turns_mean()
        limit = horizon * session_rate  # on the unit-rate clock
        shape = 1.0 / (p.cv * p.cv)
        while self._clock < limit:
            self._clock += self._arrivals.gammavariate(shape, 1.0 / shape)
            self._sessions.append(self._session(len(self._sessions), self._clock))
        return [(s.start / session_rate, s) for s in self._sessions if s.start < limit]

    def _session(self, index: int, start: float) -> Session:
        rng = random.Random(f"session/{self.mix}/{self.seed}/{index}")
        base = (index + 1) << 20  # segment ids of this session: base + 1, base + 2, ...
        key = xxhash.xxh3_64_intdigest(f"session/{self.mix}/{self.seed}/{index}".encode())
        if self.mix == "agent" and rng.random() < self.params.agent_share:
            segments, turns = self._agent(rng, base)
            return Session(index, "agent", start, key, segments, turns)
        segments, turns = self._chat(rng, base)
        return Session(index, "chat", start, key, segments, turns)

    def _agent(self, rng: random.Random, base: int) -> tuple[list[Segment], list[Turn]]:
        p = self.params
        system = self._agent_systems[rng.randrange(len(self._agent_systems))]
        task = _lognormal(rng, p.task_median, 0.8, 20, 4000)
        segments = [system, Segment(base + 1, task, _message("user", base + 1, task, rng))]
        uid = base + 1
        context = system.tokens + task
        planned = _geometric(rng, p.turns_mean, p.turns_max)
        turns: list[Turn] = []
        for n in range(1, planned + 1):
            uid += 1
            last = n == planned
            output = _lognormal(rng, p.final_median if last else p.call_median, 0.5, 8, 2048)
            result = _lognormal(rng, p.result_median, p.result_sigma, 30, p.result_max)
            if not last and context + output + result + 2048 > p.max_context:
                last = True  # the context is full: this turn answers instead of calling a tool
                output = _lognormal(rng, p.final_median, 0.5, 8, 2048)
            delay = _lognormal(rng, p.tool_delay_median, 1.0, 0, 30) if not last else 0.0
            turns.append(Turn(len(segments), output, uid, delay))
            if last:
                break
            segments.append(Segment(uid, output, _message("assistant", uid, output, rng)))
            uid += 1
            segments.append(Segment(uid, result, _message("tool", uid, result, rng)))
            context += output + result
        return segments, turns

    def _chat(self, rng: random.Random, base: int) -> tuple[list[Segment], list[Turn]]:
        p = self.params
        segments: list[Segment] = []
        if rng.random() < p.chat_system_share:
            pick = rng.random()
            segments.append(self._app_systems[next(i for i, c in enumerate(self._app_cdf) if pick <= c)])
        n_turns = 1 if rng.random() >= p.chat_multi_share else rng.randint(2, 4)
        uid = base
        turns: list[Turn] = []
        for n in range(n_turns):
            uid += 1
            user = _lognormal(rng, p.chat_user_median, 1.0, 4, 6000)
            segments.append(Segment(uid, user, _message("user", uid, user, rng)))
            uid += 1
            answer = _lognormal(rng, p.chat_answer_median, 0.8, 8, 2048)
            last = n == n_turns - 1
            delay = 0.0 if last else _lognormal(rng, p.chat_think_median, 0.8, 1, 120)
            turns.append(Turn(len(segments), answer, uid, delay))
            if not last:
                segments.append(Segment(uid, answer, _message("assistant", uid, answer, rng)))
        return segments, turns


def _cumulative(values: list[float]) -> list[float]:
    out = []
    total = 0.0
    for v in values:
        total += v
        out.append(total)
    out[-1] = 1.0
    return out


_CACHE: dict[tuple[str, int, TraceParams], TraceGenerator] = {}


def trace(mix: str, seed: int, params: TraceParams) -> TraceGenerator:
    """The generator of ``(mix, seed, params)``, shared by the runs of a process (a few are kept)."""
    key = (mix, seed, params)
    gen = _CACHE.get(key)
    if gen is None:
        while len(_CACHE) >= 3:
            del _CACHE[next(iter(_CACHE))]
        gen = _CACHE[key] = TraceGenerator(mix, seed, params)
    return gen
