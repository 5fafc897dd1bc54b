"""The Redis store (``shared_state.kind: redis``): every replica reads and writes the same entries.

Key names hold digests only: ``<key_prefix>cache:<tenant digest>:e:<exact key>`` (the entry, with a
TTL) and ``<key_prefix>cache:<tenant digest>:b:<bucket key>`` (a semantic bucket: a list of its newest
``bucket_size`` items, each an exact key, a time, its guard digest and a float16 embedding).
A lookup is one round trip (GET + LRANGE pipelined), a semantic hit a second (a script that GETs the
best matches' entries in order and drops the items of those that are gone).

Redis errors and timeouts are translated here, at this one boundary, into :class:`CacheUnavailable`;
after one, the store is skipped for ``retry_after`` seconds (every request a miss meanwhile), so a
Redis that hangs costs at most one request a timeout per interval, never every request.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from typing import Any

from gateway.cache.entry import BucketItem, CachedAnswer
from gateway.cache.key import CacheKeys, tenant_digest
from gateway.redis_failures import RedisFailures, redis_errors

log = logging.getLogger("pointsman.cache")
_GLOB = re.compile(r"[\\*?\[\]]")  # what a Redis MATCH pattern reads as more than itself


# KEYS[1]: a bucket; KEYS[2..]: the entries of its best matches, best first; ARGV[i]: the 16-byte exact key
# of KEYS[i + 1] (a bucket item starts with it). Returns {position (1-based), entry} of the first entry that
# exists, or nil; drops the items of the ones before it from the bucket (their entries are gone).
_FIRST_LIVE = """
local found = false
local stale = {}
for i = 2, #KEYS do
  local entry = redis.call('GET', KEYS[i])
  if entry then
    found = {i - 1, entry}
    break
  end
  stale[ARGV[i - 1]] = true
end
if next(stale) then
  for _, item in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    if stale[string.sub(item, 1, 16)] then
      redis.call('LREM', KEYS[1], 0, item)
    end
  end
end
return found
"""

# KEYS[1]: an entry, KEYS[2]: its tenant's tombstone, KEYS[3] (optional): its bucket. ARGV: the entry, its TTL
# (ms), the time its request was issued, then with a bucket the item (starting with the entry's 16-byte exact
# key) and bucket_size. Nothing is written for a request issued before its tenant was forgotten (it was in
# flight during the forget), nor when the entry is there (an identical request stored first); otherwise the
# item replaces any item of the same key.
_PUT = """
local forgotten = redis.call('GET', KEYS[2])
if forgotten and tonumber(ARGV[3]) <= tonumber(forgotten) then
  return 0
end
if not redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then
  return 0
end
if #KEYS == 3 then
  local key = string.sub(ARGV[4], 1, 16)
  for _, item in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    if string.sub(item, 1, 16) == key then
      redis.call('LREM', KEYS[3], 0, item)
    end
  end
  redis.call('LPUSH', KEYS[3], ARGV[4])
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
"""

#: How long a tenant's cache tombstone lasts: far longer than any request can be in flight (a backend's
#: total timeout is 600 s by default), so no answer to a request issued before the forget is stored after it.
FORGOTTEN_TTL_SECONDS = 86_400


class CacheUnavailable(Exception):
    """The cache's Redis could not be used for this call (the request goes on as a miss)."""


