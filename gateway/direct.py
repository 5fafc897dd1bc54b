"""Requests that name a concrete model or a workflow instead of a route: their fixed plans.

A client may send a configured model's name (it goes to that model, then the model's own
``fallbacks``) or a workflow's virtual model (``cascade/<name>``). Neither asks a policy, so their
plans never change: they are built once from the config, and ``POST /v1/route`` and
``pointsman route`` explain them the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.config import Config
from policies import Plan
from policies.brain import ActiveRouter


def direct_plans(config: Config) -> dict[str, Plan]:
    """The plan for every configured model name and every workflow's virtual model name."""
    plans = {
        model.name: Plan(
            candidates=dedupe((model.name, *model.fallbacks)), policy="direct", reason="model requested by name"
        )
        for backend in config.backends
        for model in backend.models
    }
    for workflow in config.workflows:
        plans[workflow.model_name] = Plan(
            candidates=(workflow.model_name,), policy="direct", reason="workflow requested by name",
            workflow=workflow.name,
        )
    return plans


def explain_direct(plan: Plan, router: ActiveRouter | None) -> dict[str, Any]:
    """The explanation of a direct plan (no route, no policy scores), with the active router version."""
    explanation: dict[str, Any] = {
        "route": None, "policy": "direct", "plan": plan.describe(), "model": plan.candidates[0], "reason": plan.reason,
    }
    if router is not None:
        explanation["router_version"] = router.version
    return explanation


def dedupe(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` in their first-seen order, each once."""
    return tuple(dict.fromkeys(names))
