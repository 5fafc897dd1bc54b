"""Workflows against upstreams that answer the way broken or unusual servers do (``hostile_upstream``),
through the real gateway and the official SDK: what the client gets must be a real answer or the
upstream's own refusal, never a blank answer voted in, a misread verdict or a 502 for a bad request."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import CHEAP, MESSAGES, STRONG, STRONG_TEXT, key
from tests.workflows.helpers import extension, feedback, record
from tests.workflows.hostile_upstream import CR_TEXT, REFUSAL, HostileUpstream

HOSTILE: dict[str, str] = {  # gateway model -> the hostile script
    "refuse-n": "refuse-n", "blank": "blank", "holes": "holes", "refuse-a": "refuse", "refuse-b": "refuse",
    "probabilities": "probabilities", "n-honouring": "n-honouring", "n-once": "n-once",
    "cand-a": "say:Answer A", "cand-b": "say:Answer B",
    "cr-stream": "cr-stream", "escaped-bytes": "escaped-bytes", "running-usage": "running-usage",
    "done-unended": "done-unended",
    "judge-negative": "say:-5", "judge-negative-bracketed": "say:[[-5]]", "judge-rating-negative": "say:Rating: -3",
}
AGREE = {"source": "agreement", "threshold": 0.6, "samples": 3}


def _cascade(name: str, first: str, confidence: dict[str, Any], **caps: Any) -> dict[str, Any]:
    return {"name": name, "kind": "cascade", "stages": [first, "strong"], "confidence": confidence, "caps": caps}


WORKFLOWS: list[dict[str, Any]] = [
    _cascade("n-refused", "refuse-n", AGREE),
    _cascade("blank-votes", "blank", AGREE),
    _cascade("holey-votes", "holes", AGREE),
    _cascade("probabilities", "probabilities", {"source": "logprobs", "threshold": 0.7}),
    _cascade("n-budget", "n-honouring", AGREE, max_tokens=400),
    _cascade("verifier-steps", "cand-a", {"source": "verifier", "threshold": 0.5, "verifier": {"model": "cand-b"}},
             max_steps=1),
    _cascade("samples-slow", "n-once", AGREE, max_seconds=1.0),
    _cascade("verifier-slow", "cand-a", {"source": "verifier", "threshold": 0.5, "verifier": {"model": "slow"}},
             max_seconds=1.0),
    _cascade("escaped-bytes", "escaped-bytes", {"source": "logprobs", "threshold": 0.7, "stat": "min"}),
    {"name": "running-usage", "kind": "cascade", "stages": ["probabilities", "running-usage"],
     "confidence": {"source": "logprobs", "threshold": 0.7}},
    {"name": "cr-live", "kind": "cascade", "stages": ["probabilities", "cr-stream"],
     "confidence": {"source": "logprobs", "threshold": 0.7}},
    {"name": "done-unended", "kind": "cascade", "stages": ["probabilities", "done-unended"],
     "confidence": {"source": "logprobs", "threshold": 0.7}},
    {"name": "refused", "kind": "fusion", "candidates": ["refuse-a", "refuse-b"], "combine": {"fuser": "strong"}},
    {"name": "refusals", "kind": "ratings", "candidates": ["refuse-a", "refuse-b"], "judge": "judge-negative"},
    *({"name": judge, "kind": "ratings", "candidates": ["cand-a", "cand-b"], "judge": judge}
      for judge in ("judge-negative", "judge-negative-bracketed", "judge-rating-negative")),
]


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileUpstream]:
    server = HostileUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(
    hostile: HostileUpstream, upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    timeouts = {"connect": 2, "first_byte": 30, "total": 60, "idle": 10}
    config = {
        "backends": [
            {"name": "hostile", "base_url": hostile.base_url, "health": {"enabled": False}, "timeouts": timeouts,
             "models": [{"name": name, "upstream_name": script, **CHEAP} for name, script in HOSTILE.items()]},
            {"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False}, "timeouts": timeouts,
             "models": [{"name": "strong", "upstream_name": f"say:{STRONG_TEXT}", **STRONG},
                        {"name": "slow", "upstream_name": "slow:3", **CHEAP}]},
        ],
        "workflows": WORKFLOWS,
        "retry": {"attempts": 1},
        "classifiers": {"encoder": "static"},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("workflows-hostile")).start(timeout=60)
    yield proc
    proc.terminate()


@pytest.fixture
def sdk(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)


def _sent(hostile: HostileUpstream, user: str) -> list[dict[str, Any]]:
    return [body for body in hostile.bodies if body.get("user") == user]


def test_agreement_samples_one_at_a_time_when_the_backend_refuses_n(sdk: OpenAI, hostile: HostileUpstream) -> None:
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/n-refused", messages=MESSAGES, user=user)
    completion = raw.parse()
    # The three single samples agree: the cheap stage answers, with no escalation.
    assert completion.choices[0].message.content == "The answer is 42."
    assert raw.headers["x-pointsman-stage"] == "0:refuse-n"
    info = extension(completion)
    assert info["escalated"] is False
    assert [(s["step"], s["outcome"], s.get("status")) for s in info["steps"]] == [
        ("sample", "error", 400), ("sample", "ok", 200), ("sample", "ok", 200), ("sample", "ok", 200)]
    assert [body.get("n") for body in _sent(hostile, user)] == [3, None, None, None]


def test_blank_samples_do_not_agree_on_an_empty_answer(sdk: OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/blank-votes", messages=MESSAGES, user=key())
    completion = raw.parse()
    assert completion.choices[0].message.content == STRONG_TEXT
    assert raw.headers["x-pointsman-stage"] == "1:strong"
    info = extension(completion)
    assert info["escalated"] is True and info["steps"][0]["confidence"] == 0.0


def test_samples_that_are_not_choices_are_no_votes(sdk: OpenAI) -> None:
    """Two of three "choices" are not objects: they agree on nothing (no 500, no empty answer)."""
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/holey-votes", messages=MESSAGES, user=key())
    completion = raw.parse()
    assert completion.choices[0].message.content == STRONG_TEXT
    assert extension(completion)["steps"][0]["confidence"] == pytest.approx(1 / 3, abs=1e-6)


def test_probabilities_sent_as_logprobs_are_no_confidence(sdk: OpenAI) -> None:
    """A server that puts 0.9 where a log-probability belongs: that is not "certain" (it was clipped
    to logprob 0, confidence 1, and the cheap answer never escalated)."""
    completion = sdk.chat.completions.create(model="cascade/probabilities", messages=MESSAGES, user=key())
    assert completion.choices[0].message.content == STRONG_TEXT
    info = extension(completion)
    assert info["escalated"] is True and "confidence" not in info["steps"][0]


def test_a_call_with_n_shares_the_token_cap_between_its_choices(sdk: OpenAI, hostile: HostileUpstream) -> None:
    user = key()
    sdk.chat.completions.create(model="cascade/n-budget", messages=MESSAGES, user=user, max_tokens=1000)
    [sampled] = _sent(hostile, user)
    assert sampled["n"] == 3
    # Each of the 3 choices may write max_tokens: together they stay within the run's 400 tokens.
    assert 3 * sampled["max_tokens"] < 400


@pytest.mark.parametrize(("model", "cap"), [("cascade/verifier-steps", "max_steps"),
                                            ("cascade/verifier-slow", "max_seconds")])
def test_a_cap_that_stops_the_verifier_answers_with_the_stage_it_was_checking(
    sdk: OpenAI, model: str, cap: str
) -> None:
    """The first stage answered; the verifier's call does not fit the cap (or outlives max_seconds):
    the run ends with that answer, marked capped (it was a 400 / 504 as if nothing had answered)."""
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, user=key())
    completion = raw.parse()
    assert completion.choices[0].message.content == "Answer A"
    assert raw.headers["x-pointsman-stage"] == "0:cand-a" and raw.headers["x-pointsman-capped"] == cap
    info = extension(completion)
    assert info["capped"] == cap and info["escalated"] is False


@pytest.mark.parametrize("model", ["fusion/refused", "ratings/refusals"])
def test_candidates_that_all_refuse_the_request_pass_the_refusal_on(
    sdk: OpenAI, gateway: GatewayProcess, model: str
) -> None:
    """Every candidate's upstream answered 400: the client gets that 400 (as for a single call and a
    cascade), not a 502 the SDK retries into the same refusal."""
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, user=key())
    response = info.value.response
    assert response.status_code == 400
    assert response.json()["error"]["message"] == REFUSAL
    assert response.headers["x-pointsman-workflow"] == model
    row = record(gateway, response.headers["x-pointsman-request-id"])
    assert row["status"] == 400 and [s["outcome"] for s in row["workflow"]["steps"]] == ["error", "error"]


@pytest.mark.parametrize("judge", ["judge-negative", "judge-negative-bracketed", "judge-rating-negative"])
def test_a_negative_rating_is_no_rating(sdk: OpenAI, gateway: GatewayProcess, judge: str) -> None:
    """"-5" is out of the 1-10 scale: no score (it was read as 5), no judge feedback stored."""
    raw = sdk.chat.completions.with_raw_response.create(model=f"ratings/{judge}", messages=MESSAGES, user=key())
    info = extension(raw.parse())
    assert [rating["score"] for rating in info["ratings"]] == [None, None]
    assert info["degraded"] == "the judge scored no answer"
    assert feedback(gateway, raw.headers["x-pointsman-request-id"], 1, timeout=0.5) == []


def test_a_cap_that_stops_the_missing_samples_answers_with_a_sample_it_has(sdk: OpenAI) -> None:
    """The call with n returned one choice; the single calls for the others outlive max_seconds. The
    run ends with the choice it has, marked capped (it was a 504 'before any answer')."""
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/samples-slow", messages=MESSAGES, user=key())
    completion = raw.parse()
    assert completion.choices[0].message.content == "The answer is 42."
    assert raw.headers["x-pointsman-stage"] == "0:n-once" and extension(completion)["capped"] == "max_seconds"


@pytest.mark.parametrize("include_usage", [True, False])
def test_a_live_final_stage_with_bare_cr_line_endings_is_relayed(sdk: OpenAI, include_usage: bool) -> None:
    """The final stage streams its SSE lines ended by a bare CR (legal SSE, and the gateway's framer
    reads it): the client gets the answer, its finish chunk and the workflow's extension (the
    rewriter waited for an LF blank line that never came, and the client got an empty 200 stream)."""
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    with sdk.chat.completions.with_streaming_response.create(
        model="cascade/cr-live", messages=MESSAGES, stream=True, user=key(), **options
    ) as response:
        assert response.headers["x-pointsman-stage"] == "1:cr-stream"
        chunks = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CR_TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    info = extension(chunks[-1])
    assert info["escalated"] is True and info["answered_by"]["model"] == "cr-stream"
    if include_usage:
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7 + len(CR_TEXT.split(" "))


@pytest.mark.parametrize("include_usage", [True, False])
def test_a_live_final_stage_ending_with_an_unterminated_done_keeps_its_finish_chunk(
    sdk: OpenAI, include_usage: bool
) -> None:
    """The final stage's stream ends with ``data: [DONE]`` and no blank line after it (the body's last
    line; the relay accepts it as the end). The finish chunk the workflow holds to add its extension is
    still sent (without a usage chunk it was lost: the client's stream had no finish_reason)."""
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    with sdk.chat.completions.with_streaming_response.create(
        model="cascade/done-unended", messages=MESSAGES, stream=True, user=key(), **options
    ) as response:
        chunks = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CR_TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    info = extension(chunks[-1])
    assert info["escalated"] is True and info["answered_by"]["model"] == "done-unended"


def test_tokens_spelled_longer_than_their_text_are_all_scored(sdk: OpenAI) -> None:
    """An answer that starts with an emoji whose tokens the server writes as escaped bytes
    (``"\\xf0\\x9f\\x98"``: 12 characters for part of one): every token of the answer counts, so
    its least likely one (`` 42``, logprob -2) makes it escalate. The tokens were cut off once they
    had "spelled" as many characters as the text has, leaving only the sure ones: accepted at 0.99."""
    completion = sdk.chat.completions.create(model="cascade/escaped-bytes", messages=MESSAGES, user=key())
    info = extension(completion)
    assert info["steps"][0]["confidence"] == pytest.approx(math.exp(-2.0), abs=1e-6)
    assert info["escalated"] is True and completion.choices[0].message.content == STRONG_TEXT


def test_a_running_usage_on_every_chunk_still_ends_with_the_workflows_totals(sdk: OpenAI) -> None:
    """vLLM's continuous_usage_stats: every chunk of the final stage carries its usage so far. The
    client's last chunk has the workflow's totals (both stages) and the extension, no other chunk
    has the extension (the first chunk with a usage took both, and the stream then ended with the
    final stage's own usage only)."""
    options: Any = {"include_usage": True, "continuous_usage_stats": True}
    with sdk.chat.completions.with_streaming_response.create(
        model="cascade/running-usage", messages=MESSAGES, stream=True, user=key(), stream_options=options
    ) as response:
        chunks = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CR_TEXT
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    words = len(CR_TEXT.split(" "))
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (11 + 11, 7 + words)
    assert extension(last)["answered_by"]["model"] == "running-usage"
    assert not any((c.model_extra or {}).get("pointsman") for c in chunks[:-1])
