"""Multi-model choice: quality - lambda x normalised cost over eligible models."""

from __future__ import annotations

import pytest

from policies import PolicyError
from tests.policies.helpers import build
from tests.policies.signals import request

# Predicted quality rises with price: big > coder > small > tiny.
QUALITY = "[q tiny=0.40 small=0.60 coder=0.75 big=0.90]"


def multi(lam: float, extra: str = "") -> str:
    return f"""
name: auto
policy: rules
multi_model:
  lambda: {lam}
  candidates: [tiny, small, coder, big]
  quality_signal: quality
{extra}
"""


async def test_lambda_zero_picks_the_best_quality() -> None:
    policy, _ = build(multi(0))
    plan = await policy.decide(request(f"hello {QUALITY}"))
    assert plan.candidates == ("big",)
    assert plan.details["quality"] == 0.9 and plan.details["utility"] == 0.9
    assert "best utility big" in plan.reason


async def test_large_lambda_picks_the_cheapest_eligible() -> None:
    policy, _ = build(multi(100))
    assert (await policy.decide(request(f"hello {QUALITY}"))).candidates == ("tiny",)


async def test_moderate_lambda_trades_off() -> None:
    # Normalised costs (price / big's 12.5): tiny 0.012, small 0.06, coder 0.16, big 1.0.
    # With lambda 0.5: tiny 0.394, small 0.57, coder 0.67, big 0.40 -> coder.
    policy, _ = build(multi(0.5))
    explained = await policy.explain(request(f"hello {QUALITY}"))
    assert explained["model"] == "coder"
    ranking = explained["multi_model"]["ranking"]
    assert [entry["model"] for entry in ranking] == ["coder", "small", "big", "tiny"]
    assert ranking[0]["utility"] == pytest.approx(0.75 - 0.5 * 2.0 / 12.5, abs=1e-4)


async def test_tool_requests_only_go_to_models_with_the_tools_tag() -> None:
    policy, _ = build(multi(100))
    plan = await policy.decide(request(f"look this up {QUALITY}", tools=True))
    assert plan.candidates == ("small",)  # tiny is cheaper but has no "tools" tag
    explained = await policy.explain(request(f"look this up {QUALITY}", tools=True))
    excluded = {e["model"]: e.get("excluded") for e in explained["multi_model"]["ranking"]}
    assert "tools" in excluded["tiny"] and "tools" in excluded["coder"]
    assert excluded["small"] is None and excluded["big"] is None


async def test_context_window_excludes_small_models() -> None:
    policy, _ = build(multi(100))
    long_text = "word " * 1000  # ~5000 chars: too much for tiny's 512-token window
    assert (await policy.decide(request(f"{long_text} {QUALITY}"))).candidates == ("small",)
    # The reply budget counts too.
    assert (await policy.decide(request(f"hi {QUALITY}", max_tokens=600))).candidates == ("small",)
    assert (await policy.decide(request(f"hi {QUALITY}", max_tokens=100))).candidates == ("tiny",)


async def test_required_tags_and_explicit_costs() -> None:
    policy, _ = build(multi(0, "  require_tags: [vision]\n"))
    assert (await policy.decide(request(f"hi {QUALITY}"))).candidates == ("big",)
    # Explicit costs replace the config prices: big becomes the cheapest.
    policy, _ = build(multi(100, "  costs: {tiny: 5, small: 5, coder: 5, big: 1}\n"))
    assert (await policy.decide(request(f"hi {QUALITY}"))).candidates == ("big",)


async def test_models_without_a_quality_prediction_are_not_chosen() -> None:
    policy, _ = build(multi(100))
    plan = await policy.decide(request("hi [q small=0.5 big=0.9]"))
    assert plan.candidates == ("small",)


async def test_no_eligible_model_is_a_clear_400() -> None:
    policy, _ = build(multi(0, "  require_tags: [tools]\n"))
    with pytest.raises(PolicyError) as caught:
        await policy.decide(request("word " * 80000 + QUALITY, tools=True))
    assert caught.value.status == 400 and caught.value.code == "no_eligible_model"
    assert "context window" in caught.value.message
    explained = await policy.explain(request("word " * 80000 + QUALITY, tools=True))
    assert explained["error"]["code"] == "no_eligible_model" and explained["model"] is None


async def test_quality_models_map_candidates_to_the_quality_heads_names() -> None:
    # The quality signal scores models under its own (training data) names; the route maps them.
    extra = "  quality_models: {big: gpt-4, tiny: mistral-7b}\n"
    policy, _ = build(multi(0, extra))
    text = "hi [q gpt-4=0.95 mistral-7b=0.3 small=0.6 coder=0.7 big=0.1 tiny=0.99]"
    plan = await policy.decide(request(text))
    assert plan.candidates == ("big",)  # scored 0.95 as gpt-4, not 0.1 under its own name
    assert plan.details["qualities"] == {"big": 0.95, "coder": 0.7, "small": 0.6, "tiny": 0.3}
    explained = await policy.explain(request(text))
    ranking = {entry["model"]: entry for entry in explained["multi_model"]["ranking"]}
    assert ranking["big"]["quality_key"] == "gpt-4" and ranking["big"]["quality"] == 0.95
    assert ranking["tiny"]["quality_key"] == "mistral-7b" and ranking["tiny"]["quality"] == 0.3
    assert "quality_key" not in ranking["small"]  # read under its own name
    # A mapped label the signal does not report leaves that candidate without a prediction.
    plan = await policy.decide(request("hi [q small=0.6 coder=0.7 big=0.99]"))
    assert plan.candidates == ("coder",)
