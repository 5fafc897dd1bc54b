"""Cascade accounting and curves on a tiny hand-made table whose numbers are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evals.cascade import (
    GPT4_1106_PRICES,
    MIXTRAL_8X7B_PRICES,
    PairTable,
    PolicySpec,
    Prices,
    apply_escalation_stack,
    bootstrap_costs,
    cascade_curve,
    choose_direct_share,
    cost_at_quality,
    direct_mask,
    estimate_tokens,
    fit_escalation_stack,
    mix_curve,
    outcome,
    relative_cost_at,
    router_curve,
    share_threshold,
    summarize_costs,
)

# Four prompts. Strong right on 0, 1, 2; weak right on 0 and 3.
# A strong call costs 10 on every prompt, a weak call 1.
TABLE = PairTable(
    strong_quality=np.array([1.0, 1.0, 1.0, 0.0]),
    weak_quality=np.array([1.0, 0.0, 0.0, 1.0]),
    strong_cost=np.array([10.0, 10.0, 10.0, 10.0]),
    weak_cost=np.array([1.0, 1.0, 1.0, 1.0]),
)


def test_prices_and_token_estimate() -> None:
    assert estimate_tokens("abcdefgh") == 2.0
    # 1,000 prompt tokens and 2,000 output tokens on GPT-4-1106: 1000 * 10 / 1e6 + 2000 * 30 / 1e6.
    assert float(GPT4_1106_PRICES.call_cost(1000, 2000)) == pytest.approx(0.07)
    assert float(MIXTRAL_8X7B_PRICES.call_cost(1000, 2000)) == pytest.approx(0.0018)
    assert Prices(1.0, 2.0).call_cost(np.array([1e6, 0.0]), np.array([0.0, 1e6])).tolist() == [1.0, 2.0]


def test_outcome_pays_every_call_made() -> None:
    # A cascade that escalates prompts 1 and 2: four weak calls, two strong calls, strong served on 1 and 2.
    escalated = np.array([False, True, True, False])
    out = outcome(TABLE, weak_called=np.ones(4, bool), strong_called=escalated, served_strong=escalated)
    assert out.quality == 1.0  # 1 (weak) + 1 + 1 (strong) + 1 (weak)
    assert out.cost == (4 * 1 + 2 * 10) / 4  # 6.0
    assert (out.weak_calls, out.strong_calls) == (1.0, 0.5)
    # The same prompts routed before answering: no weak call on them.
    routed = outcome(TABLE, weak_called=~escalated, strong_called=escalated, served_strong=escalated)
    assert routed.cost == (2 * 1 + 2 * 10) / 4  # 5.5
    with pytest.raises(ValueError, match="served"):
        outcome(TABLE, weak_called=np.zeros(4, bool), strong_called=escalated, served_strong=escalated)


def test_router_curve_points() -> None:
    curve = router_curve(TABLE, np.array([0.1, 0.9, 0.8, 0.2]))
    # Thresholds: none strong, then prompts 1, 1+2, 1+2+3, all four.
    assert curve.quality.tolist() == pytest.approx([0.5, 0.75, 1.0, 0.75, 0.75])
    assert curve.cost.tolist() == pytest.approx([1.0, 3.25, 5.5, 7.75, 10.0])
    assert curve.strong_calls.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert curve.weak_calls.tolist() == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_cascade_curve_counts_the_weak_call_on_every_prompt() -> None:
    curve = cascade_curve(TABLE, np.array([0.1, 0.9, 0.8, 0.2]))
    assert curve.quality.tolist() == pytest.approx([0.5, 0.75, 1.0, 0.75, 0.75])
    assert curve.cost.tolist() == pytest.approx([1.0, 3.5, 6.0, 8.5, 11.0])
    assert curve.weak_calls.tolist() == [1.0] * 5
    # Mean quality 1.0 (every prompt right): escalate prompts 1 and 2 -> mean cost 6.0.
    assert cost_at_quality(curve, 1.0) == pytest.approx(6.0)
    # 100% of always-strong's quality (0.75): escalate prompt 1 -> 3.5, 35% of always-strong's cost (10).
    assert relative_cost_at(curve, TABLE, 1.0) == pytest.approx(0.35)
    # 95% of it (0.7125): between (1.0, 0.5) and (3.5, 0.75), by mixing the two thresholds.
    assert relative_cost_at(curve, TABLE, 0.95) == pytest.approx((1.0 + 2.5 * 0.85) / 10)


def test_ties_are_one_threshold() -> None:
    curve = cascade_curve(TABLE, np.array([0.5, 0.5, 0.5, 0.1]))
    assert curve.strong_calls.tolist() == pytest.approx([0.0, 0.75, 1.0])
    assert curve.cost.tolist() == pytest.approx([1.0, 8.5, 11.0])


def test_combined_policy_sends_direct_prompts_to_strong_only() -> None:
    direct = np.array([False, True, False, False])
    curve = cascade_curve(TABLE, np.array([0.1, 0.0, 0.8, 0.2]), direct)
    # Base: prompt 1 strong only (10), prompts 0, 2, 3 weak (3): cost 13 / 4; quality (1 + 1 + 0 + 1) / 4.
    assert curve.cost[0] == pytest.approx(13 / 4)
    assert curve.quality[0] == pytest.approx(0.75)
    assert curve.strong_calls[0] == pytest.approx(0.25)
    assert curve.weak_calls.tolist() == pytest.approx([0.75] * 4)
    # Escalating prompt 2 next adds its strong call (10) and its gain (+1).
    assert curve.cost[1] == pytest.approx(23 / 4)
    assert curve.quality[1] == pytest.approx(1.0)


def test_mix_curve_and_unreached_targets() -> None:
    mix = mix_curve(TABLE)
    # Always-weak 0.5 at 1, always-strong 0.75 at 10: 95% of 0.75 = 0.7125 -> 1 + 9 * (0.2125 / 0.25).
    assert relative_cost_at(mix, TABLE, 0.95) == pytest.approx((1 + 9 * 0.85) / 10)
    assert math.isnan(relative_cost_at(mix, TABLE, 1.2))


def test_direct_share_and_thresholds() -> None:
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    assert share_threshold(scores, 0.0) == math.inf
    assert direct_mask(scores, share_threshold(scores, 0.4)).tolist() == [False, False, False, True, True]
    router = np.array([0.0, 1.0, 0.0, 0.0])
    best, costs = choose_direct_share(TABLE, router, np.array([0.1, 0.9, 0.8, 0.2]), (0.0, 0.25), 1.0)
    # No direct prompts: the plain cascade, 0.35. Share 0.25: prompt 1 goes straight to strong, skipping its
    # weak call; the rest weak already gives 0.75 = strong's quality at (10 + 3 * 1) / 4 = 3.25 -> 0.325.
    assert costs[0.0] == pytest.approx(0.35)
    assert costs[0.25] == pytest.approx(0.325)
    assert best == 0.25


def test_escalation_stack_recovers_a_linear_gain() -> None:
    x = np.array([[1.0], [0.0], [2.0], [3.0]])
    table = PairTable(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 0.0, 0.0]), np.ones(4), np.ones(4))
    w = fit_escalation_stack(x, table, alpha=0.0)
    pred = apply_escalation_stack(x, w)
    assert pred.shape == (4,)
    assert np.corrcoef(pred, table.strong_quality)[0, 1] > 0.7


def test_bootstrap_is_paired_and_summarised() -> None:
    rng = np.random.default_rng(0)
    n = 200
    qs = (rng.random(n) < 0.85).astype(float)
    qw = (rng.random(n) < 0.6).astype(float)
    table = PairTable(qs, qw, np.full(n, 10.0), np.full(n, 0.2))
    policies = [
        PolicySpec("mix", "mix"),
        PolicySpec("oracle", "cascade", qs - qw),
        PolicySpec("router", "route", rng.random(n)),
    ]
    boot = bootstrap_costs(table, policies, (0.95,), draws=30, seed=1)
    summary = summarize_costs(table, policies, boot, (0.95,))
    assert set(summary) == {"mix", "oracle", "router"}
    assert summary["oracle"]["0.95"]["relative_cost"] < summary["mix"]["0.95"]["relative_cost"]  # type: ignore[operator]
    lo, hi = summary["oracle"]["0.95"]["ci95"]  # type: ignore[misc]
    assert lo <= hi
    with pytest.raises(ValueError, match="scores"):
        PolicySpec("broken", "route").curve(table)


def test_answer_head_knobs() -> None:
    from evals.train_answer_confidence import HeadConfig, fit_answer_head

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6))  # 4 embedding columns, then 2 check columns
    y = (x[:, 0] + x[:, 5] > 0).astype(int)
    w = np.ones(200)
    checks_only = fit_answer_head(x, y, w, 4, HeadConfig(C=1.0, emb_weight=0.0, strong_weight=0.0))
    assert (checks_only.params["coef"][0, :4] == 0).all() and (checks_only.params["coef"][0, 4:] != 0).all()
    emb_only = fit_answer_head(x, y, w, 4, HeadConfig(C=1.0, emb_weight=1.0, strong_weight=0.0, use_checks=False))
    assert (emb_only.params["coef"][0, 4:] == 0).all()
    # The embedding weight is folded into the head's scale: scoring needs no extra step.
    half = fit_answer_head(x, y, w, 4, HeadConfig(C=1.0, emb_weight=0.5, strong_weight=0.0))
    assert half.params["scale"][:4] == pytest.approx(x[:, :4].std(axis=0) / 0.5)
    assert half.predict_proba(x).shape == (200, 2)
    with pytest.raises(ValueError, match="embedding"):
        fit_answer_head(x, y, w, 4, HeadConfig(C=1.0, emb_weight=0.0, strong_weight=0.0, use_checks=False))
