"""The policy an arm decides with, beside the route's own.

- the control and a plain arm (no ``policy``/``model``/``router_version``) decide with the route's
  policy: the control with the route's very object (its knob window, its sessions), a plain
  non-control arm with its own copy (an A/A test must not share state between its arms);
- a ``policy`` arm with the route's config, its overrides applied (:func:`~policies.experiments.config.arm_route`);
- a ``router_version`` arm with the route's config over that version's heads;
- a ``model`` arm with :class:`FixedModelPolicy`: every request to that model (then the route's fallbacks).

The brain (``policies/brain/build.py``) builds them, so the encoder, scan workers and router versions
are shared as for any route; this module holds what needs none of that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.base import Policy
from policies.context import RequestContext
from policies.plan import Plan


@dataclass(frozen=True, slots=True)
class ArmPolicy:
    """An arm of an experiment and the policy it decides with.

    ``router_version`` is the version id a ``router_version`` arm decides on (what its decision records
    and ``x-pointsman-router`` report), None for arms on the active router.
    """

    experiment: str
    arm: str
    policy: Policy
    kind: str
    router_version: str | None = None


class FixedModelPolicy:
    """A ``model`` arm: every request of the route to ``model``, then ``fallbacks`` (a workflow's
    virtual model takes none). Implements :class:`policies.Policy`."""

    def __init__(
        self, route: str, experiment: str, arm: str, model: str, fallbacks: Sequence[str] = (),
        *, workflow: str | None = None,
    ) -> None:
        self.name = f"experiment:{experiment}/{arm}"
        self.route = route
        self._plan = Plan(
            candidates=(model,) if workflow is not None else tuple(dict.fromkeys((model, *fallbacks))),
            policy="static",
            reason=f"experiment {experiment!r} arm {arm!r} serves {model!r}",
            workflow=workflow,
        )

    async def decide(self, ctx: RequestContext) -> Plan:
        return self._plan

    async def explain(self, ctx: RequestContext) -> dict[str, Any]:
        """The fixed plan, in the shape every policy explains itself in."""
        plan = self._plan
        return {
            "route": self.route, "policy": plan.policy, "signals": {}, "rules": [], "blocked": None, "error": None,
            "plan": plan.describe(), "model": plan.candidates[0], "reason": plan.reason,
        }


def heads_key(route: str, experiment: str, arm: str) -> str:
    """The name an arm's route config is known by among a router version's per-route heads."""
    return f"{route}@{experiment}/{arm}"
