"""Routing policies: given a request's context, return a :class:`Plan` of models to try."""

from policies.base import Policy, PolicyError
from policies.context import RequestContext
from policies.plan import Plan
from policies.static import StaticPolicy

__all__ = ["Plan", "Policy", "PolicyError", "RequestContext", "StaticPolicy"]
