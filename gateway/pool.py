"""The backend pool: models → backends → replicas, with load balancing and health state.

A replica is usable when it is healthy, its breaker lets traffic through and it is under its
concurrency limit. Among usable replicas the backend's ``balancing.policy`` chooses
(:mod:`gateway.balancing`): least outstanding requests by default (ties in turn, so equal replicas
share load evenly), or session / prefix-cache affinity with bounded imbalance. A replica that fails
its health checks or is ejected by its breaker loses its affinity at once (:meth:`Backend.lost`).

Each replica's breaker (:mod:`gateway.breaker`) may eject it for a high 5xx rate only while another
replica of the same backend is serving (healthy, breaker closed): the last one stays in.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from gateway.balancing import Affinity, Choice, ReplicaPolicy, make_policy
from gateway.balancing.hints import ReplicaHints
from gateway.breaker import BreakerState, CircuitBreaker
from gateway.config import BackendConfig, BalancingConfig, BreakerConfig, ModelConfig
from gateway.http1 import without_credentials

_NO_AFFINITY = Affinity()


@dataclass(slots=True, eq=False)
class Replica:
    """One base URL of a backend and its live state."""

    backend: Backend
    base_url: str  # the configured URL without user:password@: what logs, metrics and records show
    breaker: CircuitBreaker
    request_url: str  # the configured URL, credentials included: for sending only, never shown
    slot: int = 0  # position in the backend's replica list (its bit in the prefix index)
    outstanding: int = 0
    tokens_in_flight: int = 0  # estimated uncached prompt + output tokens of the requests in flight
    external_load: float = 0.0  # requests the engine reports beyond this gateway's own (engine metrics)
    kv_cache_usage: float | None = None  # the engine's KV-cache usage (0..1) when it reports one
    healthy: bool = True
    consecutive_health_failures: int = 0
    consecutive_health_successes: int = 0


@dataclass(slots=True, eq=False)
class Backend:
    """An upstream serving some models over one or more replicas."""

    config: BackendConfig
    replicas: list[Replica] = field(default_factory=list)
    auth_header: str | None = None
    policy: ReplicaPolicy = field(default_factory=lambda: make_policy("least_outstanding"))
    hints: ReplicaHints | None = None  # placements shared with peer gateways (balancing.share_hints)
    choices: dict[str, int] = field(default_factory=dict)  # placements by reason (load, prefix, ...)

    @property
    def name(self) -> str:
        return self.config.name

    def choose(self, exclude: Iterable[Replica] = (), affinity: Affinity = _NO_AFFINITY) -> Choice | None:
        """The balancing policy's pick among usable replicas, preferring ones not in ``exclude`` (a
        retry goes elsewhere when it can); None if no replica is usable."""
        limit = self.config.max_concurrency
        usable = [r for r in self.replicas if r.healthy and r.outstanding < limit and r.breaker.available()]
        if not usable:
            return None
        if exclude:
            excluded = set(exclude)
            usable = [r for r in usable if r not in excluded] or usable
        return self.policy.choose(usable, affinity)

    def pick(self, exclude: Iterable[Replica] = (), affinity: Affinity = _NO_AFFINITY) -> Replica | None:
        """The chosen replica (see :meth:`choose`), or None if none is usable."""
        choice = self.choose(exclude, affinity)
        return None if choice is None else cast(Replica, choice.replica)

    def placed(self, choice: Choice, affinity: Affinity) -> None:
        """The request goes to ``choice``: the policy remembers it and peers hear of it."""
        self.policy.served(choice, affinity)
        self.choices[choice.reason] = self.choices.get(choice.reason, 0) + 1
        if self.hints is not None:
            key = self.policy.hint_key(choice, affinity)
            if key is not None:
                self.hints.publish(self, key, cast(Replica, choice.replica).base_url)

    def lost(self, replica: Replica) -> None:
        """``replica`` went down or was ejected: its sessions and cached prefixes re-balance at once."""
        self.policy.forget(replica.slot)

    def others_serving(self, replica: Replica) -> bool:
        """Whether a replica other than ``replica`` is healthy with its breaker closed."""
        return any(
            r is not replica and r.healthy and r.breaker.state is BreakerState.CLOSED for r in self.replicas
        )

    def saturated(self) -> bool:
        """True when healthy, breaker-closed replicas exist but all are at max concurrency."""
        limit = self.config.max_concurrency
        live = [r for r in self.replicas if r.healthy and r.breaker.available()]
        return bool(live) and all(r.outstanding >= limit for r in live)


@dataclass(slots=True, frozen=True)
class ModelTarget:
    """A concrete model and the backend that serves it."""

    model: ModelConfig
    backend: Backend

    @property
    def name(self) -> str:
        return self.model.name


class BackendPool:
    """All configured backends, indexed by the models they serve."""

    def __init__(self, backends: Iterable[BackendConfig], breaker: BreakerConfig) -> None:
        self.backends: list[Backend] = []
        self.models: dict[str, ModelTarget] = {}
        for config in backends:
            backend = Backend(
                config=config, auth_header=f"Bearer {config.api_key}" if config.api_key else None,
                policy=replica_policy(config.balancing),
            )
            backend.replicas = [
                _replica(backend, slot, url, breaker) for slot, url in enumerate(config.replica_urls)
            ]
            self.backends.append(backend)
            for model in config.models:
                self.models[model.name] = ModelTarget(model=model, backend=backend)

    def get(self, model: str) -> ModelTarget | None:
        return self.models.get(model)

    def replicas(self) -> Iterable[Replica]:
        for backend in self.backends:
            yield from backend.replicas


def replica_policy(config: BalancingConfig) -> ReplicaPolicy:
    """The replica policy a backend's ``balancing`` section describes."""
    return make_policy(
        config.policy, load=config.load, balance_abs=config.balance_abs, balance_rel=config.balance_rel,
        max_entries=config.max_entries, ttl=config.ttl,
    )


def _replica(backend: Backend, slot: int, url: str, config: BreakerConfig) -> Replica:
    shown = without_credentials(url)
    breaker = CircuitBreaker(
        config.failure_threshold,
        config.cooldown,
        window=config.window,
        min_requests=config.min_requests,
        failure_rate=config.failure_rate,
        name=f"{shown} of backend {backend.name!r}",
    )
    replica = Replica(backend=backend, base_url=shown, breaker=breaker, slot=slot, request_url=url)
    breaker.may_eject_for_errors = functools.partial(backend.others_serving, replica)
    breaker.on_trip = functools.partial(backend.lost, replica)
    return replica

