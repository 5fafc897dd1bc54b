"""Cascades through the real gateway: escalation on each confidence source, both sides of the
threshold, logprobs asked for and stripped, failures and the routes that choose a cascade."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.fakes.upstream import WORDS, FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import MESSAGES, STRONG_TEXT, THRESHOLD, key
from tests.workflows.helpers import extension, record


def ask(sdk: OpenAI, model: str, **kwargs: Any) -> tuple[Any, dict[str, str]]:
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, user=key(), **kwargs)
    return raw.parse(), dict(raw.headers)


def sent(upstream: FakeUpstream, user: str) -> list[dict[str, Any]]:
    return [body for body in upstream.state.bodies if body.get("user") == user]


@pytest.mark.parametrize(
    ("workflow", "logprob", "stage", "model"),
    [("accept", -0.35, "0:above", "above"), ("escalate", -0.36, "1:strong", "strong")],
)
def test_a_logprob_cascade_escalates_exactly_below_the_threshold(
    sdk: OpenAI, workflow: str, logprob: float, stage: str, model: str
) -> None:
    confidence = math.exp(logprob)  # 0.7047 and 0.6977 around the threshold 0.7
    completion, headers = ask(sdk, f"cascade/{workflow}")
    assert headers["x-pointsman-workflow"] == f"cascade/{workflow}"
    assert headers["x-pointsman-stage"] == stage and headers["x-pointsman-model"] == model
    escalated = confidence < THRESHOLD
    assert completion.choices[0].message.content == (STRONG_TEXT if escalated else "".join(WORDS))
    ext = extension(completion)
    assert ext["escalated"] is escalated and ext["answered_by"]["model"] == model
    assert ext["steps"][0]["confidence"] == pytest.approx(confidence, abs=1e-6)
    assert [s["step"] for s in ext["steps"]] == (["below", "strong"] if escalated else ["above"])
    assert "capped" not in ext and "x-pointsman-capped" not in headers


def test_a_three_stage_cascade_escalates_stage_by_stage(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    completion, headers = ask(sdk, "cascade/three")
    assert headers["x-pointsman-stage"] == "2:large" and completion.choices[0].message.content == STRONG_TEXT
    steps = extension(completion)["steps"]
    assert [(s["step"], s["model"]) for s in steps] == [("small", "below"), ("medium", "unsure"), ("large", "strong")]
    assert steps[1]["confidence"] == pytest.approx(math.exp(-0.6), abs=1e-6)
    tree = record(wf_gateway, headers["x-pointsman-request-id"])["workflow"]
    assert tree["kind"] == "cascade" and tree["name"] == "three" and tree["escalated"] is True


def test_an_answer_without_logprobs_is_not_confident_unless_configured(sdk: OpenAI) -> None:
    completion, headers = ask(sdk, "cascade/missing")
    assert headers["x-pointsman-model"] == "strong"
    assert extension(completion)["steps"][0].get("confidence") is None
    completion, headers = ask(sdk, "cascade/missing-ok")  # on_missing: accept
    assert headers["x-pointsman-model"] == "nolp" and extension(completion)["escalated"] is False


def test_margin_and_min_statistics(sdk: OpenAI) -> None:
    completion, headers = ask(sdk, "cascade/margin")  # top-1 -0.35 vs top-2 -1.85 on every token
    assert extension(completion)["steps"][0]["confidence"] == pytest.approx(math.exp(-0.35) - math.exp(-1.85), abs=1e-6)
    assert headers["x-pointsman-model"] == "above"  # 0.548 >= 0.5
    completion, headers = ask(sdk, "cascade/lowest")
    assert extension(completion)["steps"][0]["confidence"] == pytest.approx(math.exp(-0.35), abs=1e-6)


def test_logprobs_are_asked_for_and_stripped_when_the_client_did_not_ask(
    sdk: OpenAI, upstream: FakeUpstream
) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/accept", messages=MESSAGES, user=user)
    [cheap] = sent(upstream, user)
    assert cheap["logprobs"] is True and cheap["top_logprobs"] == 2 and cheap["stream"] is False
    assert raw.parse().choices[0].logprobs is None
    assert raw.http_response.json()["choices"][0]["logprobs"] is None


def test_logprobs_are_kept_when_the_client_asked(sdk: OpenAI, upstream: FakeUpstream) -> None:
    user = key()
    completion = sdk.chat.completions.create(model="cascade/accept", messages=MESSAGES, user=user, logprobs=True,
                                             top_logprobs=1)
    [cheap] = sent(upstream, user)
    assert cheap["top_logprobs"] == 2  # the margin needs two; the client gets the one it asked for
    tokens = completion.choices[0].logprobs.content
    assert [t.token for t in tokens] == ["Hello", " from", " the", " fake", " upstream."]
    assert all(t.logprob == pytest.approx(-0.35) and len(t.top_logprobs) == 1 for t in tokens)


def test_streamed_accepted_answer_keeps_or_strips_logprobs(wf_gateway: GatewayProcess) -> None:
    for asked in (False, True):
        body = {"model": "cascade/accept", "messages": MESSAGES, "stream": True, "logprobs": asked}
        with httpx.stream("POST", f"{wf_gateway.base_url}/chat/completions", json=body, timeout=30) as response:
            text = b"".join(response.iter_bytes()).decode()
        assert ('"logprobs":{"content"' in text) is asked


def test_agreement_uses_n_and_accepts_a_two_thirds_majority(sdk: OpenAI, upstream: FakeUpstream) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/agree", messages=MESSAGES, user=user)
    completion = raw.parse()
    [sampled] = sent(upstream, user)  # one call with n: the backend honours it
    assert sampled["n"] == 3 and sampled["temperature"] == 0.7
    assert raw.headers["x-pointsman-model"] == "voter" and completion.choices[0].message.content == "x = 42"
    assert len(completion.choices) == 1 and completion.choices[0].index == 0
    assert extension(completion)["steps"][0]["confidence"] == pytest.approx(2 / 3, abs=1e-4)


def test_agreement_falls_back_to_parallel_samples_and_escalates_on_disagreement(
    sdk: OpenAI, upstream: FakeUpstream
) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/disagree", messages=MESSAGES, user=user)
    samples = [b for b in sent(upstream, user) if b["model"].startswith("cycle1:")]
    assert len(samples) == 3  # n=3 answered with one choice, then two more single calls
    steps = extension(raw.parse())["steps"]
    assert [s["step"] for s in steps] == ["sample", "sample", "sample", "strong"]
    assert steps[0]["confidence"] == pytest.approx(1 / 3, abs=1e-4)
    assert raw.headers["x-pointsman-model"] == "strong"


def test_parallel_samples_get_their_own_seeds_when_the_client_sends_one(
    sdk: OpenAI, upstream: FakeUpstream
) -> None:
    """A client seed on every sample would make them one answer repeated: agreement would read 1."""
    user = key()
    sdk.chat.completions.create(model="cascade/disagree", messages=MESSAGES, user=user, seed=7)
    samples = [b for b in sent(upstream, user) if b["model"].startswith("cycle1:")]
    assert samples[0]["n"] == 3 and samples[0]["seed"] == 7  # one call with n keeps the client's seed
    assert sorted(b["seed"] for b in samples[1:]) == [8, 9]  # the parallel ones: seed + their index


@pytest.mark.parametrize("seed", [2**63 - 1, 2**64 - 1])
def test_sample_seeds_stay_64_bit_integers_at_the_top_of_the_range(
    sdk: OpenAI, upstream: FakeUpstream, seed: int
) -> None:
    """seed + index past the top of the range: the request was a 500 (2**64 is no JSON integer the
    gateway can write) or carried a seed no int64 upstream takes; the samples' seeds wrap instead."""
    user = key()
    completion = sdk.chat.completions.create(model="cascade/disagree", messages=MESSAGES, user=user, seed=seed)
    assert completion.choices[0].message.content == STRONG_TEXT
    samples = [b for b in sent(upstream, user) if b["model"].startswith("cycle1:")]
    assert samples[0]["seed"] == seed
    seeds = [b["seed"] for b in samples[1:]]
    assert len(set(seeds)) == 2 and seed not in seeds
    assert all(-(2**63) <= s < 2**63 for s in seeds)


