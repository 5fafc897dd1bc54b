"""Replica selection as a user of ``backends[].balancing`` relies on it: prefix hashes that line up
between turns of a conversation, a bounded and aging prefix index, the policies' choices and their load
bounds, engine metrics parsing, and the configuration's validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.balancing import (
    Affinity,
    CacheAware,
    SessionAffinity,
    make_policy,
    prefix_blocks,
    session_hash,
    tenant_seed,
)
from gateway.balancing.engine_load import origin_of, parse_engine_metrics
from gateway.balancing.index import PrefixIndex
from gateway.config import BackendConfig


@dataclass
class Rep:
    slot: int
    outstanding: int = 0
    tokens_in_flight: int = 0
    external_load: float = 0.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _body(messages: list[dict[str, Any]], model: str = "auto", **extra: Any) -> bytes:
    return orjson.dumps({"model": model, "messages": messages, **extra})


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "You are an agent. " * 400}, {"role": "user", "content": "task " * 300}]
    for k in range(turns):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": f'{{"n": {k}}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k} " * 500})
    return messages


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- prefix hashes -------------------------------------------------------------------------------


def test_a_later_turn_shares_every_full_block_of_the_earlier_one() -> None:
    earlier = prefix_blocks(_body(_conversation(3)), block_bytes=1024)
    later = prefix_blocks(_body(_conversation(6), model="gpt-4o"), block_bytes=1024)  # the router chose a model
    assert len(earlier.hashes) > 10
    # All but the earlier turn's last (partial) block are shared, whatever the fields before "messages".
    assert _common(earlier.hashes, later.hashes) == len(earlier.hashes) - 1
    assert later.total_bytes > earlier.total_bytes
    assert earlier.tokens() == earlier.total_bytes // 4
    assert earlier.end(0) == 1024 and earlier.end(-1) == earlier.total_bytes


def test_different_conversations_and_tenants_share_nothing() -> None:
    one = prefix_blocks(_body([{"role": "user", "content": "a" * 5000}]), block_bytes=1024)
    other = prefix_blocks(_body([{"role": "user", "content": "b" * 5000}]), block_bytes=1024)
    assert _common(one.hashes, other.hashes) == 0
    same = _body(_conversation(2))
    assert _common(prefix_blocks(same, seed=tenant_seed("acme")).hashes,
                   prefix_blocks(same, seed=tenant_seed("globex")).hashes) == 0
    assert prefix_blocks(same, seed=tenant_seed("acme")) == prefix_blocks(same, seed=tenant_seed("acme"))


def test_odd_bodies_hash_without_errors() -> None:
    assert prefix_blocks(b'{"model":"m","prompt":"complete this"}').hashes  # legacy completions
    assert prefix_blocks(b"").hashes == []
    assert len(prefix_blocks(b"\xff" * 10_000, block_bytes=4096).hashes) == 3


# --- the prefix index ----------------------------------------------------------------------------


def test_a_session_key_holds_across_turns_and_stays_within_its_tenant() -> None:
    first = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    later = {"messages": [*first["messages"], {"role": "assistant", "content": "hello"},
                          {"role": "user", "content": "more"}]}
    assert session_hash("t", None, first) == session_hash("t", None, later)
    assert session_hash("t", None, first) != session_hash("u", None, first)
    other = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hey"}]}
    assert session_hash("t", None, first) != session_hash("t", None, other)
    assert session_hash("t", "s-1", first) == session_hash("t", "s-1", other)  # the header wins
    assert session_hash("t", "s-1", first) != session_hash("t", "s-2", first)
    # Odd content hashes (parts, images, numbers, lone surrogates) and stays a 64-bit key.
    odd = {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800 x"},
                                                     {"type": "image_url", "image_url": {"url": "data:," + "A" * 10}},
                                                     {"n": 1.5, "b": None}]}]}
    assert 0 <= session_hash(None, None, odd) < 2**64
    # A huge first message costs no more than its first 8k characters: the key is the same.
    big = "x" * 8192
    assert session_hash(None, None, {"messages": [{"role": "user", "content": big + "a" * 100_000}]}) == \
        session_hash(None, None, {"messages": [{"role": "user", "content": big + "b"}]})


def test_the_index_finds_the_longest_prefix_a_usable_replica_saw() -> None:
    index = PrefixIndex(max_entries=100, ttl=60)
    index.record([1, 2, 3], bit=0b01)
    index.record([1, 2, 3, 4, 5], bit=0b10, start=3)
    assert index.longest([1, 2, 3, 4, 5, 6], usable=0b11) == (4, 0b10)
    assert index.longest([1, 2, 3, 4, 5, 6], usable=0b01) == (2, 0b01)  # replica 2 not usable
    assert index.longest([9, 8], usable=0b11) == (-1, 0)


def test_the_index_is_bounded_and_least_recently_touched_blocks_go_first() -> None:
    index = PrefixIndex(max_entries=3, ttl=60)
    index.record([1, 2, 3], bit=1)
    index.record([1], bit=1)  # touched: now the most recent
    index.record([4], bit=1)
    assert len(index) == 3
    assert index.longest([2], usable=1) == (-1, 0)  # the least recently touched went
    assert index.longest([1], usable=1) == (0, 1)


def test_blocks_age_out_and_forgotten_replicas_lose_them() -> None:
    clock = Clock()
    index = PrefixIndex(max_entries=100, ttl=10, clock=clock)
    index.record([1, 2], bit=0b01)
    clock.now += 11
    assert index.longest([1, 2], usable=0b11) == (-1, 0)
    index.record([1, 2], bit=0b01)
    index.record([1, 2], bit=0b10)
    clock.now += 1
    index.forget(0b01)  # replica 1 went down: its cache cannot be trusted any more
    assert index.longest([1, 2], usable=0b11) == (1, 0b10)
    clock.now += 1
    index.record([1, 2], bit=0b01)  # placed there again after it came back
    assert index.longest([1, 2], usable=0b11) == (1, 0b11)


# --- policies ------------------------------------------------------------------------------------


def _place(policy: Any, replicas: list[Rep], raw: bytes, session: int | None = None) -> Rep:
    affinity = Affinity(blocks=prefix_blocks(raw, block_bytes=1024), session=session)
    choice = policy.choose(replicas, affinity)
    policy.served(choice, affinity)
    return choice.replica  # type: ignore[no-any-return]


def test_least_outstanding_takes_the_least_loaded_and_rotates_ties() -> None:
    policy = make_policy("least_outstanding")
    replicas = [Rep(0, outstanding=3), Rep(1, outstanding=1), Rep(2, outstanding=1)]
    picks = {policy.choose(replicas, Affinity()).replica.slot for _ in range(4)}
    assert picks == {1, 2}
    tokens = make_policy("least_outstanding", load="tokens")
    replicas = [Rep(0, outstanding=1, tokens_in_flight=100), Rep(1, outstanding=0, tokens_in_flight=9000)]
    assert tokens.choose(replicas, Affinity()).replica.slot == 0


def test_cache_aware_follows_the_prefix_until_the_load_bounds() -> None:
    policy = CacheAware(balance_abs=2, balance_rel=1.5)
    replicas = [Rep(0), Rep(1), Rep(2)]
    first = _place(policy, replicas, _body(_conversation(1)))
    for turns in range(2, 5):  # later turns follow the conversation, however the load is spread below the bound
        for r in replicas:
            r.outstanding = 2 if r is first else 0
        assert _place(policy, replicas, _body(_conversation(turns))) is first
    first.outstanding = 3  # more than least (0) + 2 and more than 1.5 x least: load wins
    choice = policy.choose(replicas, Affinity(blocks=prefix_blocks(_body(_conversation(5)), block_bytes=1024)))
    assert choice.replica is not first and choice.reason == "imbalance"
    later = Affinity(blocks=prefix_blocks(_body(_conversation(5)), block_bytes=1024))
    # Load wins only past both bounds: 13 vs 10 passes the absolute one (> 10 + 2) but not the
    # relative one (not > 10 x 1.5); 4 vs 2 passes the relative one (> 2 x 1.5) but not the absolute.
    for mine, least in ((13, 10), (4, 2)):
        for r in replicas:
            r.outstanding = least
        first.outstanding = mine
        assert policy.choose(replicas, later).replica is first, (mine, least)


def test_prefix_affinity_without_bounds_ignores_load() -> None:
    policy = make_policy("prefix_affinity")
    replicas = [Rep(0), Rep(1)]
    first = _place(policy, replicas, _body(_conversation(1)))
    first.outstanding = 100
    assert _place(policy, replicas, _body(_conversation(2))) is first


def test_cache_aware_reports_the_cached_share_it_expects() -> None:
    policy = CacheAware()
    replicas = [Rep(0), Rep(1)]
    _place(policy, replicas, _body(_conversation(3)))
    affinity = Affinity(blocks=prefix_blocks(_body(_conversation(4)), block_bytes=1024), output_tokens=100)
    choice = policy.choose(replicas, affinity)
    assert choice.reason == "prefix"
    assert 0 < choice.cached_tokens < affinity.prompt_tokens()
    assert choice.load_tokens == affinity.prompt_tokens() - choice.cached_tokens + 100


def _chat(turns: int) -> bytes:
    """A short chat: every turn fits in the first 4 KiB block, so no block is shared between turns."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(turns):
        messages += [{"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": f"answer {k}"}]
    return _body([*messages, {"role": "user", "content": "and now?"}])


