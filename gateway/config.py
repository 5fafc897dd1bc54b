"""Configuration: one YAML file, validated at start-up.

``${ENV}`` and ``${ENV:-default}`` are substituted inside string values (after YAML parsing, so
quoting is never disturbed). A missing variable without a default is an error naming the key.
Validation errors name the dotted key path (``backends.0.timeouts.connect``) and say what is wrong.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from gateway.balancing.select import DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL
from gateway.errors import ConfigError
from policies.brain import config as _routing
from policies.brain.config import (  # the routing sections' schema, shared with offline replay
    ClassifiersConfig,
    LocalModelConfig,
    ModelConfig,
    RoutingConfig,
    RoutingConfigError,
    model_infos,
    route_problems,
)
from policies.config import RouteConfig
from policies.experiments.config import ExperimentConfig, experiment_problems
from policies.strict_model import StrictModel
from policies.textfile import NotUtf8, read_utf8
from policies.validation import shadowed_guards
from policies.workflows import WorkflowConfig, WorkflowLimits, workflow_models, workflow_problems
from policies.yaml_file import load_yaml

_log = logging.getLogger("pointsman.config")
_YEAR = 365 * 24 * 3600.0  # the longest a replica-affinity entry may be remembered
#: The name of the backend the embedded local model is served as (``local_model.enabled``).
LOCAL_BACKEND = "local"


_Strict = StrictModel  # unknown keys, non-finite numbers and bools-for-numbers are errors


class Timeouts(_Strict):
    """Upstream timeouts in seconds. ``idle`` bounds the silence between two streamed chunks."""

    connect: float = Field(default=5.0, gt=0)
    first_byte: float = Field(default=60.0, gt=0)
    total: float = Field(default=600.0, gt=0)
    idle: float = Field(default=30.0, gt=0)


class HealthCheck(_Strict):
    """Active health checks: ``GET {replica base_url}{path}`` every ``interval`` seconds."""

    enabled: bool = True
    path: str = "/models"
    interval: float = Field(default=10.0, gt=0)
    timeout: float = Field(default=2.0, gt=0)
    unhealthy_after: int = Field(default=2, ge=1, description="consecutive failures to mark down")
    healthy_after: int = Field(default=1, ge=1, description="consecutive successes to mark up")

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _require_url_path(value)


class EngineMetrics(_Strict):
    """The engines' own load, polled with the health checks (``kind: vllm`` or ``sglang``: the engine's
    Prometheus ``/metrics``, running + waiting requests and KV-cache usage); balancing counts what the
    engine runs beyond this gateway's own requests (other gateways' traffic). ``path`` is taken from the
    replica's origin (``scheme://host:port``), where vLLM and SGLang serve it, not from its ``/v1`` base
    URL."""

    kind: Literal["none", "vllm", "sglang"] = "none"
    path: str = "/metrics"

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _require_url_path(value)


class BalancingConfig(_Strict):
    """How a request picks one of a backend's replicas (``gateway/balancing``).

    ``policy``: ``least_outstanding`` (default), ``round_robin``, ``session_affinity`` (a session's first
    turn to the least-loaded replica, later turns to the same one), ``cache_aware`` (the replica most
    likely to hold the longest prefix of the conversation, unless its load exceeds the least-loaded
    one's by more than ``balance_abs`` and by more than a factor ``balance_rel``; then by load; a
    conversation shorter than one block follows its session).
    ``load``: what "load" counts, requests in flight or estimated tokens in flight (thresholds are in
    the same unit). ``partition: tenant`` keeps tenants' affinity apart (a shared prompt cache is a
    timing side channel between tenants); ``none`` lets tenants with the same prompts share replicas.
    The prefix index holds at most ``max_entries`` blocks of ``block_bytes`` and forgets a block after
    ``ttl`` seconds unused. With ``shared_state.kind: redis`` and ``share_hints``, gateways in front of
    the same replicas exchange session -> replica hints through Redis, off the request path, every
    ``hint_interval`` seconds.
    """

    policy: Literal["least_outstanding", "round_robin", "session_affinity", "cache_aware"] = "least_outstanding"
    load: Literal["requests", "tokens"] = "requests"
    balance_abs: float = Field(
        default=DEFAULT_BALANCE_ABS, ge=0, description="load above the least-loaded replica's before load wins"
    )
    balance_rel: float = Field(
        default=DEFAULT_BALANCE_REL, ge=1, description="load ratio to the least-loaded replica before load wins"
    )
    partition: Literal["tenant", "none"] = "tenant"
    block_bytes: int = Field(default=4096, ge=64, le=1 << 20)
    max_entries: int = Field(default=262_144, ge=1, description="prefix blocks (or sessions) remembered per backend")
    ttl: float = Field(
        default=600.0, gt=0, le=_YEAR, description="seconds a prefix block or session is remembered unused"
    )
    share_hints: bool = True
    hint_interval: float = Field(default=0.2, gt=0, le=60)
    engine_metrics: EngineMetrics = EngineMetrics()

    @property
    def shares_hints(self) -> bool:
        """Whether placements are exchanged with peer gateways (an affinity policy with ``share_hints``)."""
        return self.share_hints and self.policy in ("session_affinity", "cache_aware")


class BackendConfig(_Strict):
    """An OpenAI-compatible upstream: one or more replicas serving the same models."""

    name: str = Field(min_length=1)
    base_url: str | None = None
    replicas: tuple[str, ...] = ()
    api_key: str | None = None
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    max_concurrency: int = Field(default=256, ge=1, description="in-flight requests per replica")
    timeouts: Timeouts = Timeouts()
    health: HealthCheck = HealthCheck()
    balancing: BalancingConfig = BalancingConfig()

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None:
            value = _require_http_url(value)
        return value.rstrip("/") if value else value

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_require_http_url(url).rstrip("/") for url in value)

    @field_validator("replicas")
    @classmethod
    def _no_repeated_replica(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # One replica listed twice would be probed, counted and shown as two (its metrics series twice
        # over, which breaks a Prometheus scrape) and confuse peers' hints, which name replicas by URL.
        seen: set[str] = set()
        for url in value:
            if url in seen:
                raise ValueError(f"{_shown_url(url)!r} is listed twice")
            seen.add(url)
        return value

    @field_validator("api_key")
    @classmethod
    def _check_api_key(cls, value: str | None) -> str | None:
        # Sent as a header: a line break (a secret file's trailing newline) made every request a 500.
        if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("contains a line break or another control character (a secret file's trailing newline?)")
        return value

    @model_validator(mode="after")
    def _one_source_of_replicas(self) -> BackendConfig:
        if not self.base_url and not self.replicas:
            raise ValueError("set base_url (one replica) or replicas (a list of base URLs)")
        if self.base_url and self.replicas:
            raise ValueError("set either base_url or replicas, not both")
        if self.balancing.engine_metrics.kind != "none" and not self.health.enabled:
            # The engines' load is read by the health checks: without them it was silently never read.
            raise ValueError("balancing.engine_metrics is read with the health checks: it needs health.enabled")
        if self.api_key and any(urlsplit(url).username is not None for url in self.replica_urls):
            raise ValueError(
                "a replica URL with user:password@ and api_key would both send an Authorization header: use one"
            )
        return self

    @property
    def replica_urls(self) -> tuple[str, ...]:
        return self.replicas or ((self.base_url,) if self.base_url else ())


class RetryConfig(_Strict):
    """Retries of one model on connect errors, 429 and 5xx, only before the client got a byte."""

    attempts: int = Field(default=3, ge=1, description="tries per model, the first one included")
    backoff_base: float = Field(default=0.1, ge=0, le=600)
    backoff_max: float = Field(default=2.0, ge=0, le=600)
    respect_retry_after_max: float = Field(
        default=5.0, ge=0, description="honour an upstream Retry-After up to this many seconds"
    )


class BreakerConfig(_Strict):
    """Circuit breaker per replica, done as outlier detection (see ``gateway/breaker.py``).

    Transport failures (connect errors, timeouts, resets, malformed bodies) eject a replica after
    ``failure_threshold`` in a row. HTTP 5xx answers can be one request's fault, so they eject only
    when they are at least ``failure_rate`` of the outcomes of the last ``window`` seconds and there
    were at least ``min_requests`` of them (attempts, retries included), and never the last replica
    of a backend that is still serving. An ejected replica returns when a health check passes, or
    after ``cooldown`` through one probe request.

    Defaults: ``failure_rate`` 0.9 is "nearly everything fails" (Envoy's failure-percentage default
    is 0.85): a replica answering most requests is never ejected for the rest. ``min_requests`` 20
    keeps 2 failures out of 2 from being a rate, yet catches a broken replica after 20 answers.
    ``window`` 30 s suits LLM traffic, where a replica sees a few requests a second or fewer (Envoy
    judges 50+ requests per 10 s, for faster traffic).
    ``cooldown`` 15 s is the fallback for backends without health checks.
    """

    failure_threshold: int = Field(
        default=5, ge=1, description="consecutive transport failures that eject a replica"
    )
    cooldown: float = Field(
        default=15.0, gt=0, description="seconds an ejected replica gets no traffic before one probe"
    )
    window: float = Field(default=30.0, gt=0, description="seconds over which 5xx answers are judged")
    min_requests: int = Field(
        default=20, ge=1, description="outcomes the window must hold before 5xx answers are judged"
    )
    failure_rate: float = Field(
        default=0.9, gt=0, le=1, description="share of failed outcomes in the window that ejects a replica"
    )


class RateLimits(_Strict):
    """Requests and tokens per minute (GCRA: a burst of a whole minute's worth, then a steady rate).

    Tokens are reserved before the call (the prompt's size / 4 + ``max_tokens``, or
    ``limits.default_completion_tokens``) and settled with the real usage after it.
    """

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class Budget(_Strict):
    """A spend budget in USD per calendar ``period`` (UTC day or month), from the models' prices."""

    period: Literal["day", "month"]
    usd: float = Field(gt=0, le=1_000_000)


class ApiKey(_Strict):
    """A client API key, stored as the SHA-256 hex digest (``pointsman hash-key``), with its optional
    rate ``limits`` and spend ``budgets`` (see ``gateway/quota``)."""

    name: str = Field(min_length=1, description="tenant name recorded in decisions")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    limits: RateLimits | None = None
    budgets: tuple[Budget, ...] = ()

    @field_validator("budgets")
    @classmethod
    def _one_budget_per_period(cls, value: tuple[Budget, ...]) -> tuple[Budget, ...]:
        periods = [b.period for b in value]
        if len(set(periods)) != len(periods):
            raise ValueError("at most one budget per period (day, month)")
        return value


class LimitsConfig(_Strict):
    """Rate limits per route (or per model / workflow a client names), over every key together.

    ``default_completion_tokens``: what a request without ``max_tokens`` is assumed to write, for the
    token and spend reservations before the call (settled with the real usage after it).
    """

    routes: dict[str, RateLimits] = Field(default_factory=dict)
    default_completion_tokens: int = Field(default=256, ge=1)


class AuthConfig(_Strict):
    """``api_keys``: clients of the ``/v1`` endpoints (none: open). ``admin_keys``: operators of the
    dashboard (``/dashboard/api/*``); an admin key is not a client key. With neither configured the
    dashboard is open (the embedded default, on loopback); with any key configured it needs an admin
    key (so ``api_keys`` alone lock it)."""

    api_keys: tuple[ApiKey, ...] = ()
    admin_keys: tuple[ApiKey, ...] = ()

    @model_validator(mode="after")
    def _one_tenant_per_key(self) -> AuthConfig:
        for section, keys in (("api_keys", self.api_keys), ("admin_keys", self.admin_keys)):
            owner: dict[str, str] = {}
            quota: dict[str, ApiKey] = {}
            for key in keys:
                if key.sha256 in owner:  # one key would silently be billed to the later tenant
                    raise ValueError(
                        f"{section}: the same key (sha256 {key.sha256[:12]}...) is listed for {owner[key.sha256]!r} "
                        f"and {key.name!r}"
                    )
                owner[key.sha256] = key.name
                first = quota.setdefault(key.name, key)
                if (first.limits, first.budgets) != (key.limits, key.budgets):  # keys of a tenant share one quota
                    raise ValueError(
                        f"{section}: the keys of {key.name!r} have different limits or budgets; a tenant's keys "
                        "share one quota, so give them the same"
                    )
        return self


class StoreConfig(_Strict):
    """Where decision records go. ``sqlite`` (embedded default) or ``postgres``."""

    kind: Literal["sqlite", "postgres", "none"] = "sqlite"
    path: str = "pointsman.db"
    dsn: str | None = None
    batch_size: int = Field(default=256, ge=1)
    flush_interval: float = Field(default=0.5, gt=0)
    queue_limit: int = Field(default=100_000, ge=1)
    # Records keeping conversation text are as large as their requests: during a store outage the queue
    # is bounded in bytes too (oldest dropped first, counted in pointsman_decision_log_dropped_total).
    queue_bytes_limit: int = Field(default=256 * 1024 * 1024, ge=1)

    @model_validator(mode="after")
    def _dsn_for_postgres(self) -> StoreConfig:
        if self.kind == "postgres" and not self.dsn:
            raise ValueError("store.kind is postgres but store.dsn is not set")
        if self.kind != "postgres" and self.dsn:  # records would silently go to a local file instead
            raise ValueError(f"store.dsn is set but store.kind is {self.kind}; set kind: postgres to use it")
        if self.kind == "sqlite" and "://" in self.path:  # a store URL (as --store takes) is not a file path
            raise ValueError(
                "store.path is a file path, not a store URL: write /abs/path.db rather than sqlite:///abs/path.db"
            )
        return self


class FeedbackConfig(_Strict):
    """``POST /v1/feedback``: outcomes attached to request ids, acknowledged once durably stored.

    ``labels`` maps the labels clients may send to scores, e.g. ``{good: 1.0, meh: 0.5, bad: 0.0}``.
    Writes are batched (``batch_size`` per transaction, at most ``write_timeout`` seconds each: a
    slower store answers 503). The gateway remembers the last ``recent_ids`` request ids it issued
    (with their tenant), so feedback on an answer whose decision record is not flushed yet is known.
    An id found neither there nor in the store is looked up once more after ``recheck_after``
    seconds (default: ``store.flush_interval`` + 0.2, the time another replica may take to flush it)
    before the answer is 404.
    """

    labels: dict[str, float] = Field(default_factory=dict)
    max_comment_chars: int = Field(default=2000, ge=0, le=100_000)
    batch_size: int = Field(default=512, ge=1)
    write_timeout: float = Field(default=10.0, gt=0)
    recent_ids: int = Field(default=100_000, ge=0)
    recheck_after: float | None = Field(default=None, ge=0, le=60)

    @field_validator("labels")
    @classmethod
    def _label_scores(cls, value: dict[str, float]) -> dict[str, float]:
        for label, score in value.items():
            if not label:
                raise ValueError("labels: a label must be a non-empty string")
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"labels.{label}: score {score} is outside [0, 1]")
        return value