@pytest.mark.parametrize(("workflow", "answered", "confidence"), [
    ("verified", "unsure", 1.0), ("refuted", "strong", 0.0), ("unreadable", "strong", None),
])
def test_a_verifier_decides_with_its_yes_or_no(
    sdk: OpenAI, upstream: FakeUpstream, workflow: str, answered: str, confidence: float | None
) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model=f"cascade/{workflow}", messages=MESSAGES, user=user)
    assert raw.headers["x-pointsman-model"] == answered
    steps = extension(raw.parse())["steps"]
    assert steps[1]["step"] == "verifier" and steps[0].get("confidence") == confidence
    question = next(b for b in sent(upstream, user) if b["model"].startswith("say:") and "Answer to check" in
                    b["messages"][0]["content"])
    assert "Say hello." in question["messages"][0]["content"]  # {conversation}
    assert "Hello from the fake upstream." in question["messages"][0]["content"]  # {answer}
    assert question["logprobs"] is True and question["max_tokens"] == 4


def test_a_failing_last_stage_falls_back_to_the_checked_answer(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    completion, headers = ask(sdk, "cascade/fragile")
    assert headers["x-pointsman-model"] == "unsure" and headers["x-pointsman-stage"] == "0:unsure"
    ext = extension(completion)
    assert "HTTP 500" in ext["degraded"] or "upstream failed" in ext["degraded"]
    assert [s["outcome"] for s in ext["steps"]] == ["ok", "error"]
    row = record(wf_gateway, headers["x-pointsman-request-id"])
    assert row["status"] == 200 and row["workflow"]["degraded"]


def test_a_static_route_can_be_a_cascade(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    _, headers = ask(sdk, "careful")
    assert headers["x-pointsman-route"] == "careful" and headers["x-pointsman-workflow"] == "cascade/escalate"
    row = record(wf_gateway, headers["x-pointsman-request-id"])
    assert row["route"] == "careful" and row["decision"]["workflow"] == "escalate"
    assert row["decision"]["candidates"] == ["cascade/escalate"]


def test_models_list_the_workflows(sdk: OpenAI) -> None:
    models = {m.id: m.owned_by for m in sdk.models.list()}
    assert models["cascade/accept"] == models["fusion/moa"] == models["graph/dcr"] == "pointsman-workflow"
    assert models["ratings/panel"] == "pointsman-workflow" and models["careful"] == "pointsman-route"


def test_the_dry_run_shows_the_chosen_workflow(wf_gateway: GatewayProcess) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]

    def route(body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(f"{wf_gateway.base_url}/route", json={"messages": MESSAGES, **body}, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    by_rule = route({"model": "mixed", "tools": tools})
    assert by_rule["plan"]["workflow"] == "panel" and by_rule["model"] == "ratings/panel"
    assert "workflow ratings/panel" in by_rule["reason"]
    assert route({"model": "mixed"})["plan"].get("workflow") is None  # no tools: the default model
    banded = route({"model": "banded"})
    assert banded["plan"]["workflow"] == "accept" and banded["plan"]["details"]["band"] == [0.0, 1.0]
    assert "middle band" in banded["reason"]
    direct = route({"model": "cascade/accept"})
    assert direct["plan"]["workflow"] == "accept" and direct["policy"] == "direct"


def test_a_rule_and_the_knobs_band_choose_workflows_when_serving(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    raw = sdk.chat.completions.with_raw_response.create(model="mixed", messages=MESSAGES, tools=tools)
    assert raw.headers["x-pointsman-workflow"] == "ratings/panel" and raw.headers["x-pointsman-route"] == "mixed"
    raw = sdk.chat.completions.with_raw_response.create(model="banded", messages=MESSAGES)
    assert raw.headers["x-pointsman-workflow"] == "cascade/accept"
    row = record(wf_gateway, raw.headers["x-pointsman-request-id"])
    assert row["decision"]["workflow"] == "accept" and row["propensity"] is None


def test_a_workflow_refuses_what_it_cannot_serve(wf_gateway: GatewayProcess) -> None:
    several = httpx.post(f"{wf_gateway.base_url}/chat/completions",
                         json={"model": "cascade/accept", "messages": MESSAGES, "n": 2}, timeout=30)
    assert several.status_code == 400 and several.json()["error"]["param"] == "n"
    legacy = httpx.post(f"{wf_gateway.base_url}/completions", json={"model": "cascade/accept", "prompt": "hi"},
                        timeout=30)
    assert legacy.status_code == 400 and "chat/completions" in legacy.json()["error"]["message"]
