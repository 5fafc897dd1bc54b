"""One replica: a vLLM-like engine with continuous batching, chunked prefill and a prefix cache.

Each step runs every decoding sequence one token and fills the rest of the token budget
(``max_batched_tokens``) with prefill chunks, first come first served. A waiting request is admitted
at a step boundary when budget is left, a sequence slot is free and its KV fits (its uncached prompt
and its whole output are reserved at admission, evicting unpinned cached blocks least recently used
first; vLLM allocates as it goes and preempts instead, which this conservative reservation avoids).
The prefix match happens at admission, as in vLLM's scheduler, so a request that waited sees what
was cached meanwhile. The head of the queue blocks the rest when its KV does not fit (FCFS).

Event-driven, not step-driven: between two changes of the batch (a prefill finishes, a sequence
finishes, a request is admitted) every step costs the same up to the growth of decoding contexts, so
an *epoch* of ``n`` steps is planned in one go and its duration summed in closed form. A request that
arrives while a decode-only epoch runs cuts it at the next step boundary, where it can join.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

from bench.replica_sim.kvcache import Node, PathEntry, PrefixCache
from bench.replica_sim.profile import EngineProfile


class Request:
    """One chat request as the engine sees it (plus what the gateway and the metrics need)."""

    __slots__ = (
        "arrival", "cached", "ctx_key", "load_tokens", "matched", "measured", "need", "nodes", "out_owned",
        "out_uid", "output", "path", "pos", "prompt", "rem", "replica", "rid", "session", "ttft",
    )

    def __init__(
        self, rid: int, session: object, arrival: float, prompt: int, output: int,
        path: list[PathEntry], out_uid: int, out_owned: int, measured: bool,
    ) -> None:
        self.rid = rid
        self.session = session
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.path = path
        self.out_uid = out_uid
        self.out_owned = out_owned
        self.measured = measured
        self.replica = -1
        self.load_tokens = 0
        self.cached = 0  # prompt tokens served from the prefix cache
        self.matched = 0  # cached blocks at admission
        self.need = 0  # private blocks reserved at admission
        self.nodes: list[Node] = []
        self.rem = 0  # prompt tokens still to prefill
        self.pos = 0  # position of the next prompt token to prefill
        self.ctx_key = 0
        self.ttft = math.inf


Callback = Callable[[Request, float], None]


class Engine:
    """A replica: its engine state plus the attributes a :class:`gateway.balancing.ReplicaLoad` has."""

    def __init__(self, slot: int, profile: EngineProfile, on_first_token: Callback, on_finish: Callback) -> None:
        # What the gateway's policy reads (gateway.balancing.select.ReplicaLoad).
        self.slot = slot
        self.outstanding = 0
        self.tokens_in_flight = 0
        self.external_load = 0.0

        self.profile = profile
        self.cache = PrefixCache(profile.kv_blocks)
        self._on_first_token = on_first_token
        self._on_finish = on_finish
        self._bs = profile.block_tokens
        self.waiting: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()
        self._pf_total = 0  # prompt tokens left to prefill over ``prefilling``
        self._decoding: list[tuple[int, int, Request]] = []  # (finish step, rid, request)
        self._step = 0  # decode steps run so far
        self._ctx_base = 0  # sum over decoding of (context at start - step at start)
        self._plan: tuple[float, int, float, int] | None = None  # (start, steps, duration, prefill tokens)
        self.version = 0  # bumped whenever the planned epoch end moves
        self.busy_s = 0.0

    # -- the simulator's entry points ------------------------------------------------------------

    def enqueue(self, req: Request, now: float) -> float | None:
        """A request arrives; returns the new epoch end if it moved (else None)."""
        req.replica = self.slot
        self.waiting.append(req)
        plan = self._plan
        if plan is None:
            return self._start_epoch(now)
        start, steps, duration, prefill = plan
        if prefill or steps <= 1:
            return None  # the budget is spent on prefill (or the epoch ends after this step anyway)
        # A decode-only epoch: cut it after the step in progress so the newcomer joins then.
        done = int((now - start) / (duration / steps)) + 1
        if done >= steps:
            return None
        cut = self._duration(done, 0, 0.0)
        self._plan = (start, done, cut, 0)
        self.version += 1
        return max(start + cut, now)

    def epoch_end(self, now: float) -> float | None:
        """The planned epoch ended at ``now``: apply it, then plan the next one (its end, or None: idle)."""
        plan = self._plan
        assert plan is not None
        _, steps, duration, prefill = plan
        self.busy_s += duration
        self._step += steps
        finished_prefill: list[Request] = []
        left = prefill
        queue = self.prefilling
        while left > 0 and queue:
            req = queue[0]
            take = min(req.rem, left)
            req.rem -= take
            req.pos += take
            left -= take
            self._pf_total -= take
            if req.rem:
                break
            queue.popleft()
            finished_prefill.append(req)
        cache = self.cache
        step = self._step
        for req in finished_prefill:
            cache.insert(req.path, req.nodes, now)
            full = sum(owned for _, owned in req.path)
            cache.release_private(full - req.matched)
            req.need -= full - req.matched
            req.ttft = now - req.arrival
            self._on_first_token(req, now)
            if req.output <= 1:
                self._finish(req, now)
            else:
                req.ctx_key = req.prompt + 1 - step
                self._ctx_base += req.ctx_key
                heapq.heappush(self._decoding, (step + req.output - 1, req.rid, req))
        decoding = self._decoding
        while decoding and decoding[0][0] <= step:
            _, _, req = heapq.heappop(decoding)
            self._ctx_base -= req.ctx_key
            self._finish(req, now)
        return self._start_epoch(now)

    # -- internals --------------------------------------------------------------------------------

    def _finish(self, req: Request, now: float) -> None:
        self.cache.finish(req.nodes, req.out_uid, req.out_owned, req.need, now)
        req.nodes = []
        self._on_finish(req, now)

    def _admit(self, req: Request, now: float) -> bool:
        bs = self._bs
        matched, nodes = self.cache.match(req.path)
        cached = min(matched * bs, req.prompt - 1)
        need = -(-(req.prompt + req.output) // bs) - matched
        if not self.cache.reserve(nodes, need, now):
            return False
        req.matched = matched
        req.nodes = nodes
        req.need = need
        req.cached = cached
        req.rem = req.prompt - cached
        req.pos = cached
        return True

    def _start_epoch(self, now: float) -> float | None:
        profile = self.profile
        decoding = len(self._decoding)
        budget = profile.max_batched_tokens - decoding - self._pf_total
        waiting = self.waiting
        while waiting and budget > 0 and len(self.prefilling) + decoding < profile.max_seqs:
            req = waiting[0]
            if not self._admit(req, now):
                break
            waiting.popleft()
            self.prefilling.append(req)
            self._pf_total += req.rem
            budget -= req.rem
        if not decoding and not self.prefilling:
            self._plan = None
            return None
        cap = profile.max_batched_tokens - decoding
        steps = math.inf
        if self._pf_total:
            steps = -(-self.prefilling[0].rem // cap)
        if decoding:
            steps = min(steps, self._decoding[0][0] - self._step)
        n = int(steps)
        prefill = min(self._pf_total, n * cap)
        work = 0.0  # sum of positions of the prefill tokens computed (attention over the prefix)
        left = prefill
        for req in self.prefilling:
            take = min(req.rem, left)
            work += take * req.pos + take * (take - 1) / 2
            left -= take
            if not left:
                break
        duration = self._duration(n, prefill, work)
        self._plan = (now, n, duration, prefill)
        self.version += 1
        return now + duration

    def _duration(self, steps: int, prefill: int, work: float) -> float:
        """Time of ``steps`` steps with the current decoding set and ``prefill`` prompt tokens."""
        p = self.profile
        decoding = len(self._decoding)
        ctx0 = self._ctx_base + decoding * self._step
        ctx_steps = steps * ctx0 + decoding * steps * (steps - 1) / 2
        return (
            steps * p.step_base_s + p.token_s * (decoding * steps + prefill) + p.prefill_attn_s * work
            + p.decode_attn_s * ctx_steps
        )
