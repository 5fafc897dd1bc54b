"""Prometheus metrics, on a registry owned by one app instance (no module-level globals)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.pool import BackendPool
from policies.brain import ActiveRouter

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class Metrics:
    """Every metric the gateway exports, labelled by route, model and backend where it applies."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("route", "model", "backend")
        # status is the HTTP status the client got; a stream has sent its 200 before it can break, so
        # outcome (the decision record's: ok, error, client_disconnected, stream_error) says how it
        # ended. Both are closed sets: a bounded number of series per route, model and backend.
        self.requests = Counter(
            "pointsman_requests", "Requests answered, by HTTP status sent and outcome: ok, error, "
            "client_disconnected, or stream_error (a stream that broke after its 200).",
            (*labels, "status", "outcome"), registry=self.registry,
        )
        # By outcome too: a stream that broke or lost its client ends early, and mixed in with the answered
        # ones it pulled the latency quantiles down just when things went wrong.
        self.latency = Histogram(
            "pointsman_request_duration_seconds", "Time from request to the last byte, by outcome (as "
            "pointsman_requests_total's).", (*labels, "outcome"), buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.ttft = Histogram(
            "pointsman_time_to_first_token_seconds", "Time to the first streamed chunk.", labels,
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.overhead = Histogram(
            "pointsman_gateway_overhead_seconds", "Time spent in the gateway itself, upstream excluded.",
            ("route",), buckets=_OVERHEAD_BUCKETS, registry=self.registry,
        )
        self.tokens = Counter(
            "pointsman_tokens", "Tokens reported by upstreams.", (*labels, "kind"), registry=self.registry
        )
        self.cost = Counter("pointsman_cost_usd", "Cost in USD from configured prices.", labels,
                            registry=self.registry)
        self.upstream_errors = Counter(
            "pointsman_upstream_errors", "Failed upstream attempts, by kind.", ("backend", "model", "kind"),
            registry=self.registry,
        )
        self.retries = Counter("pointsman_retries", "Retries of the same model.", ("backend", "model"),
                               registry=self.registry)
        self.fallbacks = Counter(
            "pointsman_fallbacks", "Moves to a fallback model.", ("route", "from_model", "to_model"),
            registry=self.registry,
        )
        self.in_flight = Gauge("pointsman_in_flight_requests", "Requests being served.", registry=self.registry)
        # Workflows (gateway/workflows): their sub-calls' tokens and cost also go to pointsman_tokens and
        # pointsman_cost_usd, labelled with the model each sub-call used.
        self.workflow_runs = Counter(
            "pointsman_workflow_runs", "Workflow runs by outcome: answered, capped, degraded, failed, cancelled.",
            ("workflow", "outcome"), registry=self.registry,
        )
        self.workflow_steps = Counter(
            "pointsman_workflow_steps", "Workflow sub-calls by workflow, step, model and outcome.",
            ("workflow", "step", "model", "outcome"), registry=self.registry,
        )
        self.workflow_escalations = Counter(
            "pointsman_workflow_escalations", "Cascade escalations, by workflow and the stage escalated to.",
            ("workflow", "to_stage"), registry=self.registry,
        )
        self.workflow_caps = Counter(
            "pointsman_workflow_caps_hit", "Workflow runs that reached a cap (they end with their best answer so far).",
            ("workflow", "cap"), registry=self.registry,
        )
        self.workflow_subcalls = Gauge(
            "pointsman_workflow_subcalls", "Workflow sub-calls holding (in_flight) or waiting for (waiting) one of "
            "the process's workflow_limits.max_concurrent_subcalls slots.", ("state",), registry=self.registry,
        )

        # Experiments (gateway/experiments): served requests per arm, and guardrail stops (counted by the
        # replica that stored the stop, so a sum over replicas is the number of stops).
        self.experiment_requests = Counter(
            "pointsman_experiment_requests", "Requests served in an experiment, by experiment and serving arm.",
            ("experiment", "arm"), registry=self.registry,
        )
        self.experiment_stops = Counter(
            "pointsman_experiment_arm_stops", "Experiment arms stopped by a guardrail (error_rate, cost, latency_p95).",
            ("experiment", "arm", "guardrail"), registry=self.registry,
        )

        # Rate limits and spend budgets (gateway/quota), and the shared state (Redis) behind them.
        self.quota_refused = Counter(
            "pointsman_quota_refused", "Requests refused by a rate limit or budget (429), or because the shared "
            "state was unavailable and its feature fails closed (503), by requested model and reason.",
            ("route", "reason"), registry=self.registry,
        )
        self.shared_state_unavailable = Counter(
            "pointsman_shared_state_unavailable", "Shared-state (Redis) calls that failed, by feature; the feature "
            "then applies shared_state.fail.", ("feature",), registry=self.registry,
        )

        # The children every finished request updates, looked up through a cache by label values:
        # labels() checks its values and takes the metric's lock on every call (~1.5 us, up to six per
        # request). A child is still made on its first use only, and there are as many as the metrics'
        # own (one per configured route, model, backend and status or kind).
        self.requests_child = functools.cache(self.requests.labels)
        self.latency_child = functools.cache(self.latency.labels)
        self.overhead_child = functools.cache(self.overhead.labels)
        self.ttft_child = functools.cache(self.ttft.labels)
        self.tokens_child = functools.cache(self.tokens.labels)
        self.cost_child = functools.cache(self.cost.labels)

    def watch_pool(self, pool: BackendPool) -> None:
        """Export breaker state and ejections, health and outstanding requests per replica at scrape time."""
        self.registry.register(_PoolCollector(pool))

    def watch_router(self, router: ActiveRouter) -> None:
        """Export the active router version (``pointsman_router_info``) and hot reloads at scrape time."""
        self.registry.register(_RouterCollector(router))

    def watch(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """Export a level read at scrape time, as a gauge (e.g. the decision log's queue depth)."""
        self.registry.register(_CallbackCollector(name, documentation, read, GaugeMetricFamily))

    def watch_count(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """Export a count read at scrape time that only goes up since start, as a counter: its sample
        is ``<name>_total``, so rate() and increase() apply and a restart reads as a counter reset."""
        self.registry.register(_CallbackCollector(name, documentation, read, CounterMetricFamily))

    def watch_attributes(self, source: object, exported: Mapping[str, tuple[str, str]]) -> None:
        """Export numeric attributes of ``source`` that go up and down, read at scrape time, as gauges:
        ``{metric: (attribute, help)}``."""
        for name, (attribute, documentation) in exported.items():
            self.watch(name, documentation, functools.partial(_read_number, source, attribute))

    def watch_counts(self, source: object, exported: Mapping[str, tuple[str, str]]) -> None:
        """Export numeric attributes of ``source`` that only go up, read at scrape time, as counters
        (:meth:`watch_count`): ``{metric: (attribute, help)}``."""
        for name, (attribute, documentation) in exported.items():
            self.watch_count(name, documentation, functools.partial(_read_number, source, attribute))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PoolCollector(Collector):
    def __init__(self, pool: BackendPool) -> None:
        self._pool = pool

    def collect(self) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "pointsman_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open (replica ejected).",
            labels=("backend", "replica"),
        )
        ejections = CounterMetricFamily(
            "pointsman_breaker_ejections",
            "Replica ejections by reason: transport (consecutive failures) or error_rate (5xx share).",
            labels=("backend", "replica", "reason"),
        )
        healthy = GaugeMetricFamily(
            "pointsman_replica_healthy", "1 when the replica passes health checks.", labels=("backend", "replica")
        )
        outstanding = GaugeMetricFamily(
            "pointsman_replica_outstanding", "Requests in flight to the replica.", labels=("backend", "replica")
        )
        tokens = GaugeMetricFamily(
            "pointsman_replica_tokens_in_flight",
            "Estimated uncached prompt + expected output tokens of the requests in flight to the replica.",
            labels=("backend", "replica"),
        )
        engine = GaugeMetricFamily(
            "pointsman_replica_engine_external_load",
            "Requests the engine reports running or waiting beyond this gateway's own (engine metrics).",
            labels=("backend", "replica"),
        )
        kv_usage = GaugeMetricFamily(
            "pointsman_replica_kv_cache_usage", "The engine's KV-cache usage, 0..1 (engine metrics).",
            labels=("backend", "replica"),
        )
        for replica in self._pool.replicas():
            key = (replica.backend.name, replica.base_url)
            state.add_metric(key, int(replica.breaker.state))
            for reason in ("transport", "error_rate"):
                ejections.add_metric((*key, reason), replica.breaker.ejections[reason])
            healthy.add_metric(key, 1.0 if replica.healthy else 0.0)
            outstanding.add_metric(key, replica.outstanding)
            tokens.add_metric(key, replica.tokens_in_flight)
            engine.add_metric(key, replica.external_load)
            if replica.kv_cache_usage is not None:
                kv_usage.add_metric(key, replica.kv_cache_usage)
        choices = CounterMetricFamily(
            "pointsman_replica_choices",
            "Replica placements by balancing policy and reason (load, prefix, imbalance, session, in_turn).",
            labels=("backend", "policy", "reason"),
        )
        entries = GaugeMetricFamily(
            "pointsman_replica_affinity_entries", "Prefix blocks or sessions the backend's balancing remembers.",
            labels=("backend",),
        )
        for backend in self._pool.backends:
            for reason, count in backend.choices.items():
                choices.add_metric((backend.name, backend.policy.name, reason), count)
            entries.add_metric((backend.name,), backend.policy.remembered())
        yield from (state, ejections, healthy, outstanding, tokens, engine, kv_usage, choices, entries)


class _RouterCollector(Collector):
    def __init__(self, router: ActiveRouter) -> None:
        self._router = router

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "pointsman_router_info", "The router version deciding new requests (label version; value 1).",
            labels=("version",),
        )
        info.add_metric((self._router.version,), 1.0)
        reloads = CounterMetricFamily(
            "pointsman_router_reloads",
            "Hot reloads of the router registry's active version: ok (swapped in) or failed (old one kept).",
            labels=("result",),
        )
        reloads.add_metric(("ok",), self._router.reloads)
        reloads.add_metric(("failed",), self._router.reload_failures)
        yield from (info, reloads)


class _CallbackCollector(Collector):
    def __init__(
        self, name: str, documentation: str, read: Callable[[], float],
        family: type[GaugeMetricFamily] | type[CounterMetricFamily],
    ) -> None:
        self._name, self._documentation, self._read, self._family = name, documentation, read, family

    def collect(self) -> Iterable[Metric]:
        family = self._family(self._name, self._documentation)
        family.add_metric((), self._read())
        yield family


def _read_number(source: object, attribute: str) -> float:
    return float(getattr(source, attribute))