def test_cache_aware_keeps_a_short_chat_on_its_replica_through_its_session() -> None:
    policy = CacheAware(balance_abs=2, balance_rel=1.5)
    replicas = [Rep(0), Rep(1), Rep(2)]
    home = _place(policy, replicas, _chat(0), session=5)
    for turns in range(1, 4):
        for r in replicas:
            r.outstanding = 2 if r is home else 0  # busier, within the bound
        affinity = Affinity(blocks=prefix_blocks(_chat(turns)), session=5)
        assert affinity.blocks is not None and affinity.blocks.last_full() < 0
        choice = policy.choose(replicas, affinity)
        assert (choice.replica, choice.reason) == (home, "session")
        policy.served(choice, affinity)
    home.outstanding = 3  # past both bounds: load wins, and the session follows its new replica
    moved = _place(policy, replicas, _chat(4), session=5)
    assert moved is not home
    for r in replicas:
        r.outstanding = 0
    assert policy.choose(replicas, Affinity(blocks=prefix_blocks(_chat(5)), session=5)).replica is moved
    policy.forget(moved.slot)  # its replica lost its cache: the session goes by load again
    assert policy.choose(replicas, Affinity(blocks=prefix_blocks(_chat(6)), session=5)).reason == "load"
    # A peer learns a short chat's placement from its session key.
    peer = CacheAware()
    key = policy.hint_key(policy.choose([Rep(2)], Affinity(blocks=prefix_blocks(_chat(0)), session=8)),
                          Affinity(blocks=prefix_blocks(_chat(0)), session=8))
    assert key == 8
    peer.apply_hint(8, 2)
    assert peer.choose(replicas, Affinity(blocks=prefix_blocks(_chat(1)), session=8)).replica.slot == 2


