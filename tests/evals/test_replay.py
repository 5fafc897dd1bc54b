"""Offline replay: a route's decisions over a data set through the serving decision code, stateless.

A real brain (static encoder, the shipped difficulty head) decides every request; the tests check what a
user relies on: the same decisions as the serving path at a fixed threshold, a target share calibrated
over the replayed set, stickiness and exploration off, rules and blocks reported as such.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from evals.replay import pair_arrays, pair_usable, replay_route, share_threshold
from policies.brain import Brain, build_brain, decide_request, parse_routing_config
from tests.evals.labelled_files import prompts

PROMPTS = [text for text, _ in prompts(seed=3, n=120)] + [
    "Prove that the square root of 2 is irrational, rigorously, and discuss the history of the proof.",
    "hi",
    "BLOCKME please",
]


def config(cost_quality: dict[str, Any], **route: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": [
            {"name": "big-model", "input_cost_per_mtok": 10, "output_cost_per_mtok": 30},
            {"name": "small-model", "input_cost_per_mtok": 0.5, "output_cost_per_mtok": 1.5},
        ]}],
        "classifiers": {"encoder": "static", "scan_workers": 0},
        "routes": [{
            "name": "auto", "policy": "rules",
            "signals": {"keywords": {"greet": {"keywords": ["hello"]}, "banned": {"keywords": ["blockme"]}}},
            "rules": [
                {"name": "no-banned", "priority": 100, "when": {"signal": "banned", "op": "truthy"},
                 "action": {"block": "not here"}},
                {"name": "greetings-small", "priority": 10, "when": {"signal": "greet", "op": "truthy"},
                 "action": {"route": "small-model"}},
            ],
            "cost_quality": {"signal": "difficulty", "strong": "big-model", "weak": "small-model", **cost_quality},
            **route,
        }],
    }


async def started(data: dict[str, Any], **kwargs: Any) -> Brain:
    brain = build_brain(parse_routing_config(data), sticky=False, explore=False, **kwargs)
    await brain.start()
    return brain


def conversations(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


@pytest.fixture(scope="module")
async def scores() -> AsyncIterator[np.ndarray]:
    """The knob scores of PROMPTS (a first replay), to choose thresholds that split them."""
    brain = await started(config({"threshold": 0.5}))
    try:
        replay = await replay_route(brain, "auto", conversations(PROMPTS))
    finally:
        await brain.close()
    yield np.array([d.score if d.score is not None else np.nan for d in replay.decisions])


async def test_fixed_threshold_replay_is_the_serving_decision(scores: np.ndarray) -> None:
    threshold = round(float(np.nanmedian(scores)), 4)
    data = config({"threshold": threshold})
    brain = await started(data)
    try:
        replay = await replay_route(brain, "auto", conversations(PROMPTS))
        # The serving path (Policy.decide) on a separate brain, one request at a time.
        serving = build_brain(parse_routing_config(data), sticky=False, explore=False)
        await serving.start()
        try:
            served = []
            for text in PROMPTS[:-1]:  # the last one is blocked: decide raises, checked below
                plan = await decide_request(serving, "auto", {"model": "auto", "messages": conversations([text])[0]})
                served.append(plan.candidates[0])
        finally:
            await serving.close()
    finally:
        await brain.close()
    assert replay.threshold == threshold and replay.threshold_source == "config"
    assert [d.model for d in replay.decisions[:-1]] == served
    by = [d.by for d in replay.decisions]
    assert by[-1] == "blocked" and replay.decisions[-1].model is None
    hello = PROMPTS.index(next(p for p in PROMPTS if "hello" in p.lower()))
    assert by[hello] == "rule" and replay.decisions[hello].model == "small-model"
    knob = [d for d in replay.decisions if d.by == "knob"]
    assert {d.model for d in knob} == {"big-model", "small-model"}  # the median splits them
    for d in knob:
        assert d.model == ("big-model" if d.score is not None and d.score >= threshold else "small-model")
    # The pair view: rules pin, blocks are unusable.
    s, pins, strong = pair_arrays(replay)
    assert pins[hello] == -1 and np.isnan(s[hello])
    assert not pair_usable(replay)[-1]
    assert strong.sum() == sum(d.model == "big-model" for d in replay.decisions)


async def test_target_share_is_calibrated_over_the_replayed_set(scores: np.ndarray) -> None:
    brain = await started(config({"target_strong_share": 0.3}))
    try:
        replay = await replay_route(brain, "auto", conversations(PROMPTS))
    finally:
        await brain.close()
    knob = [d for d in replay.decisions if d.by == "knob"]
    assert replay.target_share == 0.3
    assert replay.threshold_source == "target share over the replayed set"
    # Two passes: the threshold comes from every replayed score, not from a cold window (1 - 0.3).
    assert replay.threshold == pytest.approx(share_threshold([d.score for d in knob if d.score is not None], 0.3))
    assert replay.threshold != pytest.approx(0.7)
    share = sum(d.model == "big-model" for d in knob) / len(knob)
    assert share == pytest.approx(0.3, abs=1.5 / len(knob))
    assert all("override" in d.reason for d in knob)  # decided through the per-request threshold path


def test_share_threshold_edges() -> None:
    values = [0.1, 0.2, 0.3, 0.4]
    assert share_threshold(values, 0.5) == pytest.approx(0.25)
    assert share_threshold(values, 1.0) == pytest.approx(0.1)
    assert share_threshold([0.2, 1.0], 0.0) == 1.0  # clamped: a per-request threshold lies in [0, 1]
    assert share_threshold([], 0.3) == pytest.approx(0.7)


async def test_replay_is_stateless_sticky_and_exploring_routes_decide_each_request_alone(
    scores: np.ndarray,
) -> None:
    threshold = round(float(np.nanmedian(scores)), 4)
    plain = await started(config({"threshold": threshold}))
    try:
        # A first turn that goes strong, and a follow-up in the same session (same first message)
        # that on its own goes weak: a sticky route would keep the follow-up on the strong model.
        order = np.argsort(-np.nan_to_num(scores, nan=-1.0))
        first_turn = [{"role": "user", "content": PROMPTS[int(order[0])]}]
        follow_ups = [[*first_turn, {"role": "assistant", "content": "Done."}, {"role": "user", "content": t}]
                      for t in (PROMPTS[int(i)] for i in order[::-1][:30])]
        reference = await replay_route(plain, "auto", [first_turn, *follow_ups])
    finally:
        await plain.close()
    assert reference.decisions[0].model == "big-model"
    weak_follow_up = next(c for c, d in zip(follow_ups, reference.decisions[1:], strict=True)
                          if d.model == "small-model" and d.by == "knob")
    texts = [PROMPTS[i] for i in range(20)]
    batch = [first_turn, weak_follow_up, *conversations(texts)]
    # The same route made sticky and exploring every decision (epsilon 1): replay turns both off.
    brain = await started(config({"threshold": threshold}, sticky={"ttl": 600}, explore={"epsilon": 1.0}))
    try:
        replay = await replay_route(brain, "auto", batch, concurrency=1)  # in order: the first turn pins first
    finally:
        await brain.close()
    plain = await started(config({"threshold": threshold}))
    try:
        expected = await replay_route(plain, "auto", batch, concurrency=1)
    finally:
        await plain.close()
    assert [d.model for d in replay.decisions[:2]] == ["big-model", "small-model"]
    assert [d.model for d in replay.decisions] == [d.model for d in expected.decisions]
    assert all("session" not in d.reason and "explor" not in d.reason for d in replay.decisions)


async def test_unknown_route_names_the_configured_ones() -> None:
    from evals.replay import ReplayError

    brain = await started(config({"threshold": 0.5}))
    try:
        with pytest.raises(ReplayError, match="routes: auto"):
            await replay_route(brain, "nope", conversations(["hi"]))
    finally:
        await brain.close()


def test_subset_keeps_the_knob_setting_and_picks_decisions_in_order() -> None:
    from evals.replay import Replay, ReplayDecision, subset

    decisions = [ReplayDecision(index=i, model="big-model" if i % 2 else "small-model", by="knob", score=i / 10,
                                reason="") for i in range(6)]
    replay = Replay(route="auto", router_version="v", decisions=decisions, strong="big-model", weak="small-model",
                    threshold=0.25, threshold_source="target share over the replayed set", target_share=0.5)
    part = subset(replay, [4, 1, 1])
    assert [d.index for d in part.decisions] == [4, 1, 1]
    assert (part.threshold, part.target_share, part.strong) == (0.25, 0.5, "big-model")
    assert len(replay.decisions) == 6  # the original is untouched


async def test_requests_a_workflow_answers_are_left_out_and_counted(scores: np.ndarray) -> None:
    """The knob's middle band goes to a cascade: replay cannot know what its sub-calls would have
    answered, so those requests are not counted as the weak model's (they are excluded by name)."""
    lo, hi = (round(float(q), 4) for q in np.nanquantile(scores, [0.3, 0.7]))
    data = config({"threshold": 0.5, "middle": {"band": [lo, hi], "workflow": "small-first"}})
    data["workflows"] = [{"name": "small-first", "kind": "cascade", "stages": ["small-model", "big-model"],
                          "confidence": {"source": "logprobs", "threshold": 0.8}}]
    brain = await started(data)
    try:
        replay = await replay_route(brain, "auto", conversations(PROMPTS))
    finally:
        await brain.close()
    in_band = [d for d in replay.decisions if d.score is not None and lo <= d.score < hi]
    assert in_band, "the band holds some of the replayed prompts"
    assert all(d.by == "workflow" and d.model == "cascade/small-first" for d in in_band)
    usable = pair_usable(replay)
    _, pins, strong = pair_arrays(replay)
    for i, d in enumerate(replay.decisions):
        if d.by == "workflow":
            assert not usable[i] and pins[i] == 0 and not strong[i]
    outside = [d for d in replay.decisions if d.by == "knob"]
    assert outside and all(d.score is not None and not (lo <= d.score < hi) for d in outside)
