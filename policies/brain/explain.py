"""One way to ask a route's policy about a request: the context it sees and what it decides.

``POST /v1/route``, ``pointsman route``, routing probes and ``pointsman eval``'s replay all build the
:class:`RequestContext` with :func:`request_context` and read the decision with
:func:`explain_policy` (or :func:`explain_request` / :func:`decide_request` given a :class:`Brain`),
so an offline answer is the one serving would give. With a router, the computation is pinned to one
router version and the explanation says which (``router_version``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.base import Policy
from policies.brain.active import ActiveRouter
from policies.brain.build import Brain
from policies.context import RequestContext
from policies.plan import Plan
from policies.sticky import SESSION_HEADER

CHAT_ENDPOINT = "chat.completions"


def request_context(
    route: str,
    body: Mapping[str, Any],
    *,
    request_id: str = "offline",
    endpoint: str = CHAT_ENDPOINT,
    tenant: str | None = None,
    headers: Mapping[str, str] | None = None,
    raw_body: bytes | None = None,
) -> RequestContext:
    """What a policy sees of a request on ``route``. ``headers`` (lower-case names for a plain dict)
    carry the per-request threshold override and the session id (``x-pointsman-session-id``)."""
    headers = headers if headers is not None else {}
    return RequestContext(
        request_id=request_id, endpoint=endpoint, route=route, body=body, tenant=tenant,
        session_id=headers.get(SESSION_HEADER), headers=headers, raw_body=raw_body,
    )


async def explain_policy(policy: Policy, ctx: RequestContext, router: ActiveRouter | None = None) -> dict[str, Any]:
    """``policy.explain(ctx)`` with the route named first and, given ``router``, the router version
    it was computed on (``router_version``)."""
    if router is None:
        return {"route": ctx.route, **await policy.explain(ctx)}
    with router.pin() as version:
        explained = await policy.explain(ctx)
    return {"route": ctx.route, **explained, "router_version": version.version}


async def explain_request(brain: Brain, route: str, body: Mapping[str, Any], **context: Any) -> dict[str, Any]:
    """The explanation of ``body`` on ``route`` (``KeyError`` for an unknown route); ``context`` goes
    to :func:`request_context` (``headers``, ``request_id``, ``tenant`` …)."""
    return await explain_policy(brain.policy(route), request_context(route, body, **context), brain.router)


async def decide_request(brain: Brain, route: str, body: Mapping[str, Any], **context: Any) -> Plan:
    """The plan serving would execute for ``body`` on ``route`` (``Policy.decide``: a target-share knob
    records the score); raises ``policies.PolicyError`` when the policy blocks the request."""
    policy = brain.policy(route)
    with brain.router.pin():
        return await policy.decide(request_context(route, body, **context))
