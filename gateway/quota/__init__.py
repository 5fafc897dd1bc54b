"""Rate limits and spend budgets, kept in this process or shared by every replica through Redis.

``Quotas`` (what the proxy service calls) over a ``QuotaStore``: ``MemoryQuotaStore`` (default) or
``RedisQuotaStore`` (``shared_state.kind: redis``; one round trip per request).
"""

from gateway.quota._types import Bucket, Correction, QuotaStore, QuotaUnavailable, Spend, Verdict
from gateway.quota.build import build_quotas
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.quotas import Hold, Quotas
from gateway.quota.redis_store import RedisQuotaStore

__all__ = [
    "Bucket", "Correction", "Hold", "MemoryQuotaStore", "QuotaStore", "QuotaUnavailable", "Quotas",
    "RedisQuotaStore", "Spend", "Verdict", "build_quotas",
]
