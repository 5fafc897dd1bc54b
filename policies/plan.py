"""A policy's answer: which models to try, in order, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, frozen=True)
class Plan:
    """An ordered list of candidate models: the first answers, the rest are fallbacks.

    ``reason`` is a short human-readable explanation recorded in the decision log; ``signals``
    holds whatever the policy computed on the way (empty for static routing). ``redact`` names the
    PII kinds the gateway must redact from the request body before forwarding it, and ``details``
    is the compact explanation (matched rules, score, threshold …) stored with the decision.
    ``workflow`` names the workflow (``policies.workflows``) that answers instead of one model; its
    only candidate is then the workflow's virtual model (``cascade/<name>`` …), and the gateway runs
    the workflow's sub-calls (each model with its own fallbacks) instead of forwarding once.
    Code that derives a plan from another must use ``dataclasses.replace`` so neither is lost.
    """

    candidates: tuple[str, ...]
    policy: str
    reason: str
    signals: dict[str, Any] = field(default_factory=dict)
    redact: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    workflow: str | None = None

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("a plan needs at least one candidate model")

    def describe(self) -> dict[str, Any]:
        """The compact form stored in the decision record."""
        described: dict[str, Any] = {
            "policy": self.policy, "candidates": list(self.candidates), "reason": self.reason
        }
        if self.workflow is not None:
            described["workflow"] = self.workflow
        if self.redact:
            described["redact"] = list(self.redact)
        if self.details:
            described["details"] = self.details
        return described