class SharedStateFailModes(_Strict):
    """What each shared feature does while Redis cannot be reached (``open``: serve without it;
    ``closed``: refuse with 503 ``shared_state_unavailable`` and ``Retry-After``).

    Defaults: ``limits: open`` (limits protect capacity; an outage of Redis must not become an outage of
    the gateway), ``budgets: closed`` (budgets protect money: unmetered spend is what they exist to
    prevent; only keys that have a budget are refused). ``knob`` and ``sessions`` are always ``open``:
    the knob keeps calibrating on this replica's own window, a session is decided without stickiness.
    """

    limits: Literal["open", "closed"] = "open"
    budgets: Literal["open", "closed"] = "closed"
    knob: Literal["open"] = "open"
    sessions: Literal["open"] = "open"


class SharedStateConfig(_Strict):
    """Hot state that many gateway replicas must share. ``memory`` (default): each process keeps its own.

    ``redis``: session stickiness lives in Redis at ``url``, so a conversation stays on its model
    whichever replica serves its next turn. Sessions expire after their route's ``sticky.ttl``
    (``max_sessions`` bounds only the in-memory store; Redis's own ``maxmemory`` bounds this one).
    Keys are ``<key_prefix>sticky:<sha256 of route, tenant and session>``: no session id or prompt
    text is stored. A Redis call that fails or takes longer than ``timeout`` seconds does not fail
    the request: it is decided without stickiness and the decision record says so.
    Rate limits and spend budgets (``<key_prefix>rl:`` and ``<key_prefix>budget:``) and the cost-quality
    knob's score window (``<key_prefix>knob:<route>``) live there too; ``fail`` says what each does while
    Redis is lost. With ``memory``, limits and budgets are per process.
    """

    kind: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "pointsman:"
    timeout: float = Field(default=0.25, gt=0, le=60, description="seconds per Redis call before deciding without it")
    fail: SharedStateFailModes = SharedStateFailModes()
    knob_sync_interval: float = Field(
        default=1.0, gt=0, le=60, description="seconds between exchanges of the knob's score window with Redis"
    )

    @model_validator(mode="after")
    def _redis_url(self) -> SharedStateConfig:
        if self.kind == "redis" and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("shared_state.url must start with redis://, rediss:// or unix://")
        if self.kind == "redis" and self.url.startswith(("redis://", "rediss://")):
            try:
                parts = urlsplit(self.url)
                parts.port  # noqa: B018 - raises for a port out of range or not a number
            except ValueError as exc:
                raise ValueError(f"shared_state.url {_shown_url(self.url)!r} is not a valid URL ({exc})") from None
            if not parts.hostname:  # redis-py would silently connect to localhost:6379
                raise ValueError(f"shared_state.url {_shown_url(self.url)!r} names no host")
        return self


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # A whole (unstreamed) upstream answer, decompressed; larger is a failed attempt (retried elsewhere).
    max_response_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    body_timeout: float = Field(
        default=60.0, gt=0, description="seconds a request body may take to arrive after its headers (then 408)"
    )
    keep_alive_timeout: float = Field(
        default=5.0, gt=0, le=3600,
        description="seconds an idle keep-alive connection is kept open between requests; behind a load balancer "
        "make it longer than the balancer's own idle timeout, or it may reuse a connection just closed (a 502)",
    )
    header_timeout: float = Field(
        default=10.0, gt=0,
        description="seconds a connection may take to send a request's headers, from its opening or from the "
        "first byte of its next request (then 408 and closed; nothing sent: closed)",
    )
    write_timeout: float = Field(
        default=60.0, gt=0, allow_inf_nan=False,
        description="seconds a connection's write buffer may stay over its high-water mark with none of it taken by "
        "the client (a client that stopped reading a whole answer); then the connection is dropped",
    )
    drain_timeout: float = Field(default=30.0, ge=0)
    log_prompts: bool | None = Field(
        default=None,
        description="deprecated spelling of logging.include_prompts (it never did anything on its own); "
        "still accepted and carried over, with a warning",
    )


