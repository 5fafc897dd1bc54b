"""Quotas in Redis (``shared_state.kind: redis``): every replica reserves from the same buckets.

A request's limits and budgets are one ``EVALSHA`` of :data:`RESERVE` (one round trip): GCRA for each
request and token bucket and the budget counters, checked all together and taken all or none, on the
Redis server's clock (``TIME``), so replicas with skewed clocks agree. Settling after the call is one
more (off the request's path: the client already has its answer). Redis errors and timeouts are
translated here into :class:`QuotaUnavailable`; after one, calls fail fast for ``retry_after``
seconds instead of each waiting for a timeout. Keys of one request may live on different Cluster
slots: a single Redis (or a primary with replicas) is supported, Redis Cluster is not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from gateway.quota._types import WINDOW_MS, Bucket, Correction, QuotaUnavailable, Spend, Verdict
from gateway.redis_failures import RedisFailures, redis_errors

log = logging.getLogger("pointsman.quota")


# KEYS: buckets then spend counters. ARGV[1]: the number of buckets, then per bucket (interval_ms, cost),
# then per spend line (limit_nano, cost_nano, ttl_s). Returns {1, remaining_1, reset_ms_1, ...} or
# {0, refused index (1-based), retry_ms, spent_nano}. Numbers with fractions go back as strings (Redis
# truncates Lua numbers to integers).
RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window = tonumber(ARGV[2])
local nb = tonumber(ARGV[1])
local tats = {}
for i = 1, nb do
  local interval = tonumber(ARGV[1 + 2 * i])
  local cost = tonumber(ARGV[2 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  local new = tat + interval * cost
  if new - now > window then
    return {0, i, tostring(new - now - window), '0'}
  end
  tats[i] = new
end
local base = 2 + 2 * nb
for j = 1, #KEYS - nb do
  local limit = tonumber(ARGV[base + 3 * j - 2])
  local cost = tonumber(ARGV[base + 3 * j - 1])
  local spent = tonumber(redis.call('GET', KEYS[nb + j]) or '0')
  if spent + cost > limit then
    return {0, nb + j, '-1', tostring(spent)}
  end
end
local out = {1}
for i = 1, nb do
  local interval = tonumber(ARGV[1 + 2 * i])
  redis.call('SET', KEYS[i], tostring(tats[i]), 'PX', math.ceil(tats[i] - now) + 1000)
  out[#out + 1] = math.floor((window - (tats[i] - now)) / interval)
  out[#out + 1] = tostring(tats[i] - now)
end
for j = 1, #KEYS - nb do
  redis.call('INCRBY', KEYS[nb + j], ARGV[base + 3 * j - 1])
  redis.call('EXPIRE', KEYS[nb + j], ARGV[base + 3 * j])
end
return out
"""

# KEYS: buckets then spend counters. ARGV[1]: the number of buckets, then per bucket (interval_ms, delta),
# then per spend counter its delta_nano. A bucket or counter that expired meanwhile is left alone.
SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local nb = tonumber(ARGV[1])
for i = 1, nb do
  local interval = tonumber(ARGV[2 * i])
  local delta = tonumber(ARGV[1 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if delta > 0 and tat < now then tat = now end
  local new = tat + interval * delta
  if new > now then
    redis.call('SET', KEYS[i], tostring(new), 'PX', math.ceil(new - now) + 1000)
  elseif tat > 0 then
    redis.call('DEL', KEYS[i])
  end
end
for j = 1, #KEYS - nb do
  if redis.call('EXISTS', KEYS[nb + j]) == 1 then
    local left = redis.call('INCRBY', KEYS[nb + j], ARGV[1 + 2 * nb + j])
    if left < 0 then redis.call('SET', KEYS[nb + j], '0', 'KEEPTTL') end
  end
end
return 1
"""


class RedisQuotaStore:
    """:class:`~gateway.quota.QuotaStore` over one ``redis.asyncio`` client (whose ``socket_timeout``
    bounds every call: see :class:`gateway.shared_state.SharedState`)."""

    def __init__(self, client: Any, retry_after: float = 1.0) -> None:
        self._client = client
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)
        self._retry_after = retry_after
        self._failures = RedisFailures(log, "quotas", "applying shared_state.fail", retry_after)

    async def reserve(self, buckets: Sequence[Bucket], spends: Sequence[Spend]) -> Verdict:
        keys = [b.key for b in buckets] + [s.key for s in spends]
        args: list[Any] = [len(buckets), WINDOW_MS]
        for bucket in buckets:
            args += [repr(bucket.interval_ms), bucket.cost]
        for spend in spends:
            args += [spend.limit_nano, spend.cost_nano, spend.ttl_s]
        reply = await self._call(self._reserve(keys=keys, args=args), "reserve")
        if int(reply[0]) == 1:
            values = reply[1:]
            remaining = [(int(values[i]), float(values[i + 1])) for i in range(0, len(values), 2)]
            return Verdict(True, remaining=remaining)
        index = int(reply[1]) - 1
        if index >= len(buckets):
            spend = spends[index - len(buckets)]
            retry_ms = max(spend.ends_at - time.time(), 0.0) * 1000.0
            return Verdict(False, index, retry_ms, int(float(reply[3])))
        return Verdict(False, index, float(reply[2]))

    async def settle(self, corrections: Sequence[Correction], spends: Sequence[tuple[str, int]]) -> None:
        if not corrections and not spends:
            return
        keys = [c.key for c in corrections] + [key for key, _ in spends]
        args: list[Any] = [len(corrections)]
        for fix in corrections:
            args += [repr(fix.interval_ms), fix.delta]
        args += [delta for _, delta in spends]
        await self._call(self._settle(keys=keys, args=args), "settle")

    async def close(self) -> None:
        """The client belongs to :class:`~gateway.shared_state.SharedState`, which closes it."""

    async def _call(self, call: Any, what: str) -> Any:
        if self._failures.skipping():
            call.close()  # the coroutine was never awaited
            raise QuotaUnavailable(f"Redis {what} skipped: it failed less than {self._retry_after:g}s ago")
        try:
            return await call
        except redis_errors() as exc:
            self._failures.failed(exc, what)
            raise QuotaUnavailable(f"Redis {what} failed: {type(exc).__name__}") from exc
