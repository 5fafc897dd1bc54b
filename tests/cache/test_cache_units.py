"""The cache's pieces without a gateway: keys and scope, bypass rules, config errors, the memory store."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from gateway.cache.entry import BucketItem, CachedAnswer, storable_completion
from gateway.cache.key import bypass_reason, cache_keys, guard_digest
from gateway.cache.memory import MemoryStore
from gateway.config import parse_config
from gateway.errors import ConfigError
from policies.config import CacheSettings
from tests.cache.helpers import stored_pair

EXACT, SEMANTIC = CacheSettings(), CacheSettings(mode="semantic")
BASE: dict[str, Any] = {
    "model": "auto",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "What is a cache?"}],
    "temperature": 0,
}


def keys(body: dict[str, Any], settings: CacheSettings = EXACT, **scope: Any) -> Any:
    where = {"tenant": "t", "route": "auto", "model": "m", "endpoint": "chat.completions", **scope}
    return cache_keys(body=body, settings=settings, encoder="enc", **where)


@pytest.mark.parametrize("change", [
    {"messages": [{"role": "system", "content": "Be verbose."}, *BASE["messages"][1:]]},
    {"messages": [BASE["messages"][0], {"role": "user", "content": "Hey"}, *BASE["messages"][2:]]},
    {"messages": [*BASE["messages"][:3], {"role": "user", "content": "What is a queue?"}]},
    {"tools": [{"type": "function", "function": {"name": "f"}}]},
    {"tool_choice": "none"},
    {"response_format": {"type": "json_object"}},
    {"temperature": 0.5}, {"top_p": 0.9}, {"max_tokens": 5}, {"seed": 7}, {"stop": ["x"]}, {"n": 1},
    {"presence_penalty": 1.0}, {"frequency_penalty": 1.0}, {"logprobs": True}, {"logit_bias": {"1": 2}},
    {"reasoning_effort": "high"},  # a field the gateway has never heard of still separates entries
])
def test_every_field_that_may_change_the_answer_changes_the_exact_key(change: dict[str, Any]) -> None:
    assert keys({**BASE, **change}).exact != keys(BASE).exact


@pytest.mark.parametrize("scope", [{"tenant": "other"}, {"tenant": None}, {"route": "other"}, {"model": "other"},
                                   {"endpoint": "completions"}])
def test_tenant_route_model_and_endpoint_are_in_every_key(scope: dict[str, Any]) -> None:
    assert keys(BASE, **scope).exact != keys(BASE).exact
    assert keys(BASE, SEMANTIC, **scope).bucket != keys(BASE, SEMANTIC).bucket


def test_delivery_fields_and_user_are_not_in_the_key_unless_per_user() -> None:
    same = {**BASE, "stream": True, "stream_options": {"include_usage": True}, "user": "u1"}
    assert keys(same).exact == keys(BASE).exact
    per_user = CacheSettings(per_user=True)
    assert keys(same, per_user).exact != keys({**same, "user": "u2"}, per_user).exact


def test_semantic_bucket_leaves_out_only_the_last_user_turn() -> None:
    other_turn = {**BASE, "messages": [*BASE["messages"][:3], {"role": "user", "content": "what's a cache"}]}
    a, b = keys(BASE, SEMANTIC), keys(other_turn, SEMANTIC)
    assert a.bucket == b.bucket and a.exact != b.exact and a.text == "What is a cache?"
    other_system = {**BASE, "messages": [{"role": "system", "content": "x"}, *BASE["messages"][1:]]}
    assert keys(other_system, SEMANTIC).bucket != a.bucket
    assert keys(BASE, SEMANTIC).bucket != cache_keys(body=BASE, settings=SEMANTIC, encoder="other", tenant="t",
                                                     route="auto", model="m", endpoint="chat.completions").bucket


def test_semantic_matching_needs_plain_text_of_bounded_length() -> None:
    image = {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"},
                                                               {"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert keys(image, SEMANTIC).bucket is None
    long = {**BASE, "messages": [{"role": "user", "content": "x" * 3000}]}
    assert keys(long, SEMANTIC).bucket is None
    parts = {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert keys(parts, SEMANTIC).text == "hello"
    assert keys(BASE).bucket is None  # exact mode


def test_guard_digest() -> None:  # the rule itself: tests/cache/test_cache_guard.py
    assert guard_digest("what is 2+2?") != guard_digest("what is 2+3?")
    assert guard_digest("What is 2 + 2") == guard_digest("what is 2+2?")
    assert keys(BASE, SEMANTIC).guard == guard_digest("What is a cache?")


def test_bypass_rules() -> None:
    assert bypass_reason({"n": 2}, EXACT) == "n"
    assert bypass_reason({"n": 1}, EXACT) is None
    assert bypass_reason({}, EXACT) is None
    strict = CacheSettings(sampled=False)
    assert bypass_reason({}, strict) == "sampled"
    assert bypass_reason({"temperature": 0.2}, strict) == "sampled"
    assert bypass_reason({"temperature": 0}, strict) is None


def test_only_complete_single_choice_text_answers_are_storable() -> None:
    def body(finish: str = "stop", **message: Any) -> bytes:
        import orjson

        msg = {"role": "assistant", "content": "hi", **message}
        return orjson.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": msg,
                                                                       "finish_reason": finish}]})

    assert storable_completion(body()) is not None
    assert storable_completion(body("length")) is None
    assert storable_completion(body("tool_calls", tool_calls=[{"id": "c"}], content=None)) is None
    assert storable_completion(body("content_filter")) is None
    assert storable_completion(b'{"error": {"message": "x"}}') is None
    assert storable_completion(b"not json") is None


@pytest.mark.parametrize("route,message", [
    ({"cache": {"ttl": 90000}, "record": {"text_retention_days": 1}}, "cache.ttl"),
    ({"cache": {"mode": "exact", "similarity": 0.9}}, "similarity: only apply with mode: semantic"),
    ({"cache": {"similarity": 1.5, "mode": "semantic"}}, "similarity"),
    ({"cache": {"mode": "fuzzy"}}, "mode"),
    ({"cache": {"ttl": 0}}, "ttl"),
    ({"cache": {"colour": "red"}}, "colour"),
])
def test_bad_cache_settings_name_the_key(route: dict[str, Any], message: str) -> None:
    data = {"backends": [{"name": "b", "base_url": "http://127.0.0.1:1/v1", "models": [{"name": "m"}]}],
            "routes": [{"name": "auto", "model": "m", **route}]}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert "routes" in str(info.value) and message in str(info.value)


def test_memory_store_ttl_lru_and_buckets() -> None:
    async def run() -> None:
        store = MemoryStore(max_entries=2, bucket_size=2)
        answer = CachedAnswer(completion={"object": "chat.completion"}, model="m", created_at=time.time())
        k1, k2, k3, k4 = (keys({**BASE, "seed": i}, SEMANTIC) for i in range(4))
        vector = np.ones(4, dtype=np.float32) / 2
        for k in (k1, k2):
            store.put_now(k, answer, BucketItem(k.exact, time.time(), k.guard, vector), ttl=60)
        assert await store.get(k1.exact) is not None  # k1 is now the most recent
        store.put_now(k3, answer, None, ttl=60)
        assert await store.get(k2.exact) is None and len(store) == 2  # least recent evicted
        store.put_now(k1, answer, None, ttl=0.01)  # a live entry is kept (the first answer stored wins)
        assert await store.get(k1.exact) is not None
        store.put_now(k4, answer, None, ttl=0.01)
        await asyncio.sleep(0.02)
        assert await store.get(k4.exact) is None  # expired
        found, items = await store.lookup(k2)
        assert found is None and len(items) <= 2
        assert store.forget_tenant(k3.tenant) == 1 and len(store) == 0

    asyncio.run(run())


def test_the_items_of_evicted_entries_are_dropped_from_the_bucket() -> None:
    async def run() -> None:
        store = MemoryStore(max_entries=2, bucket_size=8)
        a, b = await stored_pair(store)
        other = keys({**BASE, "seed": 99})
        store.put_now(other, CachedAnswer(completion={}, model="c", created_at=time.time()), None, ttl=60)
        assert await store.get(a.exact) is None  # the least recent entry went
        found = await store.first_live(a, [a.exact, b.exact])
        assert found is not None and found[0] == 1 and found[1].model == "b"
        _, items = await store.lookup(a)
        assert [item.key for item in items] == [b.exact]

    asyncio.run(run())


def test_a_forgotten_tenant_leaves_no_embeddings_in_the_memory_store() -> None:
    async def run() -> None:
        store = MemoryStore(max_entries=10, bucket_size=8)
        a, _ = await stored_pair(store)
        assert store.forget_tenant(a.tenant) == 2
        assert await store.lookup(a) == (None, [])

    asyncio.run(run())


def test_bucket_items_round_trip() -> None:
    vector = np.linspace(-1, 1, 8).astype(np.float32)
    item = BucketItem(key="ab" * 16, created_at=123.5, guard="cd" * 8, vector=vector)
    back = BucketItem.from_bytes(item.to_bytes())
    assert back is not None and back.key == item.key and back.guard == item.guard and back.created_at == 123.5
    np.testing.assert_allclose(back.vector, vector, atol=1e-3)
    assert BucketItem.from_bytes(b"short") is None
    assert CachedAnswer.from_bytes(b"junk") is None