class LoggingConfig(_Strict):
    """The gateway's own log on stderr: ``text`` lines or ``json`` (one object per line, with the
    request id of the request a line is about). Prompt text never lands in the log unless
    ``include_prompts`` (nor does any API key, whatever it says)."""

    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"
    include_prompts: bool = False


class TracingConfig(_Strict):
    """OpenTelemetry tracing (the ``otel`` extra): spans for each request, its signals, its policy
    decision, every upstream attempt and every workflow step. Off by default; when on without the
    extra installed, start-up says so."""

    enabled: bool = False
    service_name: str = Field(default="pointsman", min_length=1)
    exporter: Literal["otlp", "console", "none"] = "otlp"
    endpoint: str | None = Field(
        default=None, description="OTLP/HTTP traces URL; None: the exporter's default (OTEL_EXPORTER_OTLP_* env)"
    )

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            value = _require_http_url(value)
        return value


class Config(_Strict):
    """The whole gateway configuration."""

    server: ServerConfig = ServerConfig()
    backends: tuple[BackendConfig, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    workflows: tuple[WorkflowConfig, ...] = ()
    workflow_limits: WorkflowLimits = WorkflowLimits()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    store: StoreConfig = StoreConfig()
    feedback: FeedbackConfig = FeedbackConfig()
    shared_state: SharedStateConfig = SharedStateConfig()
    local_model: LocalModelConfig = LocalModelConfig()
    classifiers: ClassifiersConfig = ClassifiersConfig()
    experiments: tuple[ExperimentConfig, ...] = ()
    logging: LoggingConfig = LoggingConfig()
    tracing: TracingConfig = TracingConfig()

    @model_validator(mode="before")
    @classmethod
    def _deprecated_log_prompts(cls, data: Any) -> Any:
        # server.log_prompts was the first name of the switch; the log only ever read
        # logging.include_prompts, so a config saying log_prompts: true silently kept prompts out.
        server = data.get("server") if isinstance(data, dict) else None
        if not isinstance(server, dict) or server.get("log_prompts") is None:
            return data
        old = server["log_prompts"]
        logging_section = data.get("logging") if isinstance(data.get("logging"), dict) else {}
        if "include_prompts" in logging_section and logging_section["include_prompts"] != old:
            raise ValueError(
                f"server.log_prompts ({old}) contradicts logging.include_prompts "
                f"({logging_section['include_prompts']}): keep only logging.include_prompts"
            )
        _log.warning("server.log_prompts is deprecated: use logging.include_prompts (taken as %s)", old)
        return {**data, "logging": {**logging_section, "include_prompts": old}}

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        if not self.backends and not self.local_model.enabled:
            raise ValueError("backends: at least one backend is required")
        seen_backends: set[str] = set()
        models: set[str] = set()
        for backend in self.backends:
            if backend.name in seen_backends:
                raise ValueError(f"backends: duplicate backend name {backend.name!r}")
            seen_backends.add(backend.name)
            for model in backend.models:
                if model.name in models:
                    raise ValueError(f"backends.{backend.name}.models: model {model.name!r} is defined twice")
                models.add(model.name)
        if self.local_model.enabled:
            models.update(self.local_model.served_names())
        for backend in self.backends:
            for model in backend.models:
                for fallback in model.fallbacks:
                    if fallback not in models:
                        raise ValueError(
                            f"backends.{backend.name}.models.{model.name}.fallbacks: unknown model {fallback!r}"
                        )
        route_names: set[str] = set()
        tags = self.model_tags()
        problems = workflow_problems(self.workflows, models)
        if problems:
            raise ValueError("\n  ".join(problems))
        workflows = workflow_models(self.workflows)
        virtual = set(workflows.values())
        for route in self.routes:
            if route.name in models:
                raise ValueError(f"routes.{route.name}: a route may not share its name with a model")
            if route.name in virtual:
                raise ValueError(f"routes.{route.name}: a route may not share its name with a workflow's model")
            if route.name == "direct":
                raise ValueError("routes.direct: 'direct' is reserved (x-pointsman-route of concrete models)")
            if route.name in route_names:
                raise ValueError(f"routes: duplicate route name {route.name!r}")
            route_names.add(route.name)
            problems = route_problems(route, models, tags, workflows)
            if problems:
                raise ValueError("\n  ".join(problems))
            for warning in shadowed_guards(route.name, route):
                _log.warning("%s", warning)
        for name in self.limits.routes:
            if name not in route_names and name not in models and name not in virtual:
                raise ValueError(f"limits.routes.{name}: not a route, a model or a workflow's model")
        problems = experiment_problems(
            self.experiments, self.routes, models, workflows,
            lambda route: route_problems(route, models, tags, workflows),
        )
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    def routing(self) -> RoutingConfig:
        """The routing part of this config: what building the routes' policies reads."""
        return RoutingConfig(
            routes=self.routes,
            classifiers=self.classifiers,
            models=model_infos((m for b in self.backends for m in b.models), self.local_model),
            workflows=self.workflows,
            experiments=self.experiments,
        )

    def model_tags(self) -> dict[str, set[str]]:
        """Tags of every configured model (the embedded local model included)."""
        tags = {m.name: set(m.tags) for b in self.backends for m in b.models}
        if self.local_model.enabled:
            for name in self.local_model.served_names():
                tags.setdefault(name, {"local", "cheap"})
        return tags


def local_model_conflicts(config: Config) -> None:
    """:class:`ConfigError` when the embedded local model's backend (``local``) or one of its model names
    is already taken by a configured backend: serving would add them and fail only after starting the
    model. (Not a validator of :class:`Config`, which also validates the config with that backend added.)"""
    if not config.local_model.enabled:
        return
    local_names = set(config.local_model.served_names())
    for backend in config.backends:
        if backend.name == LOCAL_BACKEND:
            raise ConfigError(
                f"backends: the name {LOCAL_BACKEND!r} belongs to the embedded local model's backend "
                "(local_model.enabled); rename the backend"
            )
        for model in backend.models:
            if model.name in local_names:
                raise ConfigError(
                    f"backends.{backend.name}.models: {model.name!r} is also a name of the embedded local model "
                    "(local_model.model_name / aliases); rename one of them"
                )


def substitute_env(value: Any, env: dict[str, str], path: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string inside ``value``."""
    try:
        return _routing.substitute_env(value, env, path)
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc


def parse_config(data: Any, env: dict[str, str] | None = None) -> Config:
    """Validate a parsed YAML document into a :class:`Config`, raising :class:`ConfigError`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("<root>: the config must be a mapping of sections (backends, routes, ...)")
    data = substitute_env(data, dict(os.environ) if env is None else env)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, data)) from exc


