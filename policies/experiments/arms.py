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

from policies.base import Policy
from policies.static import StaticPolicy


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


class FixedModelPolicy(StaticPolicy):
    """A ``model`` arm: every request of the route to ``model``, then ``fallbacks`` (a workflow's
    virtual model takes none): a :class:`~policies.static.StaticPolicy` named and explained as the arm."""

    def __init__(
        self, route: str, experiment: str, arm: str, model: str, fallbacks: Sequence[str] = (),
        *, workflow: str | None = None,
    ) -> None:
        super().__init__(
            route, model, fallbacks, workflow=workflow, name=f"experiment:{experiment}/{arm}",
            reason=f"experiment {experiment!r} arm {arm!r} serves {model!r}",
        )


def heads_key(route: str, experiment: str, arm: str) -> str:
    """The name an arm's route config is known by among a router version's per-route heads."""
    return f"{route}@{experiment}/{arm}"
