"""The backend pool: models → backends → replicas, with load balancing and health state.

Replica choice is least-outstanding-requests among replicas that are healthy, whose breaker lets
traffic through and that are under their concurrency limit; ties are broken round-robin so equal
replicas share load evenly.

Each replica's breaker (:mod:`gateway.breaker`) may eject it for a high 5xx rate only while another
replica of the same backend is serving (healthy, breaker closed): the last one stays in.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.breaker import BreakerState, CircuitBreaker
from gateway.config import BackendConfig, BreakerConfig, ModelConfig


@dataclass(slots=True, eq=False)
class Replica:
    """One base URL of a backend and its live state."""

    backend: Backend
    base_url: str
    breaker: CircuitBreaker
    outstanding: int = 0
    healthy: bool = True
    consecutive_health_failures: int = 0
    consecutive_health_successes: int = 0


@dataclass(slots=True, eq=False)
class Backend:
    """An upstream serving some models over one or more replicas."""

    config: BackendConfig
    replicas: list[Replica] = field(default_factory=list)
    auth_header: str | None = None
    _rr: itertools.count = field(default_factory=itertools.count)

    @property
    def name(self) -> str:
        return self.config.name

    def pick(self, exclude: Iterable[Replica] = ()) -> Replica | None:
        """The least-loaded usable replica, preferring ones not in ``exclude``; None if none is usable."""
        excluded = set(exclude)
        limit = self.config.max_concurrency
        usable = [r for r in self.replicas if r.healthy and r.outstanding < limit and r.breaker.available()]
        if not usable:
            return None
        fresh = [r for r in usable if r not in excluded] or usable
        least = min(r.outstanding for r in fresh)
        tied = [r for r in fresh if r.outstanding == least]
        return tied[next(self._rr) % len(tied)] if len(tied) > 1 else tied[0]

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
                config=config, auth_header=f"Bearer {config.api_key}" if config.api_key else None
            )
            backend.replicas = [_replica(backend, url, breaker) for url in config.replica_urls]
            self.backends.append(backend)
            for model in config.models:
                self.models[model.name] = ModelTarget(model=model, backend=backend)

    def get(self, model: str) -> ModelTarget | None:
        return self.models.get(model)

    def replicas(self) -> Iterable[Replica]:
        for backend in self.backends:
            yield from backend.replicas


def _replica(backend: Backend, url: str, config: BreakerConfig) -> Replica:
    breaker = CircuitBreaker(
        config.failure_threshold,
        config.cooldown,
        window=config.window,
        min_requests=config.min_requests,
        failure_rate=config.failure_rate,
        name=f"{url} of backend {backend.name!r}",
    )
    replica = Replica(backend=backend, base_url=url, breaker=breaker)
    breaker.may_eject_for_errors = functools.partial(backend.others_serving, replica)
    return replica
