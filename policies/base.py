"""The policy interface the gateway calls for virtual routes (``auto`` and friends)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from policies.context import RequestContext
from policies.plan import Plan


class PolicyError(Exception):
    """A policy could not produce a plan (for example it blocks the request)."""

    def __init__(self, message: str, *, status: int = 400, code: str = "policy_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


@runtime_checkable
class Policy(Protocol):
    """Decides, per request, which models should answer it.

    Implementations must be cheap to call concurrently and must not perform backend calls: the
    gateway executes the returned plan (replicas, retries, fallbacks) itself.
    """

    name: str

    async def decide(self, ctx: RequestContext) -> Plan:
        """Return the plan for this request, or raise :class:`PolicyError`."""
        ...

    async def explain(self, ctx: RequestContext) -> dict[str, Any]:
        """The decision :meth:`decide` would make, as JSON-able data, changing no state (no calibration
        sample, no session pin): at least ``policy``, ``plan`` (``Plan.describe()``, None when
        blocked), ``model``, ``reason``, ``signals`` and ``blocked``. ``POST /v1/route``, ``pointsman
        route``, routing probes and offline replay all read it (through
        :func:`policies.brain.explain_request`). A blocked request is explained, not raised."""
        ...
