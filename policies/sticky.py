"""Session stickiness: where a conversation's model is kept, and how a request names its conversation.

:class:`StickySessions` keeps sessions in this process (TTL + LRU); a :class:`SessionStore` kept
elsewhere (``gateway/shared_state.py``: Redis) lets many gateway replicas keep one conversation on one
model. Policies use only the coroutines of :class:`SessionStore`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from classifiers.messages import SYSTEM_ROLES, iter_messages, message_list
from policies.context import RequestContext

SESSION_HEADER = "x-pointsman-session-id"
_PREFIX_ROLES = SYSTEM_ROLES | {"user"}


class SessionStoreUnavailable(Exception):
    """A shared session store could not answer; the policy decides without stickiness this time."""


@runtime_checkable
class SessionStore(Protocol):
    """``session key -> model`` with a time-to-live renewed on use."""

    async def lookup(self, key: str) -> str | None:
        """The session's model, or ``None`` if unknown or expired; its TTL is left as it is
        (``POST /v1/route`` explains a decision without extending the session).

        Raises:
            SessionStoreUnavailable: the store could not be asked.
        """
        ...

    async def claim(self, key: str, model: str) -> str | None:
        """Renew the session's TTL and return its model; a session not yet known is pinned to
        ``model`` in the same step (and ``None`` returned). One round trip for a shared store.

        Raises:
            SessionStoreUnavailable: the store could not be asked.
        """
        ...

    async def pin(self, key: str, model: str) -> None:
        """Keep the session on ``model`` (TTL restarts).

        Raises:
            SessionStoreUnavailable: the store could not be written.
        """
        ...


class StickySessions:
    """``session key -> model``; entries expire ``ttl`` seconds after their last use.

    At most ``max_sessions`` entries are kept: the least recently used goes first. One instance
    per route, used from the event loop only (no locking needed). Keys are kept as their SHA-256
    digest: a session id is whatever a client sends (a header of 100 kB is accepted), and
    ``max_sessions`` of those would otherwise hold gigabytes.
    """

    def __init__(self, ttl: float, max_sessions: int, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0 or max_sessions < 1:
            raise ValueError("ttl must be > 0 and max_sessions >= 1")
        self.ttl = ttl
        self.max_sessions = max_sessions
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, *, touch: bool = True) -> str | None:
        """The session's model, or ``None`` if unknown or expired. ``touch`` renews its TTL."""
        return self._get(_digest(key), touch)

    def put(self, key: str, model: str) -> None:
        """Pin the session to ``model`` (evicting the least recently used session if full)."""
        self._put(_digest(key), model)

    def _get(self, digest: bytes, touch: bool) -> str | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        model, expires = entry
        now = self._clock()
        if expires <= now:
            del self._entries[digest]
            return None
        if touch:
            self._entries[digest] = (model, now + self.ttl)
            self._entries.move_to_end(digest)
        return model

    def _put(self, digest: bytes, model: str) -> None:
        self._entries[digest] = (model, self._clock() + self.ttl)
        self._entries.move_to_end(digest)
        while len(self._entries) > self.max_sessions:
            self._entries.popitem(last=False)

    async def lookup(self, key: str) -> str | None:
        """:class:`SessionStore` form of :meth:`get` without renewal (never unavailable)."""
        return self.get(key, touch=False)

    async def claim(self, key: str, model: str) -> str | None:
        """:class:`SessionStore`: the session's model (TTL renewed), else pin ``model`` and return ``None``."""
        digest = _digest(key)
        prior = self._get(digest, touch=True)
        if prior is None:
            self._put(digest, model)
        return prior

    async def pin(self, key: str, model: str) -> None:
        """:class:`SessionStore` form of :meth:`put`."""
        self.put(key, model)


def session_key(ctx: RequestContext) -> tuple[str, str]:
    """The session key of a request and where it came from (``header`` or ``prefix``).

    The ``x-pointsman-session-id`` header wins; otherwise the conversation prefix — system
    prompt(s) plus the first user message — identifies the conversation, since every later turn
    repeats it. Keys are scoped by route and tenant so tenants never share sessions.
    """
    scope = f"{ctx.route}\x00{ctx.tenant or ''}\x00"
    session = ctx.session_id or _header(ctx.headers, SESSION_HEADER)
    if session:
        return scope + "id\x00" + session, "header"
    prefix = conversation_start(ctx.body)
    digest = hashlib.sha256(json.dumps(prefix, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return scope + "prefix\x00" + digest, "prefix"


def conversation_start(body: Mapping[str, Any]) -> list[Any]:
    """What identifies a conversation without a session id: ``[role, content]`` of the system/developer
    messages up to the first user message, and of it (content as given: images and all); a legacy
    completions request's prompt."""
    if message_list(body) is None:
        return [body.get("prompt")]
    prefix: list[Any] = []
    for _, role, message in iter_messages(body, _PREFIX_ROLES):
        prefix.append([role, message.get("content")])
        if role == "user":
            break
    return prefix


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value
