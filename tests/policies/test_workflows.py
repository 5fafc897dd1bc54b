"""Policies that choose a workflow: a rule action, the knob's middle band, a default or static model
that is a workflow's virtual model. Pre-answer routing and post-answer escalation in one config."""

from __future__ import annotations

from typing import Any

import yaml

from policies import RouteConfig, RulePolicy, StaticPolicy, validate_policy
from policies.validation import policy_problems
from tests.policies.helpers import MODELS, TAGS
from tests.policies.signals import KNOWN_SIGNALS, TestSignals, request

WORKFLOWS = {"fast": "cascade/fast", "panel": "ratings/panel"}

ROUTE = """
name: auto
policy: rules
rules:
  - {name: tools-to-big, priority: 60, when: {signal: tools, op: truthy}, action: {route: big}}
  - {name: code-to-panel, priority: 50, when: {signal: domain, op: eq, value: code}, action: {workflow: panel}}
cost_quality:
  strong: big
  weak: small
  threshold: 0.5
  middle: {band: [0.35, 0.65], workflow: fast}
sticky: {ttl: 600}
explore: {epsilon: 0.5}
"""


def build(text: str) -> RulePolicy:
    cfg = RouteConfig.model_validate(yaml.safe_load(text))
    validate_policy(cfg.name, cfg, KNOWN_SIGNALS, set(MODELS), TAGS, workflows=WORKFLOWS)
    return RulePolicy(cfg.name, cfg, TestSignals({}), MODELS, workflows=WORKFLOWS)


async def test_a_rule_chooses_a_workflow() -> None:
    plan = await build(ROUTE).decide(request("Write a python function [d=0.9]"))
    assert plan.workflow == "panel" and plan.candidates == ("ratings/panel",)
    assert "code-to-panel" in plan.reason and "workflow ratings/panel" in plan.reason
    assert plan.describe()["workflow"] == "panel"


async def test_a_higher_rule_still_routes_to_a_model() -> None:
    plan = await build(ROUTE).decide(request("Write a python function", tools=True))
    assert plan.workflow is None and plan.candidates == ("big",)  # tools -> strong model, not the panel
    assert "workflow" not in plan.describe()


async def test_the_knobs_middle_band_goes_to_the_workflow() -> None:
    policy = build(ROUTE)
    for difficulty, workflow, model in [(0.2, None, "small"), (0.35, "fast", "cascade/fast"),
                                        (0.6, "fast", "cascade/fast"), (0.65, None, "big")]:
        plan = await policy.decide(request(f"Hello [d={difficulty}]", session_id="s-" + str(difficulty)))
        assert plan.workflow == workflow, difficulty
        if workflow is None:
            assert plan.candidates[0] in ("small", "big")  # exploration may pick either
            assert "propensity" in plan.details
        else:
            assert plan.candidates == (model,) and plan.details["band"] == [0.35, 0.65]
            assert "middle band [0.35, 0.65)" in plan.reason
            # A workflow decision is neither explored nor pinned to the session.
            assert "propensity" not in plan.details and "sticky" not in plan.details


async def test_the_explanation_shows_the_workflow() -> None:
    explained = await build(ROUTE).explain(request("Hello [d=0.5]"))
    assert explained["plan"]["workflow"] == "fast" and explained["model"] == "cascade/fast"


async def test_a_default_model_may_be_a_workflow() -> None:
    text = "name: auto\npolicy: rules\nmodel: cascade/fast\nfallbacks: [small]\n"
    plan = await build(text).decide(request("Hello"))
    assert plan.workflow == "fast" and plan.candidates == ("cascade/fast",)  # a workflow has no route fallbacks


async def test_a_static_route_to_a_workflow() -> None:
    plan = await StaticPolicy("careful", "cascade/fast", workflow="fast").decide(request("Hello"))
    assert plan.workflow == "fast" and plan.candidates == ("cascade/fast",)


def test_unknown_workflows_are_named() -> None:
    cfg: dict[str, Any] = yaml.safe_load(ROUTE)
    cfg["rules"][1]["action"]["workflow"] = "pannel"
    cfg["cost_quality"]["middle"]["workflow"] = "slow"
    problems = policy_problems("auto", RouteConfig.model_validate(cfg), KNOWN_SIGNALS, set(MODELS), TAGS,
                               workflows=WORKFLOWS)
    assert problems == [
        "routes.auto.rules.1.action.workflow: unknown workflow 'pannel' (did you mean 'panel'?); "
        "workflows: fast, panel",
        "routes.auto.cost_quality.middle.workflow: unknown workflow 'slow'; workflows: fast, panel",
    ]
