"""Caps stop runaway workflows: each cap ends a run with its best answer so far, says so in the
response and the record, or answers an OpenAI-shaped error when there is no answer yet; the
process-wide sub-call limit holds across requests."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually
from tests.workflows.conftest import MESSAGES, key, workflow_config
from tests.workflows.helpers import extension, record


def capped(sdk: OpenAI, model: str, user: str) -> tuple[str, dict[str, str], dict[str, object]]:
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, user=user)
    completion = raw.parse()
    return completion.choices[0].message.content or "", dict(raw.headers), extension(completion)


@pytest.mark.parametrize(("workflow", "cap"), [
    ("few-steps", "max_steps"), ("few-tokens", "max_tokens"), ("cheapskate", "max_cost_usd"),
])
def test_a_budget_cap_ends_the_cascade_with_the_last_completed_stage(
    sdk: OpenAI, upstream: FakeUpstream, wf_gateway: GatewayProcess, workflow: str, cap: str
) -> None:
    user = key()
    content, headers, ext = capped(sdk, f"cascade/{workflow}", user)
    assert content == "Hello from the fake upstream."  # the unsure first stage's answer
    assert headers["x-pointsman-capped"] == cap and headers["x-pointsman-model"] == "unsure"
    assert ext["capped"] == cap and ext["cap_detail"]
    assert [s["outcome"] for s in ext["steps"]] == ["ok", "capped"]  # the escalation was never sent
    assert not [b for b in upstream.state.bodies if b.get("user") == user and b["model"].startswith("say:The strong")]
    tree = record(wf_gateway, headers["x-pointsman-request-id"])["workflow"]
    assert tree["capped"] == cap and tree["answered_by"]["model"] == "unsure"


def test_max_seconds_cancels_the_slow_stage_and_answers_with_the_first(
    sdk: OpenAI, upstream: FakeUpstream, wf_gateway: GatewayProcess
) -> None:
    before = upstream.state.disconnects["slow:3"]
    started = time.monotonic()
    content, headers, ext = capped(sdk, "cascade/hasty", key())
    assert time.monotonic() - started < 2.5  # the cap is 1 s; the slow stage takes 3
    assert headers["x-pointsman-capped"] == "max_seconds" and content == "Hello from the fake upstream."
    assert [s["outcome"] for s in ext["steps"]] == ["ok", "cancelled"]
    eventually(lambda: upstream.state.disconnects["slow:3"] > before, "the slow stage's call was dropped")


def test_max_seconds_in_a_graph_answers_with_the_latest_completed_step(sdk: OpenAI) -> None:
    content, headers, ext = capped(sdk, "graph/stalled", key())
    assert headers["x-pointsman-capped"] == "max_seconds" and headers["x-pointsman-stage"] == "0:first"
    assert content == "Hello from the fake upstream." and ext["answered_by"]["step"] == "first"


def test_max_seconds_without_any_answer_is_a_504(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="fusion/too-slow", messages=MESSAGES, user=key())
    assert info.value.status_code == 504
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "workflow_timeout"
    assert info.value.response.headers["x-pointsman-workflow"] == "fusion/too-slow"  # as on its answers
    row = record(wf_gateway, info.value.response.headers["x-pointsman-request-id"])
    assert row["status"] == 504 and row["workflow"]["capped"] == "max_seconds"


def test_a_cost_cap_before_any_answer_is_a_400(sdk: OpenAI, upstream: FakeUpstream) -> None:
    # Not a 429: the request does not fit the workflow's budget, so the SDK must not retry it.
    user = key()
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="cascade/broke", messages=MESSAGES, user=user)
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "workflow_cap_reached" and "max_cost_usd" in body["message"]
    assert info.value.response.headers["x-pointsman-workflow"] == "cascade/broke"
    assert not [b for b in upstream.state.bodies if b.get("user") == user]  # nothing was sent


@pytest.fixture(scope="module")
def one_slot(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {**workflow_config(upstream), "workflow_limits": {"max_concurrent_subcalls": 1}}
    proc = GatewayProcess(config, tmp_path_factory.mktemp("one-slot")).start(timeout=60)
    yield proc
    proc.terminate()


def test_the_process_wide_subcall_limit_holds_across_requests(one_slot: GatewayProcess, upstream: FakeUpstream) -> None:
    sdk = OpenAI(base_url=one_slot.base_url, api_key="unused", max_retries=0, timeout=30)
    user = key()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(
            lambda _: sdk.chat.completions.create(model="graph/wide", messages=MESSAGES, user=user), range(2)))
    assert all(a.choices[0].message.content.count("slow answer") == 4 for a in answers)
    assert upstream.state.peak[user] == 1  # two requests, fan-out 2 each: one sub-call at a time in all
