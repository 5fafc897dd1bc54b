"""The declarative policy: rules by priority, then the cost-quality knob or the multi-model
choice (or a default model), then session stickiness.

One decision:

1. read the per-request threshold override (``x-pointsman-threshold``, 400 if malformed);
2. compute, through the route's :class:`~policies.signals.SignalProvider`, only the signals the
   policy refers to;
3. run the rules from the highest priority down: ``redact`` rules accumulate PII kinds and go on,
   the first matching ``block`` raises :class:`PolicyError`, the first matching ``route``/``tier``/
   ``workflow`` decides (rule routes are explicit, so stickiness does not override them);
4. otherwise the default decides — knob (strong if score >= threshold; with ``explore`` a share
   epsilon of these decisions is made at random, its propensity logged), utility argmax, or the
   default model; a knob score in its ``middle`` band goes to that workflow instead — and
   stickiness may keep the conversation on its earlier model (never for a workflow decision);
5. the :class:`Plan` lists the model, then the rule's and the route's fallbacks, with the signals,
   the redaction and a compact explanation. :meth:`RulePolicy.explain` returns the full story
   (every rule with its checks) and changes no state: no calibration sample, no session pin.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.base import PolicyError
from policies.conditions import describe, evaluate, signals_used
from policies.config import RouteConfig, Rule
from policies.context import RequestContext
from policies.explore import Exploration, explore_pair, request_fraction
from policies.knob import CostQualityKnob, KnobDecision, threshold_override
from policies.plan import Plan
from policies.signals import SignalLike, SignalProvider, resolve, signal_name
from policies.sticky import SessionStore, SessionStoreUnavailable, StickySessions, session_key
from policies.utility import Choice, ModelInfo, UtilityChooser

POLICY_NAME = "rules"
#: Salt of the per-request draw that splits a tie at the knob's calibrated threshold.
TIE_PURPOSE = "knob-tie"


@dataclass
class _Outcome:
    """Everything one evaluation found; turned into a Plan, an error, or an explanation."""

    signals: dict[str, SignalLike]
    rules: list[dict[str, Any]] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    redact: list[str] = field(default_factory=list)
    blocked: Rule | None = None
    model: str | None = None
    fallbacks: tuple[str, ...] = ()
    reason: str = ""
    knob: KnobDecision | None = None
    knob_signal: str | None = None
    choice: Choice | None = None
    sticky: dict[str, Any] | None = None
    error: PolicyError | None = None
    explore: Exploration | None = None
    propensity: float | None = None  # of the served model; None when the decision was not randomised
    workflow: str | None = None  # the workflow that answers (``model`` is then its virtual model)
    band: tuple[float, float] | None = None  # the knob's middle band, when it chose the workflow
    tie: float | None = None  # P(the knob chose strong) when its score fell in a tie it splits at random


class RulePolicy:
    """The ``policy: rules`` route policy (implements :class:`policies.Policy`).

    ``provider`` computes signals for this route; ``models`` describes the configured models
    (prices, context windows, tags) for the multi-model choice and for judging which model is
    stronger; ``historic_scores`` seeds the knob's calibration window (target-share mode).
    ``explore=False`` turns the route's ``explore`` section off (offline replay must be
    deterministic); :meth:`set_exploration` switches it later. ``workflows`` maps each configured
    workflow's name to its virtual model (``cascade/<name>`` …), for workflow decisions.
    """

    def __init__(
        self,
        route: str,
        config: RouteConfig,
        provider: SignalProvider,
        models: Mapping[str, ModelInfo] | None = None,
        *,
        historic_scores: Iterable[float] = (),
        clock: Callable[[], float] = time.monotonic,
        explore: bool = True,
        workflows: Mapping[str, str] | None = None,
    ) -> None:
        if config.policy != POLICY_NAME:
            raise ValueError(f"route {route!r} has policy {config.policy!r}, not {POLICY_NAME!r}")
        self.name = f"{POLICY_NAME}:{route}"
        self.route = route
        self.config = config
        self.provider = provider
        self.models = dict(models or {})
        self.workflows = dict(workflows or {})
        self._workflow_of = {model: name for name, model in self.workflows.items()}
        # Highest priority first; sorted() is stable, so equal priorities keep file order.
        self.rules = tuple(sorted(config.rules, key=lambda rule: -rule.priority))
        needed: set[str] = set()
        for rule in self.rules:
            needed |= signals_used(rule.when)
        cq, mm = config.cost_quality, config.multi_model
        self.knob: CostQualityKnob | None = None
        if cq is not None:
            needed.add(signal_name(cq.signal))
            self.knob = CostQualityKnob(
                threshold=cq.threshold, target_share=cq.target_strong_share,
                window=cq.window, min_samples=cq.min_samples, seed=historic_scores,
            )
        self.chooser: UtilityChooser | None = None
        if mm is not None:
            needed.add(signal_name(mm.quality_signal))
            self.chooser = UtilityChooser(
                mm.candidates, mm.lambda_, self.models, costs=mm.costs, require_tags=mm.require_tags,
                quality_keys=mm.quality_models,
            )
        self.needed_signals = frozenset(needed)
        sticky = config.sticky
        # In this process by default; the gateway swaps in a shared store (Redis) at start-up when
        # ``shared_state`` says so (:meth:`use_session_store`).
        self.sessions: SessionStore | None = None
        if sticky is not None and sticky.enabled:
            self.sessions = StickySessions(sticky.ttl, sticky.max_sessions, clock)
        self._strength = sticky.order if sticky and sticky.order else ((cq.weak, cq.strong) if cq else ())
        # The models a default decision can choose: a session pinned to any other (a model since removed
        # from the config or from this route, pinned in Redis by an earlier deployment) moves, or each of
        # its turns would be sent to a model this route no longer serves.
        self._default_models = frozenset(
            (cq.weak, cq.strong) if cq else mm.candidates if mm else (config.model,) if config.model else ()
        )
        self.exploring = explore and config.explore is not None and config.explore.epsilon > 0.0

    def set_exploration(self, enabled: bool) -> None:
        """Turn the route's ``explore`` section on or off (a no-op when the route has none)."""
        self.exploring = enabled and self.config.explore is not None and self.config.explore.epsilon > 0.0

    def use_session_store(self, store: SessionStore) -> None:
        """Keep this route's sessions in ``store`` instead of in this process (sticky routes only)."""
        if self.sessions is None:
            raise ValueError(f"route {self.route!r} has no session stickiness")
        self.sessions = store

    async def decide(self, ctx: RequestContext) -> Plan:
        """The plan for this request; raises :class:`PolicyError` when blocked or unservable."""
        outcome = await self._evaluate(ctx, commit=True)
        if outcome.error is not None:
            raise outcome.error
        return self._plan(outcome)

    async def explain(self, ctx: RequestContext) -> dict[str, Any]:
        """The full decision for ``POST /v1/route``: signals, every rule with its checks, the knob or
        utility scores, stickiness, the plan and the chosen model. A blocked request is explained,
        not raised; a malformed threshold override still raises :class:`PolicyError`.
        """
        outcome = await self._evaluate(ctx, commit=False)
        plan = None if outcome.error is not None else self._plan(outcome)
        explained: dict[str, Any] = {
            "route": self.route,
            "policy": POLICY_NAME,
            "signals": {name: signal.as_dict() for name, signal in outcome.signals.items()},
            "rules": outcome.rules,
            "matched_rules": outcome.applied,
            "redact": outcome.redact,
            "knob": self._knob_dict(outcome),
            "multi_model": self._choice_dict(outcome.choice),
            "sticky": outcome.sticky,
            "blocked": None,
            "error": None,
            "plan": None if plan is None else plan.describe(),
            "model": None if plan is None else plan.candidates[0],
            "reason": outcome.reason if plan is None else plan.reason,
        }
        if outcome.blocked is not None:
            action = outcome.blocked.action
            explained["blocked"] = {"rule": outcome.blocked.name, "message": action.block, "status": action.status}
        elif outcome.error is not None:
            explained["error"] = {"message": outcome.error.message, "status": outcome.error.status,
                                  "code": outcome.error.code}
        return explained

    # -- evaluation -------------------------------------------------------------------------

    async def _evaluate(self, ctx: RequestContext, *, commit: bool) -> _Outcome:
        override = threshold_override(ctx.headers, ctx.body)
        signals: dict[str, SignalLike] = {}
        if self.needed_signals:
            signals = dict(await self.provider.compute(set(self.needed_signals), ctx))
        outcome = _Outcome(signals=signals)
        decided: Rule | None = None
        for rule in self.rules:
            stopped = decided is not None or outcome.blocked is not None
            if stopped and commit:
                break  # a live decision needs no verdict on rules that cannot apply
            trace: list[dict[str, Any]] | None = None if commit else []
            matched = evaluate(rule.when, signals, trace)
            applied = matched and not stopped
            if not commit:
                outcome.rules.append({
                    "name": rule.name, "priority": rule.priority, "action": rule.action.kind,
                    "when": describe(rule.when), "matched": matched, "applied": applied, "checks": trace,
                })
            if not applied:
                continue
            outcome.applied.append(rule.name)
            action = rule.action
            if action.kind == "redact":
                outcome.redact.extend(k for k in action.redact or () if k not in outcome.redact)
            elif action.kind == "block":
                outcome.blocked = rule
                outcome.reason = f"blocked by rule {rule.name!r} ({describe(rule.when)})"
                outcome.error = PolicyError(action.block or "blocked by policy", status=action.status,
                                            code="policy_blocked")
            else:
                decided = rule
        if outcome.blocked is not None:
            return outcome
        if decided is not None:
            self._route_by_rule(outcome, decided)
        else:
            self._default(outcome, ctx, override, commit)
            if outcome.model is not None and self.sessions is not None and outcome.workflow is None:
                await self._stick(outcome, ctx, commit)
        return outcome

    def _route_by_rule(self, outcome: _Outcome, rule: Rule) -> None:
        action = rule.action
        if action.workflow is not None:
            self._choose_workflow(outcome, action.workflow)
            outcome.reason = f"rule {rule.name!r} matched ({describe(rule.when)}) -> workflow {outcome.model}"
            return
        if action.route is not None:
            model = action.route
        else:
            cq = self.config.cost_quality
            assert cq is not None, "validate_policy rejects tier without cost_quality"
            model = cq.strong if action.tier == "strong" else cq.weak
        outcome.model = model
        outcome.fallbacks = (*action.fallbacks, *self.config.fallbacks)
        outcome.reason = f"rule {rule.name!r} matched ({describe(rule.when)}) -> {model}"

    def _default(self, outcome: _Outcome, ctx: RequestContext, override: float | None, commit: bool) -> None:
        cfg = self.config
        outcome.fallbacks = cfg.fallbacks
        prefix = "no rule routed; " if self.rules else ""
        if cfg.cost_quality is not None and self.knob is not None:
            cq = cfg.cost_quality
            outcome.knob_signal = cq.signal
            raw = resolve(outcome.signals, cq.signal)
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                # Without a score, err on the side of answer quality.
                outcome.model = cq.strong
                outcome.reason = f"{prefix}{cq.signal} unavailable -> strong model {cq.strong}"
                return
            decision = self.knob.decide(float(raw), override, draw=request_fraction(ctx.request_id, TIE_PURPOSE))
            if decision.tie_share is not None and decision.score == decision.threshold:
                outcome.tie = decision.tie_share
            if commit:
                self.knob.observe(float(raw))
            outcome.knob = decision
            if cq.middle is not None and cq.middle.holds(decision.score):
                # The uncertain middle: a workflow decides after seeing an answer (no exploration:
                # the logged propensity is about the strong/weak choice only).
                self._choose_workflow(outcome, cq.middle.workflow)
                outcome.band = cq.middle.band
                lo, hi = cq.middle.band
                outcome.reason = (
                    f"{prefix}{cq.signal} {decision.score:.3f} in the middle band [{lo:g}, {hi:g}) "
                    f"-> workflow {outcome.model}"
                )
                return
            outcome.model = cq.strong if decision.strong else cq.weak
            relation = ">=" if decision.strong else "<"
            tier = "strong" if decision.strong else "weak"
            outcome.reason = (
                f"{prefix}{cq.signal} {decision.score:.3f} {relation} threshold {decision.threshold:.3f} "
                f"({decision.source}) -> {tier} model {outcome.model}"
            )
            if outcome.tie is not None:
                outcome.reason += f" (a tie at the threshold: {outcome.tie:.2f} of ties go strong)"
            if self.exploring:
                assert cfg.explore is not None
                other = cq.weak if decision.strong else cq.strong
                draw = explore_pair(ctx.request_id, cfg.explore.epsilon, outcome.model, other)
                outcome.explore, outcome.model = draw, draw.served
                outcome.propensity = draw.probability(draw.served)
                if draw.served != draw.greedy:
                    outcome.reason += f"; explored (epsilon {draw.epsilon:g}) -> {draw.served}"
        elif cfg.multi_model is not None and self.chooser is not None:
            mm = cfg.multi_model
            choice = self.chooser.choose(resolve(outcome.signals, mm.quality_signal), ctx.body)
            outcome.choice = choice
            best = choice.best
            if best is None:
                reasons = "; ".join(f"{e.model}: {e.excluded}" for e in choice.ranked)
                outcome.reason = f"{prefix}no eligible model ({reasons})"
                outcome.error = PolicyError(
                    f"No model of route '{self.route}' can serve this request: {reasons}",
                    status=400, code="no_eligible_model",
                )
                return
            outcome.model = best.model
            outcome.reason = (
                f"{prefix}best utility {best.model}: quality {best.quality:.3f} - {choice.lam:g} x cost "
                f"{best.norm_cost:.3f} = {best.utility:.3f}"
            )
        else:
            assert cfg.model is not None, "RouteConfig requires a default decision"
            workflow = self._workflow_of.get(cfg.model)
            if workflow is not None:
                self._choose_workflow(outcome, workflow)
                outcome.fallbacks = ()
                outcome.reason = f"{prefix}default workflow {cfg.model}"
                return
            outcome.model = cfg.model
            outcome.reason = f"{prefix}default model {cfg.model}"

    def _choose_workflow(self, outcome: _Outcome, name: str) -> None:
        """The workflow ``name`` answers: its virtual model is the plan's only candidate."""
        outcome.workflow = name
        outcome.model = self.workflows.get(name, name)  # validation guarantees the name is known
        outcome.fallbacks = ()

    async def _stick(self, outcome: _Outcome, ctx: RequestContext, commit: bool) -> None:
        sessions, sticky = self.sessions, self.config.sticky
        assert sessions is not None and sticky is not None and outcome.model is not None
        key, source = session_key(ctx)
        chosen = outcome.model
        try:
            # A live decision claims the session in one step (a first turn is pinned right away);
            # an explanation only looks.
            prior = await (sessions.claim(key, chosen) if commit else sessions.lookup(key))
        except SessionStoreUnavailable:
            # Stickiness is best effort: the request is decided on its own rather than failed.
            outcome.sticky = {"session": source, "previous": None, "decided": chosen, "state": "unavailable",
                              "model": chosen}
            outcome.reason += "; session store unavailable, decided without stickiness"
            return
        eligible = outcome.choice.eligible if outcome.choice is not None else None
        state, model = self._session_choice(prior, chosen, eligible)
        if outcome.explore is not None:
            # The session may override the draw: the served model's probability is that of every
            # arm that leads to it given this session.
            outcome.propensity = outcome.explore.propensity_of(
                model, lambda arm: self._session_choice(prior, arm, eligible)[1]
            )
        stored = True
        if commit and state in ("escalated", "repinned"):  # "pinned" was stored by claim()
            try:
                await sessions.pin(key, model)
            except SessionStoreUnavailable:
                stored = False  # decided as usual; the next turn will not find this pin
        outcome.sticky = {"session": source, "previous": prior, "decided": chosen, "state": state, "model": model}
        if not stored:
            outcome.sticky["stored"] = False
            outcome.reason += "; session store unavailable, pin not kept"
        if model != chosen:
            outcome.reason += f"; session stays on {model}"
        elif state == "escalated":
            outcome.reason += f"; session escalated from {prior}"
        elif state == "repinned":
            outcome.reason += f"; session moved from ineligible {prior}"
        outcome.model = model

    def _session_choice(
        self, prior: str | None, chosen: str, eligible: Collection[str] | None
    ) -> tuple[str, str]:
        """(state, model) of a session whose model is ``prior`` when the decision says ``chosen``."""
        sticky = self.config.sticky
        assert sticky is not None
        if prior is None:
            return "pinned", chosen
        if prior == chosen:
            return "kept", chosen
        if prior not in self._default_models or (eligible is not None and prior not in eligible):
            return "repinned", chosen
        if self._stronger(chosen, prior):
            return ("escalated", chosen) if sticky.escalate else ("kept", prior)
        return "kept", prior

    def _stronger(self, new: str, old: str) -> bool:
        order = self._strength
        if new in order and old in order:
            return order.index(new) > order.index(old)
        unknown = ModelInfo("")
        return self.models.get(new, unknown).price > self.models.get(old, unknown).price

    # -- output -----------------------------------------------------------------------------

    def _plan(self, outcome: _Outcome) -> Plan:
        assert outcome.model is not None
        details: dict[str, Any] = {"rules": outcome.applied}
        if outcome.knob is not None:
            details.update(score=round(outcome.knob.score, 4), threshold=round(outcome.knob.threshold, 4),
                           threshold_source=outcome.knob.source)
            if outcome.tie is not None:
                details["tie_share"] = round(outcome.tie, 4)
        choice = outcome.choice
        best = choice.best if choice is not None else None
        if choice is not None and best is not None and best.utility is not None and best.quality is not None:
            details.update(utility=round(best.utility, 4), quality=round(best.quality, 4))
            # Every candidate's predicted quality, so the decision log shows what the choice was made from.
            details["qualities"] = {e.model: None if e.quality is None else round(e.quality, 4) for e in choice.ranked}
        if outcome.sticky is not None:
            details["sticky"] = outcome.sticky["state"]
        if outcome.explore is not None:
            details["explore"] = outcome.explore.as_dict()
            details["propensity"] = outcome.propensity
        if outcome.band is not None:
            details["band"] = list(outcome.band)
        return Plan(
            candidates=tuple(dict.fromkeys((outcome.model, *outcome.fallbacks))),
            policy=POLICY_NAME,
            reason=outcome.reason,
            signals={name: signal.as_dict() for name, signal in outcome.signals.items()},
            redact=tuple(outcome.redact),
            details=details,
            workflow=outcome.workflow,
        )

    def _knob_dict(self, outcome: _Outcome) -> dict[str, Any] | None:
        if self.knob is None:
            return None
        threshold, source = self.knob.threshold()
        knob: dict[str, Any] = {
            "signal": outcome.knob_signal or (self.config.cost_quality.signal if self.config.cost_quality else None),
            "threshold": threshold, "threshold_source": source, "samples": self.knob.samples,
            "target_strong_share": self.knob.target_share, "used": outcome.knob is not None,
        }
        if outcome.knob is not None:
            knob.update(score=outcome.knob.score, threshold=outcome.knob.threshold,
                        threshold_source=outcome.knob.source, strong=outcome.knob.strong)
            if outcome.tie is not None:
                knob["tie_share"] = outcome.tie
        return knob

    @staticmethod
    def _choice_dict(choice: Choice | None) -> dict[str, Any] | None:
        if choice is None:
            return None
        return {
            "lambda": choice.lam, "estimated_tokens": choice.needed_tokens, "tools": choice.tools,
            "ranking": [entry.as_dict() for entry in choice.ranked],
        }
