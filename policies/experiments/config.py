"""Experiments as written in the config file: A/B splits and shadow arms of a route's policy.

::

    experiments:
      - name: lower-threshold
        route: auto                     # the route (virtual model) whose traffic is split
        key: user                       # api_key | user | session | conversation
        missing_key: conversation       # exclude | conversation | request
        arms:
          - {name: control, control: true, weight: 2}        # the route's policy as configured
          - {name: eager, weight: 1, policy: {cost_quality: {threshold: 0.3}}}   # a policy variant
          - {name: mini, weight: 1, model: gpt-4o-mini}      # a fixed model
          - {name: v7, weight: 1, router_version: v0007-1a2b3c4d}   # the route over another router
          - {name: big, shadow: true, model: gpt-4o, call_backend: true, budget_usd_per_hour: 1.0}
        start: 2025-06-01T00:00:00Z     # optional [start, end), UTC unless the time says otherwise
        end: 2025-07-01T00:00:00Z
        paused: false
        guardrails: {min_requests: 200, max_error_rate_increase: 0.05, max_cost_ratio: 1.5,
                     max_p95_ratio: 2.0, window: 300, interval: 30, alpha: 0.05}
        allocation: {kind: fixed}       # or {kind: thompson, lambda: 0.2, update_interval: 60}

An arm is exactly one of: the route's own policy (no key), ``policy`` (overrides merged into the
route's config: mappings merge key by key, anything else replaces, ``null`` removes a key), ``model``
(every request to that model or workflow model) or ``router_version`` (the route's policy over the
heads of that version of the ``classifiers.routers_dir`` registry). Exactly one served arm is the
``control``; served arms' ``weight`` values (> 0, default 1) are normalised to shares. A ``shadow`` arm
never serves: it decides after the served decision (a ``share`` of the requests), its decision is
logged as its own row, and it calls a backend only with ``call_backend: true``, within
``budget_usd_per_hour`` and ``max_concurrency``.

This module is the schema (pydantic, unknown keys are errors, messages name the key) and the
cross-checks against the routes and models (:func:`experiment_problems`); building an arm's policy
is :mod:`policies.experiments.arms`, the serving runtime is ``gateway/experiments``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.config import RouteConfig
from policies.strict_model import StrictModel

_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"  # no "/": the header says <experiment>/<arm>
_VERSION = r"^v\d{4,}-[0-9a-f]{8}$"

#: Where an experiment reads a request's assignment key from.
KeyKind = Literal["api_key", "user", "session", "conversation"]
#: What happens to a request that has no assignment key (see :class:`ExperimentConfig`).
MissingKey = Literal["exclude", "conversation", "request"]


class _Strict(StrictModel):
    """Unknown keys are errors: a typo in an experiment must never be silently ignored."""

    model_config = ConfigDict(populate_by_name=True)  # the rest comes from StrictModel


_SHADOW_ONLY = ("call_backend", "budget_usd_per_hour", "max_concurrency", "share")


class ArmConfig(_Strict):
    """One arm of an experiment (see the module docstring for the four kinds).

    ``weight``: served arms only, > 0, default 1 (normalised over the served arms). ``control``:
    exactly one served arm. ``shadow``: the arm decides but never serves; then ``share`` (default 1)
    of the experiment's requests get its decision, and with ``call_backend: true`` (default false)
    its model is called, off the request path, at most ``max_concurrency`` (default 4) at once and
    within ``budget_usd_per_hour`` (required with ``call_backend``; from the configured prices).
    """

    name: str = Field(pattern=_NAME)
    weight: float | None = Field(default=None, gt=0, le=1e9)
    control: bool = False
    shadow: bool = False
    policy: dict[str, Any] | None = None
    model: str | None = Field(default=None, min_length=1)
    router_version: str | None = Field(default=None, pattern=_VERSION)
    call_backend: bool = False
    budget_usd_per_hour: float | None = Field(default=None, ge=0)
    max_concurrency: int = Field(default=4, ge=1)
    share: float = Field(default=1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _shape(self) -> ArmConfig:
        kinds = [k for k in ("policy", "model", "router_version") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"an arm is at most one of policy, model, router_version; not {' and '.join(kinds)}")
        if self.policy is not None:
            if not self.policy:
                raise ValueError("policy: give the route settings the arm overrides (an empty mapping changes nothing)")
            if "name" in self.policy:
                raise ValueError("policy.name: an arm cannot rename its route")
        if self.shadow:
            if self.control:
                raise ValueError("a shadow arm cannot be the control (the control serves)")
            if self.weight is not None:
                raise ValueError("weight: a shadow arm takes no traffic share (use share: the part it decides for)")
            if self.call_backend and self.budget_usd_per_hour is None:
                raise ValueError("budget_usd_per_hour: call_backend needs a spend cap (USD per rolling hour)")
        else:
            stray = [key for key in _SHADOW_ONLY if key in self.model_fields_set]
            if stray:
                raise ValueError(f"{', '.join(stray)}: only for shadow arms (shadow: true)")
        return self

    @property
    def kind(self) -> str:
        """``route`` (the route's own policy), ``policy``, ``model`` or ``router_version``."""
        for key in ("policy", "model", "router_version"):
            if getattr(self, key) is not None:
                return key
        return "route"

    @property
    def served_weight(self) -> float:
        """The arm's raw weight (1 when not given); 0 for a shadow arm."""
        return 0.0 if self.shadow else (1.0 if self.weight is None else self.weight)


class Guardrails(_Strict):
    """Automatic stops of served arms that do worse than the control (never the control itself).

    Every ``interval`` seconds each gateway replica reads every arm's totals from the store (so it
    sees every replica's traffic) and tests each arm against the control once both have
    ``min_requests`` served requests: the error rate (status >= 500, or a failed or broken answer)
    with an always-valid confidence sequence at level ``alpha`` — repeated looks keep the error rate
    — stopping the arm once its increase over the control is surely above
    ``max_error_rate_increase``; the cost per request the same way, against ``max_cost_ratio`` times
    the control's; and the p95 latency of the last ``window`` seconds, when it is more than
    ``max_p95_ratio`` times the control's (both with ``min_requests`` in the window). ``null``
    turns one guardrail off. A stopped arm's keys are served by the control on every replica from
    the next poll (every ``poll_interval`` seconds) on.
    """

    enabled: bool = True
    interval: float = Field(default=30.0, gt=0)
    poll_interval: float = Field(default=5.0, gt=0)
    min_requests: int = Field(default=100, ge=1)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    max_error_rate_increase: float | None = Field(default=0.05, ge=0, le=1)
    max_cost_ratio: float | None = Field(default=1.5, gt=0)
    max_p95_ratio: float | None = Field(default=2.0, gt=0)
    window: float = Field(default=300.0, gt=0)


class Allocation(_Strict):
    """How new keys are spread over the served arms.

    ``fixed`` (default): by the arms' weights, a pure hash of the key (no state anywhere).
    ``thompson``: Thompson sampling on each arm's reward, quality - ``lambda`` x (its cost per request
    / the control's): a key not yet assigned gets arm *a* with the probability that *a*'s reward is the
    best under the posteriors (Beta over the ``metric`` feedback, normal over the cost), floored at
    ``min_propensity`` per arm; the probability is estimated every ``update_interval`` seconds from the
    store with ``draws`` Monte Carlo draws, and it is exactly the probability the key was assigned
    with, so it is logged as the decision's ``arm_propensity``. Assignments are stored (the first
    replica to assign a key wins) and never change; ``max_keys`` assignments are cached per replica.
    """

    kind: Literal["fixed", "thompson"] = "fixed"
    lambda_: float = Field(default=0.0, ge=0, alias="lambda")
    metric: str = Field(default="quality", min_length=1)
    update_interval: float = Field(default=60.0, gt=0)
    min_propensity: float = Field(default=0.05, ge=0, lt=0.5)
    draws: int = Field(default=4000, ge=100, le=1_000_000)
    max_keys: int = Field(default=100_000, ge=1)

    @model_validator(mode="after")
    def _thompson_only(self) -> Allocation:
        if self.kind == "fixed":
            stray = [k for k in ("lambda_", "metric", "update_interval", "min_propensity", "draws", "max_keys")
                     if k in self.model_fields_set]
            if stray:
                names = ", ".join("lambda" if k == "lambda_" else k for k in stray)
                raise ValueError(f"{names}: only used with kind: thompson")
        return self


class ExperimentConfig(_Strict):
    """An experiment on one route: its arms, how requests are assigned, when it runs, its guardrails.

    ``key`` names what a request is assigned by, hashed with the experiment's name (blake2b) into a
    number in [0, 1): the same key always lands on the same arm, across requests, restarts and
    replicas. ``api_key``: the bearer token the client sent (hashed, never stored); ``user``: the
    request's ``user`` field; ``session``: the ``x-pointsman-session-id`` header; ``conversation``: a
    hash of the conversation's start (system prompt and first user message, which every later turn
    repeats). A request without its key is, by ``missing_key``: ``conversation`` (default) assigned
    by its conversation instead; ``exclude`` routed as if there were no experiment (and not recorded
    as in it); ``request`` assigned by its request id (a fresh draw for every request).

    The experiment runs while not ``paused`` and ``start <= now < end`` (either bound optional;
    times without a zone are UTC); outside that the route serves as usual.
    """

    name: str = Field(pattern=_NAME)
    route: str = Field(min_length=1)
    key: KeyKind = "user"
    missing_key: MissingKey = "conversation"
    arms: tuple[ArmConfig, ...]
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    paused: bool = False
    guardrails: Guardrails = Guardrails()
    allocation: Allocation = Allocation()
    description: str | None = None

    @field_validator("start", "end")
    @classmethod
    def _utc(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value

    @model_validator(mode="after")
    def _arms(self) -> ExperimentConfig:
        if len(self.arms) < 2:
            raise ValueError("arms: an experiment needs a control and at least one other arm (served or shadow)")
        names = [arm.name for arm in self.arms]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"arms: two arms are named {', '.join(map(repr, twice))}")
        controls = [arm.name for arm in self.arms if arm.control]
        if len(controls) != 1:
            found = f" (found {', '.join(map(repr, controls))})" if controls else ""
            raise ValueError(f"arms: exactly one served arm must be the control (control: true){found}")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"end: {self.end.isoformat()} is not after start {self.start.isoformat()}")
        return self

    @property
    def control(self) -> ArmConfig:
        """The control arm."""
        return next(arm for arm in self.arms if arm.control)

    @property
    def served(self) -> tuple[ArmConfig, ...]:
        """The arms that serve traffic (control first, then in file order)."""
        return (self.control, *(a for a in self.arms if not a.shadow and not a.control))

    @property
    def shadows(self) -> tuple[ArmConfig, ...]:
        """The shadow arms, in file order."""
        return tuple(arm for arm in self.arms if arm.shadow)

    def shares(self) -> dict[str, float]:
        """Each served arm's normalised weight (control first)."""
        total = sum(arm.served_weight for arm in self.served)
        return {arm.name: arm.served_weight / total for arm in self.served}

    @property
    def start_ts(self) -> float | None:
        """``start`` as unix seconds."""
        return None if self.start is None else self.start.timestamp()

    @property
    def end_ts(self) -> float | None:
        """``end`` as unix seconds."""
        return None if self.end is None else self.end.timestamp()

    def running(self, now: float) -> bool:
        """Whether the experiment assigns requests at unix time ``now``."""
        if self.paused:
            return False
        start, end = self.start_ts, self.end_ts
        return (start is None or start <= now) and (end is None or now < end)

    def spec(self, route: RouteConfig | None = None) -> dict[str, Any]:
        """The normalised experiment, as stored for every replica and the report to read: arms with
        their shares, the control, shadow flags, key, window, guardrails, allocation and, when the
        route has a cost–quality pair, its ``strong`` and ``weak`` models."""
        shares = self.shares()
        arms: list[dict[str, Any]] = []
        for arm in self.arms:
            entry: dict[str, Any] = {
                "name": arm.name, "kind": arm.kind, "control": arm.control, "shadow": arm.shadow,
                "weight": shares.get(arm.name, 0.0),
            }
            if arm.policy is not None:
                entry["policy"] = arm.policy
            if arm.model is not None:
                entry["model"] = arm.model
            if arm.router_version is not None:
                entry["router_version"] = arm.router_version
            if arm.shadow:
                entry.update(share=arm.share, call_backend=arm.call_backend,
                             budget_usd_per_hour=arm.budget_usd_per_hour, max_concurrency=arm.max_concurrency)
            arms.append(entry)
        spec: dict[str, Any] = {
            "name": self.name, "route": self.route, "key": self.key, "missing_key": self.missing_key,
            "control": self.control.name, "arms": arms,
            "start": self.start_ts, "end": self.end_ts, "paused": self.paused,
            "guardrails": self.guardrails.model_dump(), "allocation": self.allocation.model_dump(by_alias=True),
        }
        if route is not None and route.cost_quality is not None:
            spec["strong"], spec["weak"] = route.cost_quality.strong, route.cost_quality.weak
        if self.description:
            spec["description"] = self.description
        return spec


