"""Hot state shared by gateway replicas through Redis (``shared_state.kind: redis``).

Today that is session stickiness: :class:`RedisSessionStore` implements the policies'
:class:`~policies.sticky.SessionStore` over one ``redis.asyncio`` client that :class:`SharedState`
opens at start-up and closes at shutdown (no module-level client). Redis errors and timeouts are
translated here, at this boundary, into :class:`~policies.sticky.SessionStoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

from gateway.config import SharedStateConfig
from gateway.errors import ConfigError
from policies.sticky import SessionStoreUnavailable

log = logging.getLogger("pointsman.shared_state")

# A failing Redis would otherwise log once per request.
_WARN_EVERY_S = 30.0


class RedisSessionStore:
    """Sessions of one route in Redis: one round trip per live decision (:meth:`claim`), a second only
    when a session escalates or moves (:meth:`pin`)."""

    def __init__(self, client: Any, prefix: str, ttl: float) -> None:
        self._client = client
        self._prefix = prefix + "sticky:"
        self._ttl_ms = max(1, int(ttl * 1000))
        self._warned_at = float("-inf")

    def redis_key(self, key: str) -> str:
        """The Redis key of a session key (a hash: session ids and tenants are not stored)."""
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()

    async def lookup(self, key: str) -> str | None:
        """The session's model (``GET``: its TTL is left as it is)."""
        model: str | None = await self._call(self._client.get(self.redis_key(key)), "read")
        return model

    async def claim(self, key: str, model: str) -> str | None:
        """``SET key model NX GET PX ttl`` + ``PEXPIRE key ttl`` in one round trip (Redis >= 7.0):
        the prior model with its TTL renewed, or ``None`` with ``model`` pinned."""
        name = self.redis_key(key)
        pipe = self._client.pipeline(transaction=False)
        pipe.set(name, model, nx=True, get=True, px=self._ttl_ms)
        pipe.pexpire(name, self._ttl_ms)
        prior: str | None = (await self._call(pipe.execute(), "claim"))[0]
        return prior

    async def pin(self, key: str, model: str) -> None:
        """Keep the session on ``model`` for the route's TTL."""
        await self._call(self._client.set(self.redis_key(key), model, px=self._ttl_ms), "write")

    async def _call(self, call: Any, what: str) -> Any:
        from redis.exceptions import RedisError

        # socket_timeout bounds each read and write on the connection (set in SharedState.start), so
        # no asyncio.wait_for task is needed per call.
        try:
            return await call
        except (RedisError, OSError, TimeoutError) as exc:
            now = time.monotonic()
            if now - self._warned_at >= _WARN_EVERY_S:
                self._warned_at = now
                log.warning("session store: Redis %s failed (%s); deciding without stickiness", what,
                            type(exc).__name__)
            raise SessionStoreUnavailable(f"Redis {what} failed: {type(exc).__name__}") from exc


class SharedState:
    """The Redis connection behind ``shared_state.kind: redis``: opened by :meth:`start`, checked, closed."""

    def __init__(self, config: SharedStateConfig) -> None:
        self.config = config
        self.client: Any = None

    async def start(self) -> None:
        """Connect and PING, so a wrong URL or a Redis that is down stops start-up with a clear message."""
        import redis.asyncio as redis
        from redis.exceptions import RedisError

        cfg = self.config
        # decode_responses: model names come back as str, as the policies compare them.
        client = redis.Redis.from_url(
            cfg.url, socket_timeout=cfg.timeout, socket_connect_timeout=cfg.timeout, decode_responses=True
        )
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
