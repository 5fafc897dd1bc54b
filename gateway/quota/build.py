"""Build the gateway's :class:`Quotas` from its config: in memory, or over the shared Redis connection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config import Config, ModelConfig
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.quotas import SETTLE_BATCH_S, Quotas
from gateway.quota.redis_store import RedisQuotaStore
from gateway.shared_state import SharedState


def build_quotas(
    config: Config, shared: SharedState | None, models: Mapping[str, ModelConfig], metrics: Any = None
) -> Quotas | None:
    """The quotas of ``config`` (``None`` when it has no limit or budget). With ``shared_state.kind: redis``,
    ``shared`` is the started connection (:class:`gateway.routing.RoutingBrain` opens it)."""
    if not Quotas.configured(config):
        return None
    if config.shared_state.kind == "memory":
        return Quotas(config, MemoryQuotaStore(), models, metrics)
    if shared is None or shared.client is None:
        raise RuntimeError("shared_state is redis but its connection was not started")
    return Quotas(config, RedisQuotaStore(shared.client), models, metrics, settle_batch_s=SETTLE_BATCH_S)
