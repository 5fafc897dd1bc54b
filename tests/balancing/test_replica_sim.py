"""The replica simulator behind ``bench/agent_replicas.py``: the engine, cache and routing behaviour
its goodput numbers rest on."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

import pytest

from bench.replica_sim.engine import Engine, Request
from bench.replica_sim.kvcache import PrefixCache
from bench.replica_sim.profile import EngineProfile
from bench.replica_sim.run import RunSpec, simulate

PROFILE = EngineProfile()


def _serve(engine: Engine, requests: list[tuple[float, Request]]) -> None:
    """Drive one engine through its epochs until every request has finished."""
    events: list[tuple[float, int, int, Request | None]] = []
    for n, (at, req) in enumerate(requests):
        heapq.heappush(events, (at, n, -1, req))
    tick = len(requests)
    while events:
        now, _, version, arriving = heapq.heappop(events)
        if arriving is not None:
            end = engine.enqueue(arriving, now)
        elif version == engine.version:
            end = engine.epoch_end(now)
        else:
            continue
        if end is not None:
            tick += 1
            heapq.heappush(events, (end, tick, engine.version, None))


def _engine(profile: EngineProfile = PROFILE) -> tuple[Engine, list[Request]]:
    done: list[Request] = []
    return Engine(0, profile, lambda req, t: None, lambda req, t: done.append(req)), done


def _request(rid: int, segments: list[tuple[int, int]], output: int = 50, arrival: float = 0.0) -> Request:
    """A request whose prompt is ``segments`` of (id, tokens)."""
    block = PROFILE.block_tokens
    path, begin = [], 0
    for uid, tokens in segments:
        path.append((uid, (begin + tokens) // block - begin // block))
        begin += tokens
    out_owned = (begin + output) // block - begin // block
    return Request(rid, None, arrival, begin, output, path, 10_000 + rid, out_owned, True)


def test_a_cached_prefix_makes_prefill_faster() -> None:
    system, history, new = (1, 4000), (2, 12000), (3, 800)
    warm, _ = _engine()
    first = _request(1, [system, history])
    second = _request(2, [system, history, new], arrival=100.0)
    _serve(warm, [(0.0, first), (100.0, second)])
    cold, _ = _engine()
    alone = _request(3, [system, history, new])
    _serve(cold, [(0.0, alone)])

    assert second.cached == 16000  # the whole earlier prompt, in full blocks
    assert alone.cached == 0
    assert second.ttft < alone.ttft / 5
    # An idle replica's cold prefill matches the profile's closed form (chunked, attention included).
    assert alone.ttft == pytest.approx(PROFILE.cold_prefill_s(16800), rel=0.05)


def test_lru_evicts_the_least_recently_used_prefix_under_a_bounded_kv() -> None:
    cache = PrefixCache(capacity_blocks=100)
    a, b, c = [(1, 40)], [(2, 40)], [(3, 40)]
    for t, path in ((1.0, a), (2.0, b)):  # as the engine does: reserve, prefill (insert), finish
        _, nodes = cache.match(path)
        assert cache.reserve(nodes, 40, t)
        cache.insert(path, nodes, t)
        cache.finish(nodes, out_uid=0, out_owned=0, release=40, now=t)
    matched, nodes = cache.match(a)  # a is used again: b is now the least recently used
    assert matched == 40
    assert cache.reserve(nodes, 0, 3.0)
    cache.finish(nodes, 0, 0, 0, 3.0)

    _, nodes = cache.match(c)
    assert cache.reserve(nodes, 40, 4.0)  # needs 20 more blocks than are free: evicts from b
    assert cache.match(a)[0] == 40
    assert cache.match(b)[0] == 20  # b's tail went first, its head is still a usable prefix
    assert cache.tree_blocks + cache.private_blocks <= cache.capacity


def test_running_requests_kv_is_never_evicted() -> None:
    cache = PrefixCache(capacity_blocks=100)
    _, nodes = cache.match([(1, 60)])
    assert cache.reserve(nodes, 60, 1.0)
    cache.insert([(1, 60)], nodes, 1.0)  # still running: pinned
    _, other = cache.match([(2, 60)])
    assert not cache.reserve(other, 60, 2.0)  # only 40 free and nothing evictable
    assert cache.match([(1, 60)])[0] == 60


def test_a_full_kv_queues_requests_instead_of_overcommitting() -> None:
    small = EngineProfile(kv_tokens=20_000)
    engine, done = _engine(small)
    reqs = [_request(i, [(100 + i, 9000)], output=200) for i in range(3)]
    _serve(engine, [(0.0, r) for r in reqs])
    assert len(done) == 3
    # Only two 9.2k-token requests fit in 20k tokens of KV: the third waits for one to finish.
    assert reqs[2].ttft > max(reqs[0].ttft, reqs[1].ttft)


def test_a_tiny_run_completes_every_request_with_sane_metrics() -> None:
    spec = RunSpec("agent", 0.3, 2, "cache_aware", seed=1, duration=60.0, warmup=10.0, drain=True)
    result = simulate(spec)
    assert result.issued == result.completed > 0
    assert result.requests > 0 and not result.aborted
    assert 0.0 < result.ttft_p50 <= result.ttft_p99 < 10.0
    assert 0.0 < result.hit_rate < 1.0
    assert result.imbalance >= 1.0
    assert result.output_tok_s > 0 and result.request_s > 0
    assert sum(result.reasons.values()) == result.issued


def test_session_affinity_keeps_a_sessions_turns_on_one_replica() -> None:
    placements: dict[str, dict[int, set[int]]] = {}
    for policy in ("session_affinity", "least_outstanding"):
        seen: dict[int, set[int]] = defaultdict(set)

        def note(req: Request, seen: dict[int, set[int]] = seen) -> None:
            seen[req.rid >> 8].add(req.replica)  # rid = session index << 8 | turn

        simulate(RunSpec("agent", 1.0, 4, policy, seed=2, duration=60.0, warmup=10.0, drain=True), observe=note)
        placements[policy] = seen
    assert placements["session_affinity"] and all(len(r) == 1 for r in placements["session_affinity"].values())
    assert any(len(r) > 1 for r in placements["least_outstanding"].values())  # the contrast is real


def test_cache_aware_hits_the_cache_more_than_least_outstanding_on_agents() -> None:
    hits = {}
    for policy in ("cache_aware", "least_outstanding"):
        spec = RunSpec("agent", 1.0, 4, policy, seed=3, duration=90.0, warmup=20.0)
        hits[policy] = simulate(spec).hit_rate
    assert hits["cache_aware"] > hits["least_outstanding"] + 0.1
    assert not math.isnan(hits["cache_aware"])
