"""The guardrail tests an arm's totals go through: an arm surely worse than the control beyond its bound is
stopped, one that is not (or not yet known) is not, and checking again and again does not raise the
chance of stopping an arm that is as good as the control."""

from __future__ import annotations

import numpy as np
import pytest

from policies.experiments.config import Guardrails
from policies.experiments.guardrails import check_arm, p95
from store.records import ArmTotals

SETTINGS = Guardrails(min_requests=50, max_error_rate_increase=0.05, max_cost_ratio=1.5, max_p95_ratio=2.0)


def totals(requests: int, errors: int = 0, cost: float | None = None, spread: float = 0.0) -> ArmTotals:
    """``requests`` with ``errors`` failures and costs around ``cost`` (+- ``spread``, half each way)."""
    if cost is None:
        return ArmTotals("x", requests, errors)
    lo, hi = cost - spread, cost + spread
    half = requests // 2
    values = [lo] * half + [hi] * (requests - half)
    return ArmTotals("x", requests, errors, requests, sum(values), sum(v * v for v in values), requests)


def test_an_arm_whose_errors_surely_exceed_the_bound_is_stopped() -> None:
    breach = check_arm(totals(200, errors=60), totals(200, errors=2), SETTINGS)
    assert breach is not None and breach.guardrail == "error_rate"
    assert breach.detail["lower"] > 0.05 and breach.detail["arm_error_rate"] == 0.3
    # Under min_requests nothing is decided, however bad it looks.
    assert check_arm(totals(40, errors=40), totals(200), SETTINGS) is None
    # Worse, but not surely beyond the bound.
    assert check_arm(totals(200, errors=16), totals(200, errors=6), SETTINGS) is None


def test_an_arm_that_surely_costs_more_than_the_ratio_is_stopped() -> None:
    breach = check_arm(totals(300, cost=0.004, spread=0.001), totals(300, cost=0.002, spread=0.001), SETTINGS)
    assert breach is not None and breach.guardrail == "cost" and breach.detail["ratio"] == pytest.approx(2.0)
    # 1.3 x the control's cost is within a 1.5 bound.
    assert check_arm(totals(300, cost=0.0026, spread=0.001), totals(300, cost=0.002, spread=0.001), SETTINGS) is None
    assert check_arm(totals(300, cost=0.004), totals(300, cost=0.002), SETTINGS.model_copy(
        update={"max_cost_ratio": None})) is None  # null turns it off


def test_a_slow_arm_is_stopped_on_its_windowed_p95() -> None:
    fast, slow = [100.0] * 60, [100.0] * 50 + [900.0] * 10
    breach = check_arm(totals(60), totals(60), SETTINGS, slow, fast)
    assert breach is not None and breach.guardrail == "latency_p95" and breach.detail["arm_p95_ms"] == 900.0
    assert check_arm(totals(60), totals(60), SETTINGS, slow[:40], fast) is None  # too few in the window
    assert p95([float(i) for i in range(1, 101)]) == 95.0


def test_checking_every_interval_keeps_the_false_stop_rate_near_alpha() -> None:
    """An arm exactly as good as the control, checked after every 50 requests up to 2,000: a fixed-size
    test read this often would stop it far more often than alpha; the confidence sequence does not."""
    rng = np.random.default_rng(7)
    settings = Guardrails(min_requests=50, alpha=0.05, max_error_rate_increase=0.0, max_cost_ratio=None,
                          max_p95_ratio=None)
    runs, looks, step = 300, 40, 50
    stopped = 0
    for _ in range(runs):
        arm = np.cumsum(rng.random(looks * step) < 0.1)
        control = np.cumsum(rng.random(looks * step) < 0.1)
        for look in range(1, looks + 1):
            n = look * step
            if check_arm(totals(n, int(arm[n - 1])), totals(n, int(control[n - 1])), settings) is not None:
                stopped += 1
                break
    assert stopped / runs <= 0.08, stopped / runs
