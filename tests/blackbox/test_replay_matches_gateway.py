"""Black-box: ``pointsman eval`` replays exactly the decisions the running gateway made.

The real gateway (subprocess) serves a ``policy: rules`` route (static encoder, the shipped
difficulty head, a keyword rule, a fixed threshold, no stickiness) against a fake upstream. Every
conversation goes through ``/v1/chat/completions`` with the openai SDK; the decision log says which
model the gateway chose and the score it compared. The same conversations, as a labelled file, go
through ``pointsman eval`` (a separate process, no backend): its ``decisions.jsonl`` must match the
gateway's records one by one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from openai import OpenAI

from evals.replay import replay_route
from policies.brain import build_brain, parse_routing_config
from tests.evals.labelled_files import prompts
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess


def gateway_config(upstream: FakeUpstream, threshold: float) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
            "models": [
                {"name": "big-model", "upstream_name": "ok", "input_cost_per_mtok": 10, "output_cost_per_mtok": 30},
                {"name": "small-model", "upstream_name": "ok", "input_cost_per_mtok": 0.5,
                 "output_cost_per_mtok": 1.5},
            ],
        }],
        "classifiers": {"encoder": "static"},
        "routes": [{
            "name": "auto", "policy": "rules",
            "signals": {"keywords": {"greet": {"keywords": ["say hello"]}}},
            "rules": [{"name": "hello-small", "when": {"signal": "greet", "op": "truthy"},
                       "action": {"route": "small-model"}}],
            "cost_quality": {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                             "threshold": threshold},
        }],
    }


def conversations() -> list[list[dict[str, str]]]:
    """Single prompts, and conversations with a system prompt and earlier turns (the whole
    conversation is what both sides score)."""
    texts = [t for t, _ in prompts(seed=11, n=60)]
    out = [[{"role": "user", "content": t}] for t in texts[:40]]
    for i in range(40, 60, 2):
        out.append([
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": texts[i]},
            {"role": "assistant", "content": "Here is my answer."},
            {"role": "user", "content": texts[i + 1]},
        ])
    return out


def median_score(config: dict[str, Any], convs: list[list[dict[str, str]]]) -> float:
    """A threshold that splits these conversations' scores in half (so both models are chosen)."""

    async def scores() -> list[float]:
        brain = build_brain(parse_routing_config(config), sticky=False, explore=False)
        await brain.start()
        try:
            replay = await replay_route(brain, "auto", convs)
        finally:
            await brain.close()
        return [d.score for d in replay.decisions if d.score is not None]

    return round(float(np.median(asyncio.run(scores()))), 4)


def test_replay_gives_the_gateways_decisions(upstream: FakeUpstream, tmp_path: Path) -> None:
    convs = conversations()
    threshold = median_score(gateway_config(upstream, 0.5), convs)
    config = gateway_config(upstream, threshold)
    gateway = GatewayProcess(config, tmp_path).start(timeout=60)
    try:
        sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)
        served = []
        for messages in convs:
            raw = sdk.chat.completions.with_raw_response.create(model="auto", messages=messages)  # type: ignore[arg-type]
            raw.parse()
            served.append((raw.headers["x-pointsman-model"], raw.headers["x-pointsman-request-id"]))
        records = [gateway.decision(request_id) for _, request_id in served]
    finally:
        gateway.terminate()
    assert [r["model"] for r in records] == [model for model, _ in served]

    # The same conversations as a labelled file (the qualities do not matter for the decisions).
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(
        json.dumps({"messages": m, "scores": {"big-model": 1.0, "small-model": float(i % 2)}, "id": f"c{i}"}) + "\n"
        for i, m in enumerate(convs)
    ))
    assert gateway.config_path is not None
    out = tmp_path / "eval"
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "eval", "--config", str(gateway.config_path), "--route", "auto",
         "--data", f"file:{data}", "--out", str(out), "--bootstrap", "50", "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    replayed = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert [d["request_id"] for d in replayed] == [f"c{i}" for i in range(len(convs))]

    by_rule = 0
    for i, (record, decision) in enumerate(zip(records, replayed, strict=True)):
        details = json.loads(record["decision"]).get("details", {})
        assert decision["model"] == record["model"], (i, record["reason"], decision["reason"])
        if "score" in details:
            assert decision["by"] == "knob"
            assert decision["score"] == pytest.approx(details["score"], abs=1e-4)
            assert details["threshold"] == pytest.approx(threshold)
        else:
            assert decision["by"] == "rule" and "hello-small" in record["reason"]
            by_rule += 1
    models = [r["model"] for r in records]
    assert by_rule > 0 and models.count("big-model") > 5 and models.count("small-model") > 5
    report = json.loads((out / "report.json").read_text())
    assert report["knob"]["threshold"] == threshold and report["knob"]["threshold_source"] == "config"
    assert report["rows"]["evaluated"] == len(convs)
    assert yaml.safe_load(gateway.config_path.read_text())["routes"][0]["cost_quality"]["threshold"] == threshold
