"""The simplest policy: a route always goes to one configured model, then its fallbacks."""

from __future__ import annotations

from collections.abc import Sequence

from policies.context import RequestContext
from policies.plan import Plan


class StaticPolicy:
    """Route every request of a virtual route to ``model``; ``fallbacks`` follow in order."""

    def __init__(self, route: str, model: str, fallbacks: Sequence[str] = ()) -> None:
        self.name = f"static:{route}"
        self._plan = Plan(
            candidates=(model, *fallbacks),
            policy="static",
            reason=f"route {route!r} is configured to use {model!r}",
        )

    async def decide(self, ctx: RequestContext) -> Plan:
        return self._plan