class RedisStore:
    """Cached answers of one route in Redis, through a client shared by the routes."""

    def __init__(self, client: Any, prefix: str, bucket_size: int, retry_after: float = 1.0) -> None:
        self._client = client
        self._prefix = prefix + "cache:"
        self._forgotten = forgotten_prefix(prefix)
        self.bucket_size = bucket_size
        self.retry_after = retry_after
        self._failures = RedisFailures(log, "response cache", "serving without the cache", retry_after)
        self._first_live = client.register_script(_FIRST_LIVE)
        self._put = client.register_script(_PUT)

    def entry_key(self, keys: CacheKeys) -> str:
        return f"{self._prefix}{keys.tenant}:e:{keys.exact}"

    def bucket_key(self, keys: CacheKeys) -> str:
        return f"{self._prefix}{keys.tenant}:b:{keys.bucket}"

    async def lookup(self, keys: CacheKeys) -> tuple[CachedAnswer | None, list[BucketItem]]:
        """The exact entry (or None) and the items of the request's bucket, in one round trip."""
        if keys.bucket is None:
            data = await self._call(lambda: self._client.get(self.entry_key(keys)), "read")
            return await self._readable(keys, data), []
        pipe = self._client.pipeline(transaction=False)
        pipe.get(self.entry_key(keys))
        pipe.lrange(self.bucket_key(keys), 0, self.bucket_size - 1)
        data, raw_items = await self._call(pipe.execute, "read")
        items = [item for item in (BucketItem.from_bytes(r) for r in raw_items or ()) if item is not None]
        return await self._readable(keys, data), items

    async def _readable(self, keys: CacheKeys, data: bytes | None) -> CachedAnswer | None:
        """The entry read for ``keys.exact``; one that cannot be read (another release's format) is deleted,
        or the answer about to be fetched could not replace it (a put keeps the entry it finds)."""
        answer = _answer(data)
        if data is not None and answer is None:
            await self._call(lambda: self._client.delete(self.entry_key(keys)), "write")
        return answer

    async def first_live(self, keys: CacheKeys, candidates: list[str]) -> tuple[int, CachedAnswer] | None:
        """The first of ``candidates`` (exact keys of semantic matches of the same tenant, best first) whose
        entry is in Redis and readable: its position and answer (None: none is), in one round trip (one more
        per entry in another release's format). The items of the candidates before it whose entries are gone
        (evicted or expired) are dropped from the bucket in the same script: atomic, so an entry stored again
        meanwhile keeps its new item."""
        start = 0
        while start < len(candidates):
            rest = candidates[start:]
            names = [self.bucket_key(keys), *(f"{self._prefix}{keys.tenant}:e:{key}" for key in rest)]
            args = [bytes.fromhex(key) for key in rest]
            found = await self._call(functools.partial(self._first_live, keys=names, args=args), "read")
            if not found:
                return None
            position, answer = start + int(found[0]) - 1, _answer(found[1])
            if answer is not None:
                return position, answer
            # Another release's format (a rolling upgrade): that release serves it; this one tries the next.
            start = position + 1
        return None

    async def put(
        self, keys: CacheKeys, answer: CachedAnswer, item: BucketItem | None, ttl: float, *,
        issued_at: float | None = None,
    ) -> None:
        """Store the entry with its TTL unless one is there (and then push ``item`` onto its bucket, trimmed,
        in place of any item of the same key), atomically, in one round trip.

        Idempotent per exact key, like :meth:`MemoryStore.put_now`: identical requests in flight together
        (on any replicas) store the first answer and one bucket item, never one item each. Nothing is stored
        for a request issued (``issued_at``, default the answer's time) before its tenant was forgotten:
        :func:`forget_tenant` would otherwise miss an answer that was still on its way."""
        ttl_ms = max(1, int(ttl * 1000))
        issued = repr(answer.created_at if issued_at is None else issued_at)
        names = [self.entry_key(keys), f"{self._forgotten}{keys.tenant}"]
        args: list[Any] = [answer.to_bytes(), ttl_ms, issued]
        if item is not None and keys.bucket is not None:
            names.append(self.bucket_key(keys))
            args += [item.to_bytes(), self.bucket_size]
        await self._call(lambda: self._put(keys=names, args=args), "write")

    async def _call(self, call: Any, what: str) -> Any:
        if self._failures.skipping():
            raise CacheUnavailable(f"Redis {what} skipped: it failed less than {self.retry_after:g}s ago")
        try:
            return await call()
        except redis_errors() as exc:
            self._failures.failed(exc, what)
            raise CacheUnavailable(f"Redis {what} failed: {type(exc).__name__}") from exc

    async def close(self) -> None:
        """The client is the cache's, closed by it."""


def _answer(data: bytes | None) -> CachedAnswer | None:
    return None if data is None else CachedAnswer.from_bytes(data)


def connect(url: str, call_timeout: float) -> Any:
    """A ``redis.asyncio`` client (bytes in and out) whose every call is bounded by ``call_timeout`` seconds
    and never retried (the shared-state client's settings)."""
    from gateway.shared_state import redis_client

    return redis_client(url, call_timeout, decode=False)


def forgotten_prefix(prefix: str) -> str:
    """Where the tombstones of forgotten tenants live: ``<key_prefix>cache-forgotten:<tenant digest>``,
    outside the ``<key_prefix>cache:<tenant digest>:*`` names a forget deletes."""
    return prefix + "cache-forgotten:"


async def forget_tenant(client: Any, prefix: str, tenant: str | None) -> int:
    """Delete every cache entry and bucket of ``tenant`` under ``prefix`` (``pointsman forget``); the count.

    First a tombstone (the time of the forget, kept :data:`FORGOTTEN_TTL_SECONDS`): an answer to a request
    the tenant sent before, stored by a gateway after the deletes, would have outlived the forget."""
    digest = tenant_digest(tenant)
    await client.set(f"{forgotten_prefix(prefix)}{digest}", repr(time.time()), ex=FORGOTTEN_TTL_SECONDS)
    # The prefix is any string: its glob characters ("[eu]" is a class) must match only themselves, or the
    # SCAN misses this prefix's keys and deletes another prefix's.
    literal = _GLOB.sub(r"\\\g<0>", prefix)
    pattern = f"{literal}cache:{digest}:*"
    deleted = 0
    async for name in client.scan_iter(match=pattern, count=500):
        deleted += int(await client.delete(name))
    return deleted
