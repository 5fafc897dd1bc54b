"""Hot state shared by gateway replicas through Redis (``shared_state.kind: redis``).

One ``redis.asyncio`` client, opened by :class:`SharedState` at start-up and closed at shutdown (no
module-level client), serves: session stickiness (:class:`RedisSessionStore`, the policies'
:class:`~policies.sticky.SessionStore`), the cost-quality knob's score window (:class:`RedisKnobWindow`,
a :class:`~policies.knob.ScoreSink`), and rate limits and budgets (``gateway/quota/redis_store.py``).
Redis errors and timeouts are translated at each of these boundaries (sessions:
:class:`~policies.sticky.SessionStoreUnavailable`; quotas: ``QuotaUnavailable``; the knob keeps its
local window); ``shared_state.fail`` says what each feature does then.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any

from gateway.config import SharedStateConfig
from gateway.errors import ConfigError
from gateway.redis_failures import RedisFailures, redis_errors
from policies.sticky import SessionStoreUnavailable

log = logging.getLogger("pointsman.shared_state")


class RedisSessionStore:
    """Sessions of one route in Redis: one round trip per live decision (:meth:`claim`), a second only
    when a session escalates or moves (:meth:`pin`)."""

    def __init__(self, client: Any, prefix: str, ttl: float) -> None:
        self._client = client
        self._prefix = prefix + "sticky:"
        self._ttl_ms = max(1, int(ttl * 1000))
        # After a failure, skip Redis for a second: a Redis that hangs would otherwise cost every sticky
        # request a whole ``shared_state.timeout``, as the limits and the response cache do not.
        self._failures = RedisFailures(log, "session store", "deciding without stickiness", retry_after=1.0)

    def redis_key(self, key: str) -> str:
        """The Redis key of a session key (a hash: session ids and tenants are not stored)."""
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()

    async def lookup(self, key: str) -> str | None:
        """The session's model (``GET``: its TTL is left as it is)."""
        self._skip("read")
        model: str | None = await self._call(self._client.get(self.redis_key(key)), "read")
        return model

    async def claim(self, key: str, model: str) -> str | None:
        """``SET key model NX GET PX ttl`` + ``PEXPIRE key ttl`` in one round trip (Redis >= 7.0):
        the prior model with its TTL renewed, or ``None`` with ``model`` pinned."""
        self._skip("claim")
        name = self.redis_key(key)
        pipe = self._client.pipeline(transaction=False)
        pipe.set(name, model, nx=True, get=True, px=self._ttl_ms)
        pipe.pexpire(name, self._ttl_ms)
        prior: str | None = (await self._call(pipe.execute(), "claim"))[0]
        return prior

    async def pin(self, key: str, model: str) -> None:
        """Keep the session on ``model`` for the route's TTL."""
        self._skip("write")
        await self._call(self._client.set(self.redis_key(key), model, px=self._ttl_ms), "write")

    def _skip(self, what: str) -> None:
        if self._failures.skipping():
            raise SessionStoreUnavailable(f"Redis {what} skipped: it failed less than a second ago")

    async def _call(self, call: Any, what: str) -> Any:
        # socket_timeout bounds each read and write on the connection (set in SharedState.start), so
        # no asyncio.wait_for task is needed per call.
        try:
            return await call
        except redis_errors() as exc:
            self._failures.failed(exc, what)
            raise SessionStoreUnavailable(f"Redis {what} failed: {type(exc).__name__}") from exc


# KEYS[1]: the route's score list. ARGV: window, the number of seed scores, the seeds, then new scores.
# Seeds (a replica's historic window, from the decision log) are pushed only into an empty list.
_KNOB_SYNC = """
local window = tonumber(ARGV[1])
local nseed = tonumber(ARGV[2])
local first = 3
if nseed > 0 then
  first = 3 + nseed
  if redis.call('EXISTS', KEYS[1]) == 0 then
    for i = 3, 2 + nseed, 500 do
      redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 499, 2 + nseed)))
    end
  end
end
for i = first, #ARGV, 500 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
redis.call('LTRIM', KEYS[1], -window, -1)
return redis.call('LRANGE', KEYS[1], 0, -1)
"""


