"""Replica choice inside a backend: load, session affinity and KV-cache (prefix) affinity.

:mod:`~gateway.balancing.prefix` hashes a conversation into chained blocks, :mod:`~gateway.balancing.index`
remembers which replicas saw which blocks, :mod:`~gateway.balancing.select` holds the policies (used by
the gateway and by ``bench/agent_replicas.py`` alike), :mod:`~gateway.balancing.hints` shares placements
between gateways through Redis, and :mod:`~gateway.balancing.engine_load` reads engines' own load.
"""

from gateway.balancing.prefix import PrefixBlocks, prefix_blocks, tenant_seed
from gateway.balancing.request import affinity_of, session_hash
from gateway.balancing.select import (
    Affinity,
    CacheAware,
    Choice,
    LeastOutstanding,
    ReplicaLoad,
    ReplicaPolicy,
    RoundRobin,
    SessionAffinity,
    make_policy,
)

__all__ = [
    "Affinity",
    "CacheAware",
    "Choice",
    "LeastOutstanding",
    "PrefixBlocks",
    "ReplicaLoad",
    "ReplicaPolicy",
    "RoundRobin",
    "SessionAffinity",
    "affinity_of",
    "make_policy",
    "prefix_blocks",
    "session_hash",
    "tenant_seed",
]
