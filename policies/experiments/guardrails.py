"""Guardrail tests: is a served arm surely worse than the control beyond its experiment's bounds?

Pure arithmetic over the arms' totals (every replica's served requests, aggregated by the store) and
recent latencies; the gateway's monitor (``gateway/experiments/guardrails.py``) reads them, calls
:func:`check_arm` and stops the arm on a breach.

- **Error rate**: the always-valid confidence sequence of the rate difference
  (:func:`~policies.experiments.sequential.proportion_difference_cs`); a breach once its lower end is
  above ``max_error_rate_increase``. Re-testing every ``interval`` seconds is what a confidence
  sequence allows: the chance that an arm no worse than the bound is ever stopped stays ``alpha``.
- **Cost per request**: the confidence sequence of ``mean cost(arm) - max_cost_ratio x mean
  cost(control)`` from sufficient statistics; a breach once its lower end is above 0, i.e. the arm
  surely costs more than ``max_cost_ratio`` times the control per request.
- **p95 latency**: over the last ``window`` seconds, a breach when the arm's p95 is above
  ``max_p95_ratio`` times the control's (a windowed comparison, not a sequential test: latency
  trouble is about now, and a window of ``min_requests`` or more is what is required).

Each test runs only once both arms have ``min_requests`` requests (with a cost, for the cost test).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from policies.experiments.config import Guardrails
from policies.experiments.sequential import mean_difference_path, proportion_difference_cs

#: Guardrail names, as counted in ``pointsman_experiment_arm_stops_total{guardrail}`` and stored.
GUARDRAILS: tuple[str, ...] = ("error_rate", "cost", "latency_p95")


class Totals(Protocol):
    """An arm's aggregated served requests (``store.records.ArmTotals`` has these fields)."""

    requests: int
    errors: int
    cost_requests: int
    cost_sum: float
    cost_sq_sum: float


@dataclass(frozen=True, slots=True)
class Breach:
    """A guardrail an arm broke, with the numbers that show it (stored with the stop, and logged)."""

    guardrail: str
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the log."""
        shown = ", ".join(f"{k}={_short(v)}" for k, v in self.detail.items())
        return f"{self.guardrail} ({shown})"


def check_arm(
    arm: Totals,
    control: Totals,
    settings: Guardrails,
    arm_latencies: Sequence[float] = (),
    control_latencies: Sequence[float] = (),
) -> Breach | None:
    """The first guardrail ``arm`` breaks against ``control`` (error rate, cost, latency), or None."""
    minimum = settings.min_requests
    bound = settings.max_error_rate_increase
    if bound is not None and arm.requests >= minimum and control.requests >= minimum:
        cs = proportion_difference_cs(arm.errors, arm.requests, control.errors, control.requests, alpha=settings.alpha)
        if cs.lower > bound:
            return Breach("error_rate", {
                "arm_error_rate": arm.errors / arm.requests, "control_error_rate": control.errors / control.requests,
                "increase": cs.estimate, "lower": cs.lower, "upper": cs.upper, "bound": bound,
                "arm_requests": arm.requests, "control_requests": control.requests, "alpha": settings.alpha,
            })
    ratio = settings.max_cost_ratio
    if ratio is not None and arm.cost_requests >= minimum and control.cost_requests >= minimum:
        breach = _cost_breach(arm, control, ratio, settings.alpha)
        if breach is not None:
            return breach
    limit = settings.max_p95_ratio
    if limit is not None and len(arm_latencies) >= minimum and len(control_latencies) >= minimum:
        arm_p95, control_p95 = p95(arm_latencies), p95(control_latencies)
        if arm_p95 > limit * control_p95 and arm_p95 > 0:
            return Breach("latency_p95", {
                "arm_p95_ms": arm_p95, "control_p95_ms": control_p95,
                "ratio": arm_p95 / control_p95 if control_p95 > 0 else math.inf, "bound": limit,
                "window_s": settings.window, "arm_requests": len(arm_latencies),
                "control_requests": len(control_latencies),
            })
    return None


def _cost_breach(arm: Totals, control: Totals, ratio: float, alpha: float) -> Breach | None:
    arm_n, arm_mean, arm_var = _moments(arm)
    control_n, control_mean, control_var = _moments(control)
    # mean(arm) - ratio x mean(control): the control's costs scaled by the ratio are one more sample.
    path = mean_difference_path(
        np.array([arm_n]), np.array([arm_mean]), np.array([arm_var]),
        np.array([control_n]), np.array([ratio * control_mean]), np.array([ratio * ratio * control_var]),
        alpha=alpha,
    )
    cs = path.at(0)
    if not cs.lower > 0:
        return None
    return Breach("cost", {
        "arm_cost_per_request": arm_mean, "control_cost_per_request": control_mean,
        "ratio": arm_mean / control_mean if control_mean > 0 else math.inf, "bound": ratio,
        "excess_lower": cs.lower, "arm_requests": arm_n, "control_requests": control_n, "alpha": alpha,
    })


def _moments(totals: Totals) -> tuple[int, float, float]:
    """(n, mean, sample variance) of an arm's costs from its sums."""
    n = totals.cost_requests
    mean = totals.cost_sum / n
    variance = max((totals.cost_sq_sum - totals.cost_sum * totals.cost_sum / n) / (n - 1), 0.0) if n > 1 else math.nan
    return n, mean, variance


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank) of ``values`` (non-empty)."""
    ordered = sorted(values)
    return float(ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)])


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
