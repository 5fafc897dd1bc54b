"""The simplest policy: a route always goes to one configured model, then its fallbacks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.context import RequestContext
from policies.plan import Plan


class StaticPolicy:
    """Route every request of a virtual route to ``model``; ``fallbacks`` follow in order.

    With ``workflow`` (a workflow's name), ``model`` is that workflow's virtual model and the plan
    has the workflow answer.
    """

    def __init__(
        self,
        route: str,
        model: str,
        fallbacks: Sequence[str] = (),
        *,
        workflow: str | None = None,
        name: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.name = name or f"static:{route}"
        self.route = route
        self._plan = Plan(
            # A fallback equal to the model (or repeated) would only retry the same call.
            candidates=(model,) if workflow is not None else tuple(dict.fromkeys((model, *fallbacks))),
            policy="static",
            reason=reason or f"route {route!r} is configured to use {model!r}",
            workflow=workflow,
        )

    async def decide(self, ctx: RequestContext) -> Plan:
        return self._plan

    async def explain(self, ctx: RequestContext) -> dict[str, Any]:
        """The fixed plan, in the shape every policy explains itself in (no signals, no rules)."""
        plan = self._plan
        return {
            "route": self.route, "policy": plan.policy, "signals": {}, "rules": [], "blocked": None, "error": None,
            "plan": plan.describe(), "model": plan.candidates[0], "reason": plan.reason,
        }