def test_session_affinity_keeps_a_session_and_rebalances_when_its_replica_is_lost() -> None:
    policy = SessionAffinity()
    replicas = [Rep(0), Rep(1)]
    home = _place(policy, replicas, b"{}", session=42)
    home.outstanding = 50  # affinity, not load, decides later turns
    assert _place(policy, replicas, b"{}", session=42) is home
    policy.forget(home.slot)
    assert _place(policy, replicas, b"{}", session=42) is not home
    assert _place(policy, [home], b"{}", session=7) is home  # the only usable one


def test_hints_from_peers_place_sessions_and_prefixes() -> None:
    sessions = SessionAffinity()
    sessions.apply_hint(99, 1)
    assert sessions.choose([Rep(0), Rep(1)], Affinity(session=99)).replica.slot == 1
    cache = CacheAware()
    earlier = Affinity(blocks=prefix_blocks(_body(_conversation(2)), block_bytes=1024))
    key = cache.hint_key(cache.choose([Rep(0)], earlier), earlier)
    assert key == earlier.blocks.hashes[-2]  # type: ignore[union-attr]  # the last full block
    peer = CacheAware()
    peer.apply_hint(key, 1)  # type: ignore[arg-type]
    later = Affinity(blocks=prefix_blocks(_body(_conversation(3)), block_bytes=1024))
    assert peer.choose([Rep(0), Rep(1)], later).replica.slot == 1


