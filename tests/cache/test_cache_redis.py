"""The response cache in Redis: shared by replicas, and failing open when Redis stops or hangs.

The multi-replica test uses the shared Redis on 6379 under a key prefix of its own (deleted after).
The failure tests run their own ``redis-server`` on a spare port and stop, pause and restart it;
the shared one is never touched.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.cache.entry import CachedAnswer
from gateway.cache.redis import RedisStore, connect, forget_tenant
from tests.cache.helpers import (
    AUTH,
    PairedUpstream,
    ask,
    ask_together,
    backend,
    bucket_item,
    calls,
    paired_backend,
    semantic_keys,
    stored_pair,
    unique,
    user_id,
)
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually
from tests.redisproc import PrivateRedis

SHARED_REDIS = "redis://127.0.0.1:6379/0"


def config(upstream: FakeUpstream, url: str, prefix: str, paired: PairedUpstream | None = None) -> dict[str, Any]:
    return {
        "backends": [backend(upstream), *([paired_backend(paired)] if paired is not None else [])],
        "auth": AUTH,
        "retry": {"attempts": 1},
        "classifiers": {"encoder": "static"},
        "shared_state": {"kind": "redis", "url": url, "key_prefix": prefix},
        "routes": [
            {"name": "exact", "model": "echo-model", "cache": {}},
            {"name": "sem", "model": "echo-model", "cache": {"mode": "semantic"}},
            {"name": "sem-85", "model": "echo-model", "cache": {"mode": "semantic", "similarity": 0.85}},
            *([{"name": "sem-pair", "model": "paired-model", "cache": {"mode": "semantic", "bucket_size": 2}}]
              if paired is not None else []),
        ],
    }


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"pointsman-test-cache-{uuid.uuid4().hex[:8]}:"
    yield name
    client = redis.Redis.from_url(SHARED_REDIS)
    for key in client.scan_iter(match=f"{name}*"):
        client.delete(key)


def test_an_entry_written_through_one_replica_is_hit_through_the_other(
    upstream: FakeUpstream, tmp_path: Path, prefix: str
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = GatewayProcess(config(upstream, SHARED_REDIS, prefix), tmp_path / "a").start(timeout=60)
    b = GatewayProcess(config(upstream, SHARED_REDIS, prefix), tmp_path / "b").start(timeout=60)
    try:
        user, q = user_id(), [{"role": "user", "content": unique("Shared across replicas?")}]
        first = ask(a.base_url, "exact", q, user=user)
        assert first.cache == "miss"
        eventually(lambda: ask(b.base_url, "exact", q, user=user).cache == "hit", "replica b hits a's entry")
        assert calls(upstream, "echo", user) == 1
        hit = ask(b.base_url, "exact", q, user=user)
        assert hit.text == first.text and hit.headers["x-pointsman-backend"] == "cache"
        # Semantic: a near-duplicate through the other replica.
        system = {"role": "system", "content": unique("FAQ")}
        ask(b.base_url, "sem", [system, {"role": "user", "content": "How do I reset my password?"}], user=user)
        eventually(lambda: ask(a.base_url, "sem", [system, {"role": "user", "content": "how do i reset my password"}],
                               user=user).cache == "hit", "replica a hits b's entry by similarity")
        assert calls(upstream, "echo", user) == 2
        keys = [k.decode() for k in redis.Redis.from_url(SHARED_REDIS).scan_iter(match=f"{prefix}*")]
        assert keys and all(k.startswith(f"{prefix}cache:") for k in keys)
        assert not any("password" in k or "Shared" in k for k in keys)  # digests only
        # pointsman forget --tenant ... --cache-redis: the tenant's entries are gone for every replica.
        out = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "forget", "--store", f"sqlite:///{a.db_path}", "--tenant",
             "tenant-a", "--cache-redis", SHARED_REDIS, "--cache-prefix", prefix],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert out.returncode == 0, out.stderr
        assert not list(redis.Redis.from_url(SHARED_REDIS).scan_iter(match=f"{prefix}cache:*"))
        assert ask(b.base_url, "exact", q, user=user).cache == "miss"
    finally:
        a.terminate()
        b.terminate()


def test_a_semantic_lookup_falls_through_an_evicted_best_match_to_the_next_one(
    upstream: FakeUpstream, tmp_path: Path, prefix: str
) -> None:
    # As tests/cache/test_cache_gateway.py's test of the same name, with the best match's answer evicted
    # from Redis (as maxmemory or its TTL would) while the scope's list still holds its item.
    gw = GatewayProcess(config(upstream, SHARED_REDIS, prefix), tmp_path).start(timeout=60)
    client = redis.Redis.from_url(SHARED_REDIS)
    try:
        system, user = {"role": "system", "content": unique("Help bot")}, user_id()

        def faq(question: str) -> Any:
            return ask(gw.base_url, "sem-85", [system, {"role": "user", "content": question}], user=user)

        for question in ("reset my password", "How can I change my password?"):  # A, then B
            assert faq(question).cache == "miss"
            eventually(lambda q=question: faq(q).cache == "hit", f"{question!r} is stored")
        evicted = [k for k in client.scan_iter(match=f"{prefix}cache:*:e:*")
                   if b"ECHO: reset my password" in (client.get(k) or b"")]
        assert len(evicted) == 1 and client.delete(*evicted) == 1
        near = faq("how can i reset my password")
        assert (near.cache, near.text) == ("hit", "ECHO: How can I change my password?")
        assert calls(upstream, "echo", user) == 2
    finally:
        gw.terminate()


def test_identical_requests_in_flight_together_index_one_entry(
    upstream: FakeUpstream, paired: PairedUpstream, tmp_path: Path, prefix: str
) -> None:
    # As tests/cache/test_cache_gateway.py's test of the same name. Replica a's writes are awaited by its
    # shutdown; replica b then reads what they left in Redis.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = GatewayProcess(config(upstream, SHARED_REDIS, prefix, paired), tmp_path / "a").start(timeout=60)
    b = GatewayProcess(config(upstream, SHARED_REDIS, prefix, paired), tmp_path / "b").start(timeout=60)
    try:
        system, pair = {"role": "system", "content": unique("Bank bot")}, f"pair-{user_id()}"
        first = [system, {"role": "user", "content": "How do I open an account?"}]
        assert ask(a.base_url, "sem-pair", first, user=user_id()).cache == "miss"
        eventually(lambda: ask(a.base_url, "sem-pair", first, user=user_id()).cache == "hit", "the answer is stored")
        both = ask_together(a.base_url, "sem-pair", [system, {"role": "user", "content": "Explain recursion"}],
                            user=pair)
        assert [r.cache for r in both] == ["miss", "miss"] and paired.counts[pair] == 2  # in flight together
        assert a.terminate() == 0  # its writes in flight are finished first
        again = ask(b.base_url, "sem-pair", [system, {"role": "user", "content": "how do i open an account"}],
                    user=user_id())
        assert (again.cache, again.text) == ("hit", "ECHO: How do I open an account?")
    finally:
        a.terminate()
        b.terminate()


def test_identical_puts_at_once_store_the_first_answer_and_one_bucket_item(prefix: str) -> None:
    async def run() -> None:
        client = connect(SHARED_REDIS, 2.0)
        try:
            store = RedisStore(client, prefix, bucket_size=8)
            a, b = await stored_pair(store)
            c = semantic_keys("How do I change my password?")
            answers = [CachedAnswer(completion={"object": "chat.completion"}, model=f"c{i}", created_at=time.time())
                       for i in range(4)]
            await asyncio.gather(*(store.put(c, answer, bucket_item(c), ttl=60) for answer in answers))
            found, items = await store.lookup(c)
            assert found is not None and found.model in {"c0", "c1", "c2", "c3"}
            assert [i.key for i in items] == [c.exact, b.exact, a.exact]  # one item per key
            later = CachedAnswer(completion={"object": "chat.completion"}, model="later", created_at=time.time())
            await store.put(c, later, bucket_item(c), ttl=60)
            again = (await store.lookup(c))[0]
            assert again is not None and again.model == found.model  # the first answer stored stays
        finally:
            await client.aclose()

    asyncio.run(run())


def test_an_entry_another_release_wrote_is_replaced_by_the_next_answer(prefix: str) -> None:
    # A put keeps the entry it finds (identical requests in flight store the first answer): an entry that
    # cannot be read must not keep its key from being cached until it expires.
    async def run() -> None:
        client = connect(SHARED_REDIS, 2.0)
        try:
            store = RedisStore(client, prefix, bucket_size=8)
            a, _ = await stored_pair(store)
            await client.set(store.entry_key(a), b'{"v": 0, "answer": "another format"}', px=60_000)
            assert (await store.lookup(a))[0] is None  # a miss
            await store.put(a, CachedAnswer(completion={"object": "chat.completion"}, model="new",
                                            created_at=time.time()), None, ttl=60)
            found = (await store.lookup(a))[0]
            assert found is not None and found.model == "new"
        finally:
            await client.aclose()

    asyncio.run(run())


def test_the_items_of_evicted_entries_are_dropped_from_the_bucket(prefix: str) -> None:
    async def run() -> None:
        client = connect(SHARED_REDIS, 2.0)
        try:
            store = RedisStore(client, prefix, bucket_size=8)
            a, b = await stored_pair(store)
            assert await client.delete(store.entry_key(a)) == 1  # evicted, as maxmemory or its TTL would
            found = await store.first_live(a, [a.exact, b.exact])
            assert found is not None and found[0] == 1 and found[1].model == "b"
            _, items = await store.lookup(a)
            assert [item.key for item in items] == [b.exact]
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_best_match_another_release_wrote_is_passed_over_for_the_next_one(prefix: str) -> None:
    # During a rolling upgrade an entry may be in a format this release cannot read: the lookup goes on to
    # the next match instead of making the request a miss.
    async def run() -> None:
        client = connect(SHARED_REDIS, 2.0)
        try:
            store = RedisStore(client, prefix, bucket_size=8)
            a, b = await stored_pair(store)
            await client.set(store.entry_key(a), b'{"v": 0, "answer": "another format"}', px=60_000)
            found = await store.first_live(a, [a.exact, b.exact])
            assert found is not None and found[0] == 1 and found[1].model == "b"
        finally:
            await client.aclose()

    asyncio.run(run())


def test_forget_deletes_the_tenants_entries_under_its_own_prefix_only() -> None:
    # A key_prefix is any string; in a SCAN pattern "[eu]" is a character class: forgetting under
    # "...[eu]:" must delete that prefix's entries, and not those of a deployment whose prefix is "...e:".
    base = f"pointsman-test-cache-{uuid.uuid4().hex[:8]}"
    own, neighbour = f"{base}[eu]:", f"{base}e:"

    async def run() -> None:
        client = connect(SHARED_REDIS, 2.0)
        stores = [RedisStore(client, prefix, bucket_size=8) for prefix in (own, neighbour)]
        names: list[str] = []
        try:
            for store in stores:
                a, b = await stored_pair(store)
                names += [store.entry_key(a), store.entry_key(b), store.bucket_key(a)]
            assert await forget_tenant(client, own, "t") == 3  # two entries and their bucket
            assert await client.exists(*names[:3]) == 0
            assert await client.exists(*names[3:]) == 3  # the other deployment's are untouched
        finally:
            await client.delete(*names)
            await client.aclose()

    asyncio.run(run())


def test_the_cache_fails_open_when_redis_stops_hangs_or_was_never_up(upstream: FakeUpstream, tmp_path: Path) -> None:
    own = PrivateRedis(tmp_path)
    gw = GatewayProcess(config(upstream, own.url, "pm:"), tmp_path).start(timeout=60)  # Redis not up yet
    try:
        q = [{"role": "user", "content": unique("Is the cache up?")}]
        down = ask(gw.base_url, "exact", q)
        assert down.status == 200 and down.cache == "miss"  # started and served without Redis

        own.start()
        time.sleep(1.1)  # the store skips Redis for 1 s after a failure
        assert ask(gw.base_url, "exact", q).cache == "miss"
        eventually(lambda: ask(gw.base_url, "exact", q).cache == "hit", "entries are cached once Redis is up")

        own.stop()  # stopped mid-traffic
        for _ in range(5):
            started = time.monotonic()
            reply = ask(gw.base_url, "exact", q)
            assert reply.status == 200 and reply.cache == "miss"
            assert time.monotonic() - started < 1.0
        sem = ask(gw.base_url, "sem", [{"role": "user", "content": unique("semantic without Redis")}])
        assert sem.status == 200 and sem.cache == "miss"

        own.start()  # a new, empty Redis on the same port
        eventually(lambda: ask(gw.base_url, "exact", q).cache == "hit", "the cache recovers", timeout=10)

        own.pause()  # a Redis that hangs: calls time out (shared_state.timeout)
        try:
            for _ in range(4):
                started = time.monotonic()
                reply = ask(gw.base_url, "exact", [{"role": "user", "content": unique("Redis hangs")}])
                assert reply.status == 200 and reply.cache == "miss"
                assert time.monotonic() - started < 1.5
        finally:
            own.resume()
        decisions = [d for d in gw.decisions() if '"error"' in (d["decision"] or "")]
        assert decisions  # the records say the cache was unavailable
    finally:
        gw.terminate()
        own.stop()


def test_an_answer_still_on_its_way_when_its_tenant_is_forgotten_is_not_stored(prefix: str) -> None:
    # A request of the tenant in flight during `pointsman forget --cache-redis`: its answer was stored after
    # the forget's deletes and served the tenant's later requests for the entry's whole TTL. The forget
    # leaves a tombstone; a later request of the tenant is cached again.
    async def run() -> None:
        client = connect(SHARED_REDIS, 2.0)
        try:
            store = RedisStore(client, prefix, bucket_size=8)
            keys = semantic_keys("reset my password")
            issued = time.time()
            assert await forget_tenant(client, prefix, "t") == 0  # nothing stored yet
            answer = CachedAnswer(completion={"object": "chat.completion"}, model="a", created_at=time.time())
            await store.put(keys, answer, bucket_item(keys), ttl=60, issued_at=issued)
            assert await store.lookup(keys) == (None, [])
            await store.put(keys, answer, bucket_item(keys), ttl=60, issued_at=time.time() + 0.001)
            found, items = await store.lookup(keys)
            assert found is not None and found.model == "a" and [item.key for item in items] == [keys.exact]
            # The tombstone lives outside the names a forget deletes, and expires on its own.
            assert 0 < await client.ttl(f"{prefix}cache-forgotten:{keys.tenant}") <= 86_400
        finally:
            await client.aclose()

    asyncio.run(run())
