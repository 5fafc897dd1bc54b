"""Streaming clients get one valid OpenAI stream in every workflow mode: a buffered answer written
as SSE (cascade accepted, judge, ratings) or the final stage live (cascade escalated, fuser, graph
output), with the workflow's usage totals and its extension on the last chunk."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import CHEAP_CALL, MESSAGES, STRONG_TEXT, key
from tests.workflows.helpers import extension, record

MODES = [
    ("cascade/accept", "Hello from the fake upstream.", "above", False),
    ("cascade/escalate", STRONG_TEXT, "strong", True),
    ("fusion/moa", "The fused answer.", "fuser", True),
    ("fusion/scored", "Answer A quality=0.9", "cand-a", False),
    ("ratings/panel", "Answer A quality=0.9", "cand-a", False),
    ("graph/dcr", "ECHO: Revise [ECHO: Say hello.] given [ECHO: Critique [ECHO: Say hello.] of [Say hello.]]",
     "echo", True),
]


def stream(sdk: OpenAI, model: str, **kwargs: Any) -> tuple[list[Any], dict[str, str]]:
    with sdk.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, stream=True, user=key(), **kwargs
    ) as response:
        headers = dict(response.headers)
        chunks = list(response.parse())
    return chunks, headers


@pytest.mark.parametrize(("model", "text", "answered", "live"), MODES)
def test_every_mode_streams_with_usage_totals(
    sdk: OpenAI, wf_gateway: GatewayProcess, model: str, text: str, answered: str, live: bool
) -> None:
    chunks, headers = stream(sdk, model, stream_options={"include_usage": True})
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["x-pointsman-workflow"] == model and headers["x-pointsman-model"] == answered
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert len({c.id for c in chunks}) == 1 and len({c.model for c in chunks}) == 1
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    ext = extension(last)
    assert ext["workflow"] == model and ext["answered_by"]["model"] == answered
    assert all(not (c.model_extra or {}).get("pointsman") for c in chunks[:-1])  # only on the last chunk
    row = record(wf_gateway, headers["x-pointsman-request-id"])
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (row["prompt_tokens"], row["completion_tokens"])
    assert ext["cost_usd"] == pytest.approx(row["cost_usd"], abs=1e-9)
    assert row["stream"] == 1 and row["outcome"] == "ok" and row["ttft_ms"] is not None
    assert (row["workflow"]["buffered_ms"] <= row["ttft_ms"] + 1) if live else row["ttft_ms"] > 0


@pytest.mark.parametrize(("model", "text", "answered", "live"), MODES)
def test_without_include_usage_there_is_no_usage_chunk(
    sdk: OpenAI, model: str, text: str, answered: str, live: bool
) -> None:
    chunks, _ = stream(sdk, model)
    assert all(c.choices for c in chunks), "a chunk without choices the client did not ask for"
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert extension(chunks[-1])["answered_by"]["model"] == answered


def test_the_raw_stream_is_well_formed(wf_gateway: GatewayProcess) -> None:
    for model in ("cascade/accept", "cascade/escalate"):
        body = {"model": model, "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{wf_gateway.base_url}/chat/completions", json=body, timeout=30) as response:
            raw = b"".join(response.iter_bytes())
        events = raw.split(b"\n\n")
        assert events[-2:] == [b"data: [DONE]", b""] and all(e.startswith(b"data: ") for e in events[:-1])


def test_a_streamed_escalation_counts_both_stages(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    chunks, headers = stream(sdk, "cascade/escalate", stream_options={"include_usage": True})
    usage = chunks[-1].usage
    assert usage is not None
    # 11 + 7 tokens of the cheap stage, 11 + 3 (one per streamed chunk of text) of the strong one.
    assert (usage.prompt_tokens, usage.completion_tokens) == (22, 10)
    row = record(wf_gateway, headers["x-pointsman-request-id"])
    assert row["cost_usd"] == pytest.approx(CHEAP_CALL + (11 * 10.0 + 3 * 30.0) / 1e6)
