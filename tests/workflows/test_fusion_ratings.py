"""Fusion and ratings through the real gateway: partial failure, fuser and judge combinations, the
ratings extension and the ratings stored as judge feedback."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import CHEAP_CALL, MESSAGES, STRONG_CALL, key
from tests.workflows.helpers import extension, feedback, record, subcalls


def sent(upstream: FakeUpstream, user: str, prefix: str) -> list[dict[str, Any]]:
    return [b for b in upstream.state.bodies if b.get("user") == user and b["model"].startswith(prefix)]


def test_fusion_survives_a_failed_and_a_timed_out_candidate(
    sdk: OpenAI, upstream: FakeUpstream, wf_gateway: GatewayProcess
) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="fusion/moa", messages=MESSAGES, user=user)
    completion = raw.parse()
    assert completion.choices[0].message.content == "The fused answer."
    assert raw.headers["x-pointsman-model"] == "fuser" and raw.headers["x-pointsman-stage"] == "3:fuser"
    steps = extension(completion)["steps"]
    assert [(s["step"], s["model"], s["outcome"]) for s in steps] == [
        ("candidate", "cand-a", "ok"), ("candidate", "failing", "error"), ("candidate", "stuck", "timeout"),
        ("fuser", "fuser", "ok"),
    ]
    assert steps[2]["latency_ms"] == pytest.approx(1000, abs=400)  # its timeout, not the hang
    [fuser] = sent(upstream, user, "say:The fused")
    references = fuser["messages"][0]
    assert references["role"] == "system" and "1. Answer A quality=0.9" in references["content"]
    assert "Synthesize" in references["content"] or "synthesize" in references["content"]
    assert fuser["messages"][1:] == MESSAGES  # then the client's conversation, as it was
    rows = subcalls(wf_gateway, raw.headers["x-pointsman-request-id"])
    assert [(r["step"], r["outcome"]) for r in rows] == [
        ("candidate", "ok"), ("candidate", "error"), ("candidate", "timeout"), ("fuser", "ok")]
    row = record(wf_gateway, raw.headers["x-pointsman-request-id"])
    assert row["cost_usd"] == pytest.approx(CHEAP_CALL + STRONG_CALL)  # failed calls reported no usage


def test_fusion_with_too_few_answers_is_a_502_naming_the_failures(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="fusion/quorum", messages=MESSAGES, user=key())
    assert info.value.status_code == 502
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "bad_gateway"
    assert "1 of 3 candidates answered, 2 needed" in error["message"]
    assert "failing" in error["message"] and "stuck" in error["message"] and "no answer within 1s" in error["message"]
    row = record(wf_gateway, info.value.response.headers["x-pointsman-request-id"])
    assert row["status"] == 502 and row["workflow"]["steps"][0]["outcome"] == "ok"


def test_fusion_with_a_scoring_judge_returns_the_best_candidate(sdk: OpenAI, upstream: FakeUpstream) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="fusion/scored", messages=MESSAGES, user=user)
    completion = raw.parse()
    assert completion.choices[0].message.content == "Answer A quality=0.9"
    assert raw.headers["x-pointsman-stage"] == "1:cand-a"
    judge = extension(completion)["judge"]
    assert judge["model"] == "rater" and judge["mode"] == "scored"
    assert [(s["model"], round(s["score"], 3)) for s in judge["scores"]] == [
        ("cand-b", round(4 / 9, 3)), ("cand-a", round(8 / 9, 3)), ("cand-c", round(6 / 9, 3))]
    prompts = [b["messages"][0]["content"] for b in sent(upstream, user, "rater")]
    assert len(prompts) == 3 and all("Say hello." in p and "[[rating]]" in p for p in prompts)


def test_fusion_with_a_pairwise_judge_asks_both_orders(sdk: OpenAI, upstream: FakeUpstream) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="fusion/duel", messages=MESSAGES, user=user)
    assert raw.parse().choices[0].message.content == "Answer A quality=0.9"
    asked = [b["messages"][0]["content"] for b in sent(upstream, user, "pairjudge")]
    assert len(asked) == 2
    firsts = {p.split("[Assistant A's answer]")[1].split("quality=")[1][:3] for p in asked}
    assert firsts == {"0.4", "0.9"}  # each answer was shown first once
    scores = extension(raw.parse())["judge"]["scores"]
    assert [(s["model"], s["score"]) for s in scores] == [("cand-b", 0.0), ("cand-a", 1.0)]


def test_ratings_return_the_best_answer_with_every_rating_and_store_them_as_feedback(
    sdk: OpenAI, wf_gateway: GatewayProcess
) -> None:
    raw = sdk.chat.completions.with_raw_response.create(model="ratings/panel", messages=MESSAGES, user=key())
    completion = raw.parse()
    assert completion.choices[0].message.content == "Answer A quality=0.9"
    ratings = extension(completion)["ratings"]
    assert [(r["model"], r["score"], r["rank"]) for r in ratings] == [
        ("cand-b", round(4 / 9, 4), 3), ("cand-a", round(8 / 9, 4), 1), ("cand-c", round(6 / 9, 4), 2)]
    assert all(r["judge"] == "rater" and r["mode"] == "scored" for r in ratings)
    request_id = raw.headers["x-pointsman-request-id"]
    rows = feedback(wf_gateway, request_id, 3)
    assert [(r["model"], round(r["score"], 4), r["source"], r["metric"]) for r in rows] == [
        ("cand-a", round(8 / 9, 4), "judge", "quality"), ("cand-b", round(4 / 9, 4), "judge", "quality"),
        ("cand-c", round(6 / 9, 4), "judge", "quality")]
    # Three candidates and three judge calls, all on cheap models: 6 sub-calls' usage and cost.
    assert completion.usage is not None and completion.usage.prompt_tokens == 66
    assert record(wf_gateway, request_id)["cost_usd"] == pytest.approx(6 * CHEAP_CALL)
