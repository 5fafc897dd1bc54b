"""The pure parts of workflows: confidence from logprobs, agreement and verifiers, judge ratings,
the budget, and the SSE writer and rewriter."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from gateway.completion_bounds import with_max_tokens
from gateway.config import ModelConfig
from gateway.workflows.bodies import ClientAsk
from gateway.workflows.caps import EXPECTED_COMPLETION_TOKENS, Budget, CapReached
from gateway.workflows.confidence import agreement, logprob_confidence, normalise_final, verifier_confidence
from gateway.workflows.judging import parse_rating
from gateway.workflows.respond import restore_logprobs
from gateway.workflows.sse import LiveRewriter, render
from policies.workflows import Caps


def token(text: str, logprob: float, *alternatives: float) -> dict[str, Any]:
    top = [{"token": text, "logprob": logprob}] + [{"token": f"x{i}", "logprob": a} for i, a in enumerate(alternatives)]
    return {"token": text, "logprob": logprob, "top_logprobs": top}


def completion(content: str | None, tokens: list[dict[str, Any]] | None, tool: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool:
        message["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop",
                         "logprobs": None if tokens is None else {"content": tokens}}]}


def test_logprob_statistics() -> None:
    answer = completion("ab cd", [token("ab", -0.1, -2.0), token(" cd", -0.5, -1.0)])
    assert logprob_confidence(answer, "mean") == pytest.approx(math.exp(-0.3))
    assert logprob_confidence(answer, "min") == pytest.approx(math.exp(-0.5))
    margin = ((math.exp(-0.1) - math.exp(-2.0)) + (math.exp(-0.5) - math.exp(-1.0))) / 2
    assert logprob_confidence(answer, "margin") == pytest.approx(margin)


def test_logprobs_of_tool_call_json_are_excluded() -> None:
    # vLLM-style: the text's tokens, then the tool call's JSON tokens (very sure of the syntax).
    tokens = [token("Let", -1.0), token(" me", -1.0), token(' {"a":', -0.001), token(" 1}", -0.001)]
    assert logprob_confidence(completion("Let me", tokens, tool=True)) == pytest.approx(math.exp(-1.0))
    assert logprob_confidence(completion(None, tokens, tool=True)) is None  # only a tool call: no text to judge


def test_text_tokens_before_a_tool_call_are_counted_in_bytes() -> None:
    # "Café" then the tool call's JSON; the server writes the "é" as two escaped byte tokens.
    tokens = [token("Caf", -0.1), {**token("\\xc3", -0.1), "bytes": [195]}, {**token("\\xa9", -3.0), "bytes": [169]},
              token(' {"a":', -0.001)]
    assert logprob_confidence(completion("Café", tokens, tool=True), "min") == pytest.approx(math.exp(-3.0))


@pytest.mark.parametrize("answer", [
    completion("text", None), completion("", [token("", -0.1)]), {"choices": []}, {},
    completion("ab", [token("ab", -0.1)]) | {"choices": [{"message": {"content": "ab"}, "logprobs": {"content": []}}]},
])
def test_no_usable_logprobs_is_none(answer: dict[str, Any]) -> None:
    assert logprob_confidence(answer) is None


def test_margin_needs_two_alternatives() -> None:
    assert logprob_confidence(completion("ab", [token("ab", -0.1)]), "margin") is None


def test_agreement_on_the_final_answer() -> None:
    assert normalise_final("So the total is 1,000.50 dollars.") == normalise_final("#### 1000.5")
    assert normalise_final("x = 42") == normalise_final("The answer is 42.") == "number:42"
    assert normalise_final("Paris!") == normalise_final("  paris ") == "text:paris"
    assert agreement(["x = 42", "The answer is 42.", "17"]) == (0, pytest.approx(2 / 3))
    assert agreement(["17", "42", "42"]) == (1, pytest.approx(2 / 3))
    assert agreement(["a", "b", "c"]) == (0, pytest.approx(1 / 3))
    assert agreement(["only one"]) is None


def test_verifier_confidence() -> None:
    def verdict(text: str, top: list[tuple[str, float]] | None = None) -> dict[str, Any]:
        tokens = None if top is None else [{"token": top[0][0], "logprob": top[0][1],
                                            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}]
        return completion(text, tokens)

    assert verifier_confidence(verdict("Yes.")) == 1.0
    assert verifier_confidence(verdict("no, it is wrong")) == 0.0
    assert verifier_confidence(verdict("Perhaps")) is None
    p = verifier_confidence(verdict("Yes", [("Yes", math.log(0.6)), ("No", math.log(0.3)), ("Maybe", math.log(0.1))]))
    assert p == pytest.approx(0.6 / 0.9)


@pytest.mark.parametrize(("text", "score"), [
    ("[[8]]", 7 / 9), ("Rating: [[10]]", 1.0), ("[[1]]", 0.0), ("Rating: 5", 4 / 9), ("7/10", 6 / 9),
    ("[[3]] or [[9]]", None), ("[[11]]", None), ("It is great", None),
    ("-5", None), ("[[-5]]", None), ("Rating: -3", None), ("Score: -2/10", None),  # below the scale, not 5
])
def test_parse_rating(text: str, score: float | None) -> None:
    assert parse_rating(text) == (None if score is None else pytest.approx(score))


def test_budget_reserves_bounds_and_settles() -> None:
    model = ModelConfig(name="m", input_cost_per_mtok=1.0, output_cost_per_mtok=2.0)
    budget = Budget(Caps(max_steps=3, max_tokens=1000, max_cost_usd=1e-3))
    first, bound = budget.reserve(model, 100, None)
    # Tokens: 1000 - 100 left; cost: (1e-3 - 100 * 1e-6) / 2e-6 = 450 tokens affordable.
    assert bound == 450
    assert first.tokens == 100 + EXPECTED_COMPLETION_TOKENS
    budget.settle(first, 600, 5e-4)
    with pytest.raises(CapReached) as info:
        budget.reserve(model, 500, None)  # 1000 - 600 - 500 < 1
    assert info.value.cap == "max_tokens"
    _, bound = budget.reserve(model, 100, 50)
    assert bound == 50  # the request's own bound is lower than what is left
    budget.reserve(model, 1, 1)  # the third step (a refused reservation is no step)
    with pytest.raises(CapReached) as info:
        budget.reserve(model, 1, 1)
    assert info.value.cap == "max_steps"


def test_cost_cap_with_free_output() -> None:
    free = ModelConfig(name="free", input_cost_per_mtok=1.0)
    budget = Budget(Caps(max_cost_usd=1e-4))
    _, bound = budget.reserve(free, 50, None)
    assert bound is None  # nothing binds the completion: it costs nothing
    with pytest.raises(CapReached):
        budget.reserve(free, 10_000, None)  # the prompt alone is over


def test_max_tokens_goes_into_the_field_the_client_used() -> None:
    assert with_max_tokens({"max_completion_tokens": 900}, 100) == {"max_completion_tokens": 100}
    assert with_max_tokens({"max_tokens": 50}, 100) == {"max_tokens": 50}
    assert with_max_tokens({}, 100) == {"max_tokens": 100}
    assert with_max_tokens({}, None) == {}


def test_restoring_logprobs() -> None:
    answer = completion("ab", [token("ab", -0.1, -2.0)])
    restore_logprobs(answer, ClientAsk(stream=False, include_usage=False, logprobs=True, top_logprobs=1))
    assert len(answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1
    restore_logprobs(answer, ClientAsk(stream=False, include_usage=False, logprobs=False, top_logprobs=None))
    assert answer["choices"][0]["logprobs"] is None


def events(raw: bytes) -> list[Any]:
    assert raw.endswith(b"data: [DONE]\n\n")
    return [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]


def test_render_writes_a_buffered_answer_as_a_stream() -> None:
    answer = {"id": "c1", "created": 5, "model": "m", **completion("Hi there", None, tool=True),
              "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, "pointsman": {"x": 1}}
    with_usage = events(render(answer, include_usage=True))
    assert [e["choices"][0]["delta"] for e in with_usage[:3]] == [
        {"role": "assistant", "content": ""}, {"content": "Hi there"},
        {"tool_calls": [{"index": 0, "id": "c", "type": "function",
                         "function": {"name": "f", "arguments": '{"a": 1}'}}]},
    ]
    assert with_usage[3]["choices"][0]["finish_reason"] == "stop" and "pointsman" not in with_usage[3]
    assert with_usage[4]["choices"] == [] and with_usage[4]["usage"]["total_tokens"] == 5
    assert with_usage[4]["pointsman"] == {"x": 1}
    without = events(render(answer, include_usage=False))
    assert len(without) == 4 and without[-1]["pointsman"] == {"x": 1} and "usage" not in without[-1]


def live(client_usage: bool) -> tuple[LiveRewriter, list[Any]]:
    seen: list[Any] = []

    def close(usage: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        seen.append(usage)
        return {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}, {"workflow": "cascade/x"}

    return LiveRewriter(client_usage=client_usage, close=close), seen


UPSTREAM = [
    b'data: {"id":"u","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n',
    b'data: {"id":"u","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}\n\n',
    b'data: {"id":"u","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b'data: {"id":"u","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}\n\n',
    b"data: [DONE]\n\n",
]


def test_live_rewriter_puts_totals_into_the_usage_chunk() -> None:
    rewriter, seen = live(client_usage=True)
    # Split at awkward places: events arrive in pieces.
    raw = b"".join(UPSTREAM)
    out = b"".join(rewriter.feed(raw[i:i + 7]) for i in range(0, len(raw), 7))
    assert out.startswith(UPSTREAM[0] + UPSTREAM[1])  # the answer passes through byte for byte
    parsed = events(out)
    assert parsed[2]["choices"][0]["finish_reason"] == "stop" and "pointsman" not in parsed[2]
    assert parsed[3]["usage"]["total_tokens"] == 50 and parsed[3]["pointsman"] == {"workflow": "cascade/x"}
    assert seen == [{"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}]


def test_live_rewriter_drops_the_usage_chunk_the_client_did_not_ask_for() -> None:
    rewriter, seen = live(client_usage=False)
    parsed = events(b"".join(rewriter.feed(chunk) for chunk in UPSTREAM))
    assert len(parsed) == 3 and all(e["choices"] for e in parsed)
    assert parsed[-1]["pointsman"] == {"workflow": "cascade/x"} and seen[0]["completion_tokens"] == 2


def test_live_rewriter_without_an_upstream_usage_chunk() -> None:
    rewriter, seen = live(client_usage=True)
    parsed = events(b"".join(rewriter.feed(chunk) for chunk in (*UPSTREAM[:3], UPSTREAM[4])))
    assert parsed[-1]["choices"][0]["finish_reason"] == "stop" and parsed[-1]["pointsman"]
    assert parsed[-1]["usage"]["total_tokens"] == 50 and seen == [None]


def test_live_rewriter_reads_a_finish_chunk_written_over_several_data_lines() -> None:
    # SSE joins an event's data lines with LF: the finish chunk is one JSON object over two lines.
    rewriter, _ = live(client_usage=False)
    split = b'data: {"id":"u",\ndata: "choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    parsed = events(b"".join(rewriter.feed(chunk) for chunk in (UPSTREAM[0], split, UPSTREAM[4])))
    assert parsed[-1]["choices"][0]["finish_reason"] == "stop"
    assert parsed[-1]["pointsman"] == {"workflow": "cascade/x"}


@pytest.mark.parametrize("client_usage", [True, False])
def test_live_rewriter_with_the_usage_on_the_finish_chunk(client_usage: bool) -> None:
    # A backend that puts its usage on the finish chunk and sends no chunk of usage alone.
    rewriter, seen = live(client_usage=client_usage)
    finish = (b'data: {"id":"u","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}\n\n')
    parsed = events(b"".join(rewriter.feed(chunk) for chunk in (UPSTREAM[0], finish, UPSTREAM[4])))
    assert len(parsed) == 2 and parsed[-1]["choices"][0]["finish_reason"] == "stop"
    assert parsed[-1]["pointsman"] == {"workflow": "cascade/x"} and seen[0]["completion_tokens"] == 2
    assert parsed[-1]["usage"] == ({"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}
                                   if client_usage else None)


def test_a_bound_the_caps_set_is_never_more_than_the_model_can_write() -> None:
    """A cost cap affords ~83k tokens of gpt-4o-mini (README's $0.05): the bound it sets stays within the
    model's output limit and the context left after the prompt, which upstreams refuse to exceed."""
    mini = ModelConfig(name="gpt-4o-mini", input_cost_per_mtok=0.15, output_cost_per_mtok=0.6,
                       max_output_tokens=16_384, context_window=128_000)
    _, bound = Budget(Caps(max_cost_usd=0.05)).reserve(mini, 100, None)
    assert bound == 16_384
    _, bound = Budget(Caps(max_cost_usd=0.05)).reserve(mini, 120_000, None)
    assert bound == 8_000  # the context left after the prompt
    _, bound = Budget(Caps(max_cost_usd=0.05)).reserve(mini, 100, 500)
    assert bound == 500  # the client's own lower bound stands
    _, bound = Budget(Caps(max_cost_usd=1e-3)).reserve(mini, 100, None)
    assert bound == 1_641  # the cap binds below the limit: (1e-3 - 100 * 0.15e-6) / 0.6e-6
    unknown = ModelConfig(name="m", output_cost_per_mtok=0.6)
    _, bound = Budget(Caps(max_cost_usd=0.05)).reserve(unknown, 100, None)
    assert bound == 83_333  # no limit configured: the cap's own bound