def merge_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied: mappings merge key by key, other values replace, and a
    ``None`` value removes the key (``explore: null`` turns a route's exploration off in an arm)."""
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged


class ArmPolicyError(ValueError):
    """An arm's ``policy`` overrides make an invalid route: ``problems`` are ``(key path, message)`` pairs,
    the key path relative to the arm's ``policy`` (empty when the problem is about the policy as a whole)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("\n".join(f"{key}: {message}" if key else message for key, message in problems))
        self.problems = problems

    def lines(self, where: str) -> list[str]:
        """The problems as config error lines under ``where`` (``experiments.0.arms.1.policy``)."""
        return [f"{where}.{key}: {message}" if key else f"{where}: {message}" for key, message in self.problems]


def arm_route(route: RouteConfig, arm: ArmConfig) -> RouteConfig:
    """The route's config as a ``policy`` arm runs it (its overrides applied, validated again); raises
    :class:`ArmPolicyError` when the overrides make an invalid route."""
    if arm.policy is None:
        return route
    base = route.model_dump(by_alias=True, exclude_unset=True)
    try:
        return RouteConfig.model_validate(merge_overrides(base, arm.policy))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append((".".join(str(part) for part in error["loc"]), message))
        raise ArmPolicyError(problems) from None


def experiment_problems(
    experiments: Iterable[ExperimentConfig],
    routes: Iterable[RouteConfig],
    models: Collection[str],
    workflows: Mapping[str, str],
    check_route: Callable[[RouteConfig], list[str]],
) -> list[str]:
    """Cross-checks of the experiments against the config, as ``key.path: message`` lines.

    Names used twice; an unknown route; two experiments on one route whose time windows overlap (a
    request would be in both); an arm's unknown model; a ``policy`` arm whose route config, overrides
    applied, is invalid or fails ``check_route`` (the same checks a route gets: unknown signals and
    models ...). Router versions are checked when the brain loads them (they need the registry).
    """
    problems: list[str] = []
    by_route: dict[str, list[ExperimentConfig]] = {}
    known_routes = {route.name: route for route in routes}
    servable = set(models) | set(workflows.values())
    seen: set[str] = set()
    for experiment in experiments:
        root = f"experiments.{experiment.name}"
        if experiment.name in seen:
            problems.append(f"experiments: two experiments are named {experiment.name!r}")
        seen.add(experiment.name)
        route = known_routes.get(experiment.route)
        if route is None:
            known = ", ".join(sorted(known_routes)) or "none"
            problems.append(f"{root}.route: unknown route {experiment.route!r} (routes: {known})")
            continue
        for other in by_route.get(route.name, []):
            if _overlap(experiment, other):
                problems.append(
                    f"{root}.route: experiment {other.name!r} also runs on route {route.name!r} at the same time; "
                    "give them start/end windows that do not overlap"
                )
        by_route.setdefault(route.name, []).append(experiment)
        for arm in experiment.arms:
            where = f"{root}.arms.{arm.name}"
            if arm.model is not None and arm.model not in servable:
                problems.append(f"{where}.model: unknown model {arm.model!r}")
            if arm.router_version is not None and route.policy == "static":
                problems.append(f"{where}.router_version: route {route.name!r} is static; it reads no router heads")
            if arm.policy is None:
                continue
            try:
                variant = arm_route(route, arm)
            except ArmPolicyError as exc:
                problems += exc.lines(f"{where}.policy")
                continue
            prefix = f"routes.{route.name}"
            for problem in check_route(variant):
                rest = problem[len(prefix):] if problem.startswith(prefix) else f": {problem}"
                problems.append(f"{where}.policy{rest}")
    return problems


def _overlap(a: ExperimentConfig, b: ExperimentConfig) -> bool:
    inf = float("inf")
    a_start, a_end = _or(a.start_ts, -inf), _or(a.end_ts, inf)
    b_start, b_end = _or(b.start_ts, -inf), _or(b.end_ts, inf)
    return a_start < b_end and b_start < a_end


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