def load_config(path: str | Path, env: dict[str, str] | None = None) -> Config:
    """Read, substitute and validate the YAML config at ``path``."""
    try:
        text = read_utf8(path)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except NotUtf8 as exc:
        raise ConfigError(str(exc)) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(data, env)


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    return _routing.describe_validation_error(exc, Config, data)


def _require_http_url(url: str) -> str:
    """``url`` if it is an http(s) URL a backend can be called at (scheme lower-cased); ``ValueError`` saying
    what is wrong otherwise, the URL shown without credentials or query (it may come from a secret)."""
    shown = _shown_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port raises for one out of range or not a number
    except ValueError as exc:
        raise ValueError(f"{shown!r} is not a valid URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{shown!r} is not an http(s) URL")
    if not parts.hostname:
        raise ValueError(f"{shown!r} names no host")
    if any(c.isspace() for c in url):
        raise ValueError(f"{shown!r} contains white space")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):  # NUL and the like: no request line can carry them
        raise ValueError(f"{shown!r} contains a control character")
    if parts.query or parts.fragment:  # paths are appended to the base URL: a query would end up in the middle
        raise ValueError(f"{shown!r}: a base URL cannot carry a query or fragment (?... / #...)")
    return urlunsplit(parts._replace(scheme=parts.scheme.lower()))


def _require_url_path(path: str) -> str:
    """``path`` if it can follow a base URL: ``models`` made ``http://host:8000/v1models``, a URL no probe
    reaches, so every replica was marked down and every request answered "no healthy replica"."""
    if not path.startswith("/"):
        raise ValueError(f"{path[:60]!r} must start with '/'")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError(f"{path[:60]!r} contains white space or a control character")
    return path


def _shown_url(url: str) -> str:
    """``url`` as an error message may show it: no user or password, no query."""
    head, sep, rest = url.partition("://")
    if not sep:
        return url[:60]
    authority, slash, path = rest.partition("/")
    host = authority.rsplit("@", 1)[-1]
    if "@" in authority:
        host = "***@" + host
    return f"{head}://{host}{slash}{path.split('?', 1)[0].split('#', 1)[0]}"
