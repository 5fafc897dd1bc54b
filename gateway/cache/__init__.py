"""The opt-in response cache of a route (``routes.<name>.cache``): exact and semantic lookup.

Modules: :mod:`~gateway.cache.key` (the scope, as digests), :mod:`~gateway.cache.entry` (what is
stored and which answers qualify), :mod:`~gateway.cache.memory` and :mod:`~gateway.cache.redis` (the
stores; Redis errors are translated there), :mod:`~gateway.cache.replay` (a hit as JSON or SSE) and
:mod:`~gateway.cache.runtime` (lookup and store, as the proxy service calls them).
"""

from gateway.cache.entry import CachedAnswer
from gateway.cache.key import CacheKeys, cache_keys
from gateway.cache.redis import CacheUnavailable
from gateway.cache.runtime import BACKEND, HEADER, CacheLookup, ResponseCache, cache_headers

__all__ = [
    "BACKEND",
    "HEADER",
    "CacheKeys",
    "CacheLookup",
    "CacheUnavailable",
    "CachedAnswer",
    "ResponseCache",
    "cache_headers",
    "cache_keys",
]
