"""Start-up checks of a route's policy against the rest of the configuration.

:func:`validate_policy` finds what pydantic cannot see on its own: signals and models that do not
exist, operators that make no sense for a signal's type, conditions that can never hold, rules
that can never run. Every problem is reported with its key path, e.g.
``routes.auto.rules.2.when.all.0.signal: unknown signal 'domian' (did you mean 'domain'?)``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from policies.conditions import describe
from policies.config import Condition, MultiModel, RouteConfig
from policies.signals import (
    DEFAULT_SIGNAL_SPECS,
    OPS_BY_KIND,
    SignalKind,
    SignalSpec,
    signal_name,
    spec_for_path,
)

_SCORE_KINDS = (SignalKind.PROBABILITY, SignalKind.NUMBER, SignalKind.ANY)


def validate_policy(
    route_name: str,
    cfg: RouteConfig,
    known_signals: Collection[str],
    known_models: Collection[str],
    model_tags: Mapping[str, Collection[str]],
    *,
    signal_specs: Mapping[str, SignalSpec] | None = None,
    workflows: Mapping[str, str] | None = None,
) -> None:
    """Raise ``ValueError`` listing every problem in route ``route_name``'s policy, one per line.

    ``known_signals`` are the signals the provider can compute (keyword signals the route defines
    in ``signals.keywords`` are added); ``signal_specs`` declares their types (defaults:
    :data:`policies.signals.DEFAULT_SIGNAL_SPECS`; undeclared signals accept every operator).
    ``workflows`` maps the configured workflows' names to their virtual models.
    """
    problems = policy_problems(
        route_name, cfg, known_signals, known_models, model_tags, signal_specs=signal_specs, workflows=workflows
    )
    if problems:
        raise ValueError("\n".join(problems))


def policy_problems(
    route_name: str,
    cfg: RouteConfig,
    known_signals: Collection[str],
    known_models: Collection[str],
    model_tags: Mapping[str, Collection[str]],
    *,
    signal_specs: Mapping[str, SignalSpec] | None = None,
    workflows: Mapping[str, str] | None = None,
) -> list[str]:
    """Every problem :func:`validate_policy` would raise, as ``key.path: message`` strings."""
    checker = _Checker(f"routes.{route_name}", known_models, model_tags, workflows)
    checker.route(cfg, set(known_signals), {**DEFAULT_SIGNAL_SPECS, **(signal_specs or {})})
    return checker.problems


@dataclass
class _Bounds:
    """A numeric interval being narrowed by the comparisons of one ``all``."""

    lo: float = -math.inf
    lo_strict: bool = False
    hi: float = math.inf
    hi_strict: bool = False

    def narrow(self, op: str, value: float) -> None:
        if op in ("gt", "ge", "eq"):
            strict = op == "gt"
            if value > self.lo or (value == self.lo and strict):
                self.lo, self.lo_strict = value, strict
        if op in ("lt", "le", "eq"):
            strict = op == "lt"
            if value < self.hi or (value == self.hi and strict):
                self.hi, self.hi_strict = value, strict

    @property
    def empty(self) -> bool:
        return self.lo > self.hi or (self.lo == self.hi and (self.lo_strict or self.hi_strict))


class _Checker:
    def __init__(
        self,
        root: str,
        models: Collection[str],
        tags: Mapping[str, Collection[str]],
        workflows: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.models = set(models)
        self.workflows = dict(workflows or {})  # name -> virtual model
        self.workflow_models = set(self.workflows.values())
        self.tags = {name: set(values) for name, values in tags.items()}
        self.problems: list[str] = []
        self.signals: set[str] = set()
        self.specs: dict[str, SignalSpec] = {}

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{self.root}.{path}: {message}")

    def model(self, path: str, name: str) -> None:
        if name not in self.models:
            self.fail(path, f"unknown model {name!r}{_suggest(name, self.models)}")

    def model_or_workflow(self, path: str, name: str) -> None:
        if not self.workflows:
            self.model(path, name)
        elif name not in self.models and name not in self.workflow_models:
            options = self.models | self.workflow_models
            self.fail(path, f"unknown model or workflow {name!r}{_suggest(name, options)}")

    def workflow(self, path: str, name: str) -> None:
        if name not in self.workflows:
            known = ", ".join(sorted(self.workflows)) or "none configured"
            self.fail(path, f"unknown workflow {name!r}{_suggest(name, self.workflows)}; workflows: {known}")

    def signal(self, path: str, name: str) -> bool:
        if name in self.signals:
            return True
        hint = _suggest(name, self.signals) or f" (known: {', '.join(sorted(self.signals))})"
        self.fail(path, f"unknown signal {name!r}{hint}")
        return False

    def route(self, cfg: RouteConfig, known_signals: set[str], specs: dict[str, SignalSpec]) -> None:
        if cfg.model is not None:
            self.model_or_workflow("model", cfg.model)
            if cfg.model in self.workflow_models and cfg.policy == "static" and cfg.fallbacks:
                self.fail("fallbacks", f"{cfg.model!r} is a workflow: it takes no fallbacks (its models have "
                          "their own, in backends.*.models.*.fallbacks)")
        for i, fallback in enumerate(cfg.fallbacks):
            self.model(f"fallbacks.{i}", fallback)
        if cfg.policy == "static":
            return
        self.signals = set(known_signals)
        self.specs = dict(specs)
        for name, keywords in cfg.signals.keywords.items():
            if name in known_signals:
                self.fail(f"signals.keywords.{name}", f"{name!r} is already a built-in signal; pick another name")
                continue
            self.signals.add(name)
            self.specs[name] = SignalSpec(SignalKind.LABELS, labels=keywords.labels)
        self.rules(cfg)
        if cfg.cost_quality is not None:
            cq = cfg.cost_quality
            self.score_signal("cost_quality.signal", cq.signal, _SCORE_KINDS, "a probability or number")
            self.model("cost_quality.strong", cq.strong)
            self.model("cost_quality.weak", cq.weak)
            if cq.middle is not None:
                self.workflow("cost_quality.middle.workflow", cq.middle.workflow)
        if cfg.multi_model is not None:
            self.multi_model(cfg)
        if cfg.sticky is not None:
            for i, name in enumerate(cfg.sticky.order):
                self.model(f"sticky.order.{i}", name)
        if cfg.compare is not None:
            self.model("compare.judge", cfg.compare.judge)

    def rules(self, cfg: RouteConfig) -> None:
        ordered = sorted(enumerate(cfg.rules), key=lambda pair: -pair[1].priority)
        always: tuple[int, str] | None = None  # the first unconditional terminal rule
        for i, rule in ordered:
            path = f"rules.{i}"
            if always is not None:
                self.fail(path, f"rule {rule.name!r} can never run: rule {always[1]!r} (rules.{always[0]}) "
                          "has no condition and a higher or equal priority")
            if rule.when is not None:
                self.condition(f"{path}.when", rule.when)
            elif rule.action.terminal and always is None:
                always = (i, rule.name)
            action = rule.action
            if action.route is not None:
                self.model(f"{path}.action.route", action.route)
            if action.workflow is not None:
                self.workflow(f"{path}.action.workflow", action.workflow)
            if action.tier is not None and cfg.cost_quality is None:
                self.fail(f"{path}.action.tier", "tier needs a cost_quality section (its strong and weak models)")
            for j, fallback in enumerate(action.fallbacks):
                self.model(f"{path}.action.fallbacks.{j}", fallback)
            pii_labels = self.specs.get("pii", SignalSpec()).labels
            for j, kind in enumerate(action.redact or ()):
                if pii_labels is not None and kind not in pii_labels:
                    self.fail(f"{path}.action.redact.{j}",
                              f"unknown PII kind {kind!r}{_suggest(kind, pii_labels)}; known: {sorted(pii_labels)}")

    def multi_model(self, cfg: RouteConfig) -> None:
        mm = cfg.multi_model
        assert mm is not None
        self.score_signal("multi_model.quality_signal", mm.quality_signal,
                          (SignalKind.MAPPING, SignalKind.ANY), "a mapping model -> quality")
        for i, name in enumerate(mm.candidates):
            self.model(f"multi_model.candidates.{i}", name)
        for name in mm.costs:
            if name not in mm.candidates:
                self.fail(f"multi_model.costs.{name}", f"{name!r} is not one of the candidates")
        for name in mm.quality_models:
            if name not in mm.candidates:
                self.fail(f"multi_model.quality_models.{name}", f"{name!r} is not one of the candidates")
        spec = spec_for_path(self.specs, mm.quality_signal) if signal_name(mm.quality_signal) in self.signals else None
        if spec is not None and spec.kind is SignalKind.MAPPING and spec.labels is not None:
            for path, message in quality_label_problems(mm, spec.labels):
                self.fail(path, message)
        if mm.require_tags:
            required = set(mm.require_tags)
            if not any(required <= self.tags.get(name, set()) for name in mm.candidates):
                self.fail("multi_model.require_tags",
                          f"no candidate has all of {sorted(required)}: no request could ever be served")

    def score_signal(self, path: str, name_path: str, kinds: tuple[SignalKind, ...], wanted: str) -> None:
        if not self.signal(path, signal_name(name_path)):
            return
        spec = spec_for_path(self.specs, name_path)
        if spec is None:
            self.fail(path, f"signal {signal_name(name_path)!r} has no field {name_path.split('.', 1)[1]!r}")
        elif spec.kind not in kinds:
            self.fail(path, f"{name_path!r} is a {spec.kind.value} signal; this needs {wanted}")

    def condition(self, path: str, cond: Condition) -> None:
        if cond.signal is not None:
            self.comparison(path, cond)
            return
        if cond.not_ is not None:
            self.condition(f"{path}.not", cond.not_)
            return
        key = "all" if cond.all is not None else "any"
        children = cond.all if cond.all is not None else cond.any or ()
        for i, child in enumerate(children):
            self.condition(f"{path}.{key}.{i}", child)
        if key == "all":
            self.contradictions(f"{path}.all", children)

    def comparison(self, path: str, cond: Condition) -> None:
        assert cond.signal is not None and cond.op is not None
        name = signal_name(cond.signal)
        if not self.signal(f"{path}.signal", name):
            return
        spec = spec_for_path(self.specs, cond.signal)
        if spec is None:
            field = cond.signal.split(".", 1)[1]
            self.fail(f"{path}.signal", f"signal {name!r} has no field {field!r}")
            return
        allowed = OPS_BY_KIND[spec.kind]
        if cond.op not in allowed:
            self.fail(f"{path}.op", f"op {cond.op!r} is not valid for {cond.signal!r} ({spec.kind.value}); "
                      f"use one of {', '.join(sorted(allowed))}")
            return
        value = cond.value
        if spec.kind in (SignalKind.PROBABILITY, SignalKind.NUMBER) and cond.op != "truthy":
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(f"{path}.value", f"{cond.signal!r} is a {spec.kind.value}: compare it with a number")
            elif spec.kind is SignalKind.PROBABILITY and not 0.0 <= value <= 1.0:
                self.fail(f"{path}.value", f"threshold {value} is outside [0, 1] for probability {cond.signal!r}: "
                          "the condition is decided in advance")
        elif spec.kind is SignalKind.BOOL and cond.op in ("eq", "ne") and not isinstance(value, bool):
            self.fail(f"{path}.value", f"{cond.signal!r} is a bool: compare it with true or false")
        elif spec.labels is not None and cond.op in ("eq", "ne", "in", "not_in", "contains"):
            for label in value if isinstance(value, list | tuple) else (value,):
                if label not in spec.labels:
                    self.fail(f"{path}.value", f"{label!r} is not a value of {cond.signal!r}"
                              f"{_suggest(str(label), spec.labels)}; known: {sorted(spec.labels)}")

    def contradictions(self, path: str, children: tuple[Condition, ...]) -> None:
        """Comparisons on the same signal inside one ``all`` that no value satisfies together."""
        by_signal: dict[str, list[Condition]] = {}
        for child in children:
            if child.signal is not None:
                by_signal.setdefault(child.signal, []).append(child)
        for signal, leaves in by_signal.items():
            if len(leaves) < 2:
                continue
            spec = spec_for_path(self.specs, signal) or SignalSpec()
            if _impossible(leaves, spec.kind):
                text = " and ".join(describe(leaf) for leaf in leaves)
                self.fail(path, f"impossible condition on {signal!r}: {text} can never all hold")


def shadowed_guards(route_name: str, cfg: RouteConfig) -> list[str]:
    """``block`` and ``redact`` rules that run after a ``route``/``tier``/``workflow`` rule, one line each.

    Rules run from the highest priority down and a routing rule ends them: the requests it decides
    are neither blocked nor redacted by rules below it. That may be meant (an in-house model that may
    see PII), so it is a warning, not a problem; a guard meant for every request needs a priority
    above the routing rules.
    """
    ordered = sorted(enumerate(cfg.rules), key=lambda item: -item[1].priority)  # as RulePolicy runs them
    router = None
    lines = []
    for index, rule in ordered:
        kind = rule.action.kind
        if kind in ("route", "tier", "workflow"):
            router = router or rule
        elif router is not None:
            done = "blocked" if kind == "block" else "redacted"
            lines.append(
                f"routes.{route_name}.rules.{index}: {kind} rule {rule.name!r} (priority {rule.priority}) runs after "
                f"{router.action.kind} rule {router.name!r} (priority {router.priority}): the requests that rule "
                f"decides are not {done}; give {rule.name!r} a higher priority if it must apply to them"
            )
    return lines


def quality_label_problems(
    mm: MultiModel, labels: Collection[str], source: str = "the quality signal"
) -> list[tuple[str, str]]:
    """``(key path, message)`` for each candidate whose quality key is not one of ``labels``.

    ``labels`` are the keys the quality signal reports (the trained quality head's model names);
    ``source`` names where they come from in the message.
    """
    known = set(labels)
    problems = []
    for i, name in enumerate(mm.candidates):
        key = mm.quality_key(name)
        if key in known:
            continue
        mapped = name in mm.quality_models
        path = f"multi_model.quality_models.{name}" if mapped else f"multi_model.candidates.{i}"
        fix = "" if mapped else f"; map it with multi_model.quality_models: {{{name}: <label>}}"
        problems.append((path, f"{key!r} is not a model of {source}{_suggest(key, known)}{fix}; "
                               f"known: {sorted(known)}"))
    return problems


def _impossible(leaves: list[Condition], kind: SignalKind) -> bool:
    bounds = _Bounds()
    numeric = False
    equal: set[Any] = set()
    unequal: set[Any] = set()
    allowed: set[Any] | None = None
    excluded: set[Any] = set()
    for leaf in leaves:
        op, value = leaf.op, leaf.value
        if op in ("gt", "ge", "lt", "le") or (op == "eq" and _is_number(value)):
            numeric = True
            bounds.narrow(str(op), float(value))
        if op == "eq":
            equal.add(_hashable(value))
        elif op == "ne":
            unequal.add(_hashable(value))
        elif op in ("in", "not_in") and kind is SignalKind.LABEL:
            # For a single label "in" is membership; for list-valued signals it means "intersects",
            # where two disjoint sets are no contradiction.
            values = {_hashable(v) for v in value}
            if op == "in":
                allowed = values if allowed is None else allowed & values
            else:
                excluded |= values
    if numeric and bounds.empty:
        return True
    if len(equal) > 1 or equal & unequal:
        return True
    if allowed is not None:
        remaining = allowed - excluded
        if equal:
            remaining &= equal
        return not remaining
    return bool(equal & excluded)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _suggest(name: str, options: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