# --- engine metrics ------------------------------------------------------------------------------


VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
vllm:prompt_tokens_total{model_name="llama"} 123456.0
"""


def test_engine_metrics_are_read_from_vllm_and_sglang() -> None:
    assert parse_engine_metrics(VLLM, "vllm") == (5.0, 7.0, 0.42)
    old = "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.9\n"  # older vLLM names, no labels
    assert parse_engine_metrics(old, "vllm") == (1.0, 0.0, 0.9)
    sglang = 'sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs{model_name="m"} 1\n'
    assert parse_engine_metrics(sglang, "sglang") == (4.0, 1.0, None)
    assert parse_engine_metrics("<html>not metrics</html>", "vllm") is None
    assert parse_engine_metrics("vllm:num_requests_running NaN\n", "vllm") is None
    # Not load: non-finite or negative samples are skipped, a total past float range is unusable.
    assert parse_engine_metrics("vllm:num_requests_running +Inf\nvllm:num_requests_waiting -Inf\n", "vllm") is None
    assert parse_engine_metrics("vllm:num_requests_running 2\nvllm:num_requests_waiting -3\n", "vllm") == (2, 0, None)
    assert parse_engine_metrics("vllm:num_requests_running 1e308\n" * 2, "vllm") is None
    # A label value may hold a brace; a timestamp may follow the value; a longer name is another metric.
    odd = 'vllm:num_requests_running{a="}"} 3 1700000000\nvllm:num_requests_running_x 9\n'
    assert parse_engine_metrics(odd, "vllm") == (3, 0, None)
    assert origin_of("http://10.0.0.5:8000/v1") == "http://10.0.0.5:8000"


# --- configuration -------------------------------------------------------------------------------


def test_balancing_config_is_validated() -> None:
    backend = {"name": "b", "base_url": "http://127.0.0.1:1/v1", "models": [{"name": "m"}]}
    parsed = BackendConfig.model_validate({**backend, "balancing": {"policy": "cache_aware"}})
    assert parsed.balancing.policy == "cache_aware" and parsed.balancing.partition == "tenant"
    for bad in ({"policy": "fastest"}, {"balance_rel": 0.5}, {"load": "kv"}, {"engine_metrics": {"kind": "tgi"}},
                {"blocks": 3}):
        with pytest.raises(ValidationError) as error:
            BackendConfig.model_validate({**backend, "balancing": bad})
        assert "balancing" in str(error.value)


def test_backend_config_refuses_what_would_break_every_request_at_load() -> None:
    """Each of these started, then answered every request with a 500 or a 503, broke the metrics, or (engine
    metrics without health checks) silently did nothing."""
    backend = {"name": "b", "models": [{"name": "m"}]}
    cases = {
        "replicas": {"replicas": ["http://10.0.0.5:8000/v1", "http://10.0.0.5:8000/v1/"]},
        "api_key": {"base_url": "http://10.0.0.5:8000/v1", "api_key": "sk-secret\n"},
        "health.path": {"base_url": "http://10.0.0.5:8000/v1", "health": {"path": "models"}},
        "balancing.engine_metrics.path": {"base_url": "http://10.0.0.5:8000/v1",
                                          "balancing": {"engine_metrics": {"path": "/met rics"}}},
        "user:password@": {"base_url": "http://svc:secret-pw@10.0.0.5:8000/v1", "api_key": "sk-secret"},
        "health.enabled": {"base_url": "http://10.0.0.5:8000/v1", "health": {"enabled": False},
                           "balancing": {"engine_metrics": {"kind": "vllm"}}},  # its load was never read
    }
    for key, fields in cases.items():
        with pytest.raises(ValidationError) as error:
            BackendConfig.model_validate({**backend, **fields})
        assert key in str(error.value), error.value
    # Credentials alone are HTTP basic auth to the replica: accepted.
    BackendConfig.model_validate({**backend, "base_url": "http://svc:secret-pw@10.0.0.5:8000/v1"})

