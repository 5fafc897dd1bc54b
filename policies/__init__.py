"""Routing policies: given a request's context, return a :class:`Plan` of models to try."""

from policies.base import Policy, PolicyError
from policies.config import RouteConfig
from policies.context import RequestContext
from policies.knob import THRESHOLD_HEADER, CostQualityKnob
from policies.plan import Plan
from policies.rules import RulePolicy
from policies.signals import DEFAULT_SIGNAL_SPECS, SignalKind, SignalLike, SignalProvider, SignalSpec
from policies.static import StaticPolicy
from policies.sticky import SESSION_HEADER, StickySessions
from policies.utility import ModelInfo, UtilityChooser
from policies.validation import policy_problems, validate_policy

__all__ = [
    "DEFAULT_SIGNAL_SPECS",
    "SESSION_HEADER",
    "THRESHOLD_HEADER",
    "CostQualityKnob",
    "ModelInfo",
    "Plan",
    "Policy",
    "PolicyError",
    "RequestContext",
    "RouteConfig",
    "RulePolicy",
    "SignalKind",
    "SignalLike",
    "SignalProvider",
    "SignalSpec",
    "StaticPolicy",
    "StickySessions",
    "UtilityChooser",
    "policy_problems",
    "validate_policy",
]
