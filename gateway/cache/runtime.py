"""The response cache as the proxy service uses it: look up before forwarding, store after answering.

:meth:`ResponseCache.lookup` runs once the plan is made and block and redact rules have run (it reads
the body as it would be forwarded). It returns ``None`` for a route without ``cache:``; otherwise a
:class:`CacheLookup` whose ``result`` is ``hit`` (serve :meth:`ResponseCache.serve`, no upstream
call), ``miss`` (forward; the answer is stored if it qualifies) or ``bypass`` (not cacheable: a
workflow, ``n`` > 1, a sampled request on a ``sampled: false`` route, a legacy completions request).
A store that fails (Redis down or slow) makes the request a miss that stores nothing, never an error.

Semantic mode embeds the last user turn with the routing encoder (the brain's :class:`BatchingEncoder`,
whose LRU cache serves repeats) and compares it with the bucket's items by dot product (unit vectors:
cosine similarity); a candidate must also have the same guard (numbers, the signs and units around them,
negations: :func:`gateway.cache.key.guard_tokens`) in its last turn. The best candidate whose entry is
still stored hits: an item can outlive its entry (evicted, expired), and such items are dropped when seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from prometheus_client import CollectorRegistry, Counter

from gateway.cache.entry import BucketItem, CachedAnswer, completion_from_stream, storable_completion
from gateway.cache.key import CacheKeys, bypass_reason, cache_keys, tenant_digest
from gateway.cache.memory import MemoryStore
from gateway.cache.redis import CacheUnavailable, RedisStore, connect, forget_tenant
from gateway.cache.replay import replay
from gateway.config import Config
from policies import Plan
from policies.config import CacheSettings

if TYPE_CHECKING:
    from classifiers.batching import BatchingEncoder
    from gateway.trace import RequestTrace
    from gateway.usage import SSEUsageScanner

log = logging.getLogger("pointsman.cache")
HEADER = b"x-pointsman-cache"
BACKEND = "cache"  # x-pointsman-backend (and the record's backend) of an answer served from the cache
_KEY_SHOWN = 12  # hex characters of the key in the decision record
# Semantic matches tried per lookup, best first, when the better ones' entries are gone: a few, so a scope
# whose best items all point nowhere costs a bounded lookup (those items are dropped as they are found).
_CANDIDATES = 4


@dataclass(slots=True)
class CacheLookup:
    """What the cache found for one request of a cached route."""

    route: str
    settings: CacheSettings
    result: str  # "hit" | "miss" | "bypass"
    model: str = ""  # the plan's chosen model (the scope's)
    keys: CacheKeys | None = None  # None: nothing will be stored (bypass, store unavailable)
    hit: CachedAnswer | None = None
    vector: np.ndarray | None = None  # the last turn's embedding (semantic), stored with the answer
    guard: str = ""  # keys.guard, computed once with the embedding and stored with it
    stream_storable: bool = True  # a streamed answer loses logprobs: not stored when they were asked
    info: dict[str, Any] = field(default_factory=dict)


class ResponseCache:
    """Every cached route's store, the encoder for semantic matching, and the cache's metrics."""

    def __init__(self, config: Config, registry: CollectorRegistry | None = None) -> None:
        self.routes: dict[str, CacheSettings] = {r.name: r.cache for r in config.routes if r.cache is not None}
        self._shared = config.shared_state
        self._stores: dict[str, MemoryStore | RedisStore] = {}
        if self._shared.kind == "memory":
            self._stores = {name: MemoryStore(s.max_entries, s.bucket_size) for name, s in self.routes.items()}
        self._client: Any = None
        self._encoder: Callable[[], BatchingEncoder | None] = lambda: None
        self._writes: set[asyncio.Task[None]] = set()
        self.requests = Counter(
            "pointsman_cache_requests", "Requests of cached routes by cache result (hit, miss, bypass, error).",
            ("route", "result"), registry=registry,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.routes)

    def set_encoder(self, encoder: Callable[[], BatchingEncoder | None]) -> None:
        """Where the routing encoder comes from (the brain loads it when a route's cache is semantic)."""
        self._encoder = encoder

    async def start(self) -> None:
        """Connect to Redis when the routes' entries live there. An unreachable Redis is logged, not fatal:
        the cache fails open (every request a miss) until it answers."""
        if not self.routes or self._shared.kind != "redis":
            return
        self._client = connect(self._shared.url, self._shared.timeout)
        for name, settings in self.routes.items():
            self._stores[name] = RedisStore(self._client, self._shared.key_prefix, settings.bucket_size)
        try:
            await asyncio.wait_for(self._client.ping(), max(self._shared.timeout, 1.0))
        except Exception as exc:  # any failure here means "not reachable yet"
            log.warning("response cache: Redis at shared_state.url is not reachable (%s); serving without the "
                        "cache until it is", type(exc).__name__)

    async def close(self) -> None:
        """Let writes in flight finish (briefly), then close the Redis client."""
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=1.0)
        for store in self._stores.values():
            await store.close()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # --- before forwarding -------------------------------------------------------------------------

    async def lookup(
        self, trace: RequestTrace, plan: Plan, endpoint: str, body: Mapping[str, Any]
    ) -> CacheLookup | None:
        """Look the request up (None: its route has no cache). Fills ``trace.decision["cache"]``."""
        route = trace.route
        settings = self.routes.get(route) if route is not None else None
        if settings is None or route is None:
            return None
        started = time.perf_counter()
        model = plan.candidates[0] if plan.candidates else ""
        lookup = CacheLookup(route=route, settings=settings, result="bypass", model=model)
        reason = ("endpoint" if endpoint != "chat.completions" else "workflow" if plan.workflow is not None
                  else bypass_reason(body, settings))
        keys: CacheKeys | None = None
        if reason is None:
            try:
                keys = cache_keys(tenant=trace.tenant, route=route, model=model, endpoint=endpoint, body=body,
                                  settings=settings, encoder=self._encoder_id(settings))
            except (TypeError, orjson.JSONEncodeError):
                reason = "unhashable"
        if keys is None:
            return self._done(lookup, trace, started, {"reason": reason})
        store = self._stores[route]
        lookup.stream_storable = not body.get("logprobs")
        info: dict[str, Any] = {"key": keys.exact[:_KEY_SHOWN]}
        try:
            hit, items = await store.lookup(keys)
            match, similarity = "exact", 1.0
            if hit is None and keys.bucket is not None and keys.text is not None:
                lookup.vector, lookup.guard = await self._embed(keys.text), keys.guard
                ranked = self._nearest(items, lookup.vector, lookup.guard, settings)
                found = await store.first_live(keys, [item.key for item, _ in ranked]) if ranked else None
                if found is not None:
                    position, hit = found
                    match, similarity = "semantic", ranked[position][1]
        except CacheUnavailable:
            lookup.result = "error"
            return self._done(lookup, trace, started, {**info, "error": "unavailable"})
        lookup.keys = keys
        if hit is None:
            lookup.result = "miss"
            return self._done(lookup, trace, started, info)
        lookup.result, lookup.hit = "hit", hit
        age = max(time.time() - hit.created_at, 0.0)
        info.update(match=match, similarity=round(similarity, 4), age_s=round(age, 3))
        return self._done(lookup, trace, started, info)

    def _done(self, lookup: CacheLookup, trace: RequestTrace, started: float, info: dict[str, Any]) -> CacheLookup:
        lookup.info = {"hit": lookup.result == "hit", "result": "miss" if lookup.result == "error" else lookup.result,
                       **info, "lookup_ms": round((time.perf_counter() - started) * 1000.0, 3)}
        trace.decision["cache"] = lookup.info
        self.requests.labels(lookup.route, lookup.result).inc()
        return lookup

    def _encoder_id(self, settings: CacheSettings) -> str:
        if settings.mode != "semantic":
            return ""
        encoder = self._encoder()
        return "" if encoder is None else encoder.id

    async def _embed(self, text: str) -> np.ndarray | None:
        encoder = self._encoder()
        if encoder is None:
            return None
        try:
            return await encoder.encode(text)
        except Exception:  # semantic matching is best effort: the request goes on as an exact lookup
            log.exception("response cache: could not embed a last user turn")
            return None

    @staticmethod
    def _nearest(
        items: list[BucketItem], vector: np.ndarray | None, guard: str, settings: CacheSettings
    ) -> list[tuple[BucketItem, float]]:
        """The items at or above ``similarity`` with the same guard, best first, at most ``_CANDIDATES``
        (one per exact key): the best one's entry may be gone (evicted, expired) while its item is not."""
        if vector is None or not items:
            return []
        oldest = time.time() - settings.ttl
        live = [it for it in items if it.guard == guard and it.created_at > oldest
                and it.vector.shape == vector.shape]
        if not live:
            return []
        scores = np.stack([it.vector for it in live]) @ vector
        ranked: list[tuple[BucketItem, float]] = []
        seen: set[str] = set()
        for index in np.argsort(-scores, kind="stable"):
            item, score = live[int(index)], float(scores[int(index)])
            if score < settings.similarity or len(ranked) == _CANDIDATES:
                break
            if item.key not in seen:
                seen.add(item.key)
                ranked.append((item, score))
        return ranked

    # --- a hit ---------------------------------------------------------------------------------------

    def serve(self, lookup: CacheLookup, trace: RequestTrace, body: Mapping[str, Any]) -> tuple[bytes, str]:
        """The hit's response bytes and content type; fills the trace (no tokens, no cost: no upstream call)."""
        assert lookup.hit is not None
        trace.model, trace.backend = lookup.hit.model, BACKEND
        trace.status, trace.outcome = 200, "ok"
        trace.prompt_tokens = trace.completion_tokens = 0
        trace.cost_usd = 0.0
        trace.compared = False  # a replayed answer is not compared with the other candidates
        return replay(lookup.hit, trace.request_id, body)

    # --- after a miss --------------------------------------------------------------------------------

    def completed(self, lookup: CacheLookup, trace: RequestTrace, answer: bytes) -> None:
        """A non-streamed answer was served: store it if it qualifies."""
        if not self._storable(lookup, trace):
            return
        completion = storable_completion(answer)
        if completion is not None:
            self._put(lookup, trace, completion)

    def stream_finisher(
        self, lookup: CacheLookup, on_done: Callable[[RequestTrace, SSEUsageScanner], None]
    ) -> Callable[[RequestTrace, SSEUsageScanner], None]:
        """``on_done`` for a streamed answer, followed by storing the answer if the stream was complete."""

        def finished(trace: RequestTrace, scanner: SSEUsageScanner) -> None:
            on_done(trace, scanner)
            if (
                lookup.stream_storable and self._storable(lookup, trace) and scanner.saw_done
                and scanner.finish_reason == "stop" and not scanner.other_deltas and scanner.text is not None
            ):
                completion = completion_from_stream(
                    text=scanner.text, model=trace.model or lookup.model,
                    usage=(scanner.prompt_tokens, scanner.completion_tokens),
                )
                self._put(lookup, trace, completion)

        return finished

    @staticmethod
    def _storable(lookup: CacheLookup, trace: RequestTrace) -> bool:
        # Only the chosen model's own answer: a fallback's answer is not the scope's.
        return (
            lookup.result == "miss" and lookup.keys is not None and trace.status == 200
            and trace.outcome == "ok" and trace.model == lookup.model
        )

    def _put(self, lookup: CacheLookup, trace: RequestTrace, completion: dict[str, Any]) -> None:
        keys, settings = lookup.keys, lookup.settings
        assert keys is not None
        now = time.time()
        answer = CachedAnswer(completion=completion, model=trace.model or lookup.model, created_at=now,
                              text=keys.text if settings.store_text else None)
        item = None
        if keys.bucket is not None and lookup.vector is not None:
            item = BucketItem(key=keys.exact, created_at=now, guard=lookup.guard, vector=lookup.vector)
        store = self._stores[lookup.route]
        if isinstance(store, MemoryStore):
            store.put_now(keys, answer, item, settings.ttl)
            return
        task = asyncio.ensure_future(self._write(store, keys, answer, item, settings.ttl, trace.created_at))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    @staticmethod
    async def _write(store: RedisStore, keys: CacheKeys, answer: CachedAnswer, item: BucketItem | None,
                     ttl: float, issued_at: float) -> None:
        with contextlib.suppress(CacheUnavailable):  # logged by the store; the answer is simply not cached
            await store.put(keys, answer, item, ttl, issued_at=issued_at)

    # --- forgetting ----------------------------------------------------------------------------------

    async def forget_tenant(self, tenant: str | None) -> int:
        """Delete a tenant's entries from every store (this process's memory, or Redis); the count."""
        if self._client is not None:
            return await forget_tenant(self._client, self._shared.key_prefix, tenant)
        digest = tenant_digest(tenant)
        return sum(store.forget_tenant(digest) for store in self._stores.values() if isinstance(store, MemoryStore))


def cache_headers(decision: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
    """``x-pointsman-cache: hit | miss | bypass`` for a request of a cached route (nothing otherwise)."""
    info = decision.get("cache")
    if not isinstance(info, Mapping):
        return []
    return [(HEADER, str(info.get("result", "miss")).encode())]