class RedisKnobWindow:
    """The cost-quality knob's recent-score window of one route, shared by replicas through a Redis list.

    The knob decides on its local copy (no Redis call on the request path); :meth:`add` buffers each
    observed score and :meth:`sync` (every ``shared_state.knob_sync_interval`` seconds) pushes them and
    loads the merged window back in one round trip, so replicas calibrate on the same window within
    one interval. The list is ``<key_prefix>knob:<route>:<router version>``: a promotion (which gives the
    route a new knob, see ``Brain._recalibrate``) starts a new list. The first sync of a knob seeds an
    empty list with the knob's own window (historic scores from the decision log). A failing Redis leaves
    the knob on its local window (it keeps observing: fail-open); buffered scores are sent when Redis
    answers again.
    """

    def __init__(self, client: Any, prefix: str, route: str, policy: Any, version: Callable[[], str]) -> None:
        self._client = client
        self._script = client.register_script(_KNOB_SYNC)
        self._prefix = f"{prefix}knob:{route}:"
        self._policy = policy  # a RulePolicy: its ``knob`` may be replaced by a promotion
        self._version = version
        self._knob: Any = None
        self._pending: list[float] = []
        self._seed: list[float] | None = None
        self.failures = 0
        self._stopped = False
        self._failure_log = RedisFailures(log, f"knob window {self._prefix}", "calibrating on this replica's window")
        self._adopt()

    @property
    def key(self) -> str:
        return self._prefix + self._version()

    def add(self, score: float) -> None:
        """:class:`policies.knob.ScoreSink`: buffer a score for the next sync."""
        self._pending.append(score)
        if len(self._pending) > 2 * self._knob.window:  # Redis down for long: keep the newest
            del self._pending[: len(self._pending) - self._knob.window]

    async def sync(self) -> bool:
        """Push buffered scores, load the shared window into the knob; False when Redis failed."""
        if self._policy.knob is not self._knob:
            self._adopt()
        knob = self._knob
        pending, self._pending = self._pending, []
        seed = self._seed or []
        args: list[Any] = [knob.window, len(seed), *map(repr, seed), *map(repr, pending)]
        try:
            window = await self._script(keys=[self.key], args=args)
        except redis_errors() as exc:
            self._pending = pending + self._pending
            self.failures += 1
            self._failure_log.failed(exc, "sync")
            return False
        self._seed = None
        if knob is self._knob:
            # Scores observed while the round trip was in flight stay in the window until the next sync.
            knob.replace([*map(float, window), *self._pending])
        return True

    async def run(self, interval: float) -> None:
        """Sync every ``interval`` seconds until cancelled or :meth:`stop`-ped."""
        while not self._stopped:
            await self.sync()
            await asyncio.sleep(interval)

    def stop(self) -> None:
        """End :meth:`run` after its current round (see :func:`gateway.redis_failures.stop_task`)."""
        self._stopped = True

    def _adopt(self) -> None:
        """Share the policy's current knob: its window seeds the list when the list is new."""
        self._knob = self._policy.knob
        self._knob.share(self)
        self._seed = self._knob.scores()
        self._pending = []


def redis_client(url: str, timeout: float, *, decode: bool) -> Any:
    """A ``redis.asyncio`` client whose every call is bounded by ``timeout`` seconds and never retried:
    redis-py's default (10 retries with exponential back-off) turns a Redis that is down into seconds
    per call, while each feature handles one failed call itself (``shared_state.fail``). Connects lazily;
    :class:`ConfigError` when ``url`` carries an option redis-py cannot read."""
    import redis.asyncio as redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    try:
        return redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=decode,
            retry=Retry(NoBackoff(), 0),
        )
    except ValueError as exc:  # an option in the URL's query it cannot read (?socket_timeout=5s); no password
        raise ConfigError(f"shared_state.url: {exc}") from None


class SharedState:
    """The Redis connection behind ``shared_state.kind: redis``: opened by :meth:`start`, checked, closed."""

    def __init__(self, config: SharedStateConfig) -> None:
        self.config = config
        self.client: Any = None

    async def start(self) -> None:
        """Connect and PING, so a wrong URL or a Redis that is down stops start-up with a clear message."""
        from redis.exceptions import RedisError

        cfg = self.config
        # decode_responses: model names come back as str, as the policies compare them.
        client = redis_client(cfg.url, cfg.timeout, decode=True)
        try:
            await asyncio.wait_for(client.ping(), max(cfg.timeout, 2.0))
            server = await asyncio.wait_for(client.info("server"), max(cfg.timeout, 2.0))
        except (RedisError, OSError, TimeoutError) as exc:
            await client.aclose()
            # The URL may hold a password: name the key, not its value.
            raise ConfigError(f"shared_state.url: cannot reach Redis ({type(exc).__name__}: {exc})") from exc
        version = str(server.get("redis_version", "0"))
        if _version_tuple(version) < (7, 0):  # SET ... NX GET, which claim() sends, came in 7.0
            await client.aclose()
            raise ConfigError(f"shared_state.url: Redis 7.0 or newer is needed for session stickiness, found {version}")
        self.client = client

    def session_store(self, ttl: float) -> RedisSessionStore:
        """A session store for a route whose sessions live ``ttl`` seconds."""
        if self.client is None:
            raise RuntimeError("SharedState.start() has not run")
        return RedisSessionStore(self.client, self.config.key_prefix, ttl)

    async def close(self) -> None:
        """Close the connection pool."""
        if self.client is not None:
            await self.client.aclose()
            self.client = None


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
