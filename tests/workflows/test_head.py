"""A trained answer-confidence head in workflows: the ``head`` confidence source decides a cascade,
and a ratings workflow scores its candidates with it (no judge sub-call).

The artifact is built here through the head's own API (``classifiers.answer_confidence``): a small
logistic regression over the static encoder's embedding and the answer checks, trained to tell a
clear final answer from a hedge. The gateway loads it at start-up and scores off the event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai import OpenAI

from classifiers.answer_confidence import model
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import CHEAP, STRONG, STRONG_TEXT
from tests.workflows.helpers import extension, feedback

SURE = "Three boxes of 14 apples make 3 * 14 = 42 apples. The answer is 42."
HEDGE = "Hmm, I am not sure about this one, maybe it is something else, I cannot really say"
QUESTION = "How many apples are in three boxes of 14 apples?"


def build_artifact(directory: Path) -> Path:
    from classifiers.encoders import load_encoder
    from classifiers.heads.fit import fit_head

    encoder = load_encoder("static")
    questions = [f"How many apples are in {n} boxes of {m} apples?" for n in range(2, 7) for m in (12, 14, 15, 20)]
    pairs = [(q, f"{q.split()[4]} boxes make the total. The answer is {7 * i + 5}.") for i, q in enumerate(questions)]
    pairs += [(q, "Hmm, I am not sure, maybe something else, I cannot really say") for q in questions]
    labels = np.array([1] * len(questions) + [0] * len(questions))
    x = model.answer_features(encoder.encode([model.answer_text(p, a) for p, a in pairs]), pairs)
    head, _ = fit_head("logreg", x, labels, ["bad", "good"], C=1.0)
    head.manifest = {"task": model.TASK, "encoder": encoder.id, "encoder_name": "static",
                     "feature_schema": {"checks": list(model.CHECK_NAMES)}}
    return head.save(directory / "answer-confidence")


@pytest.fixture(scope="module")
def head_gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("head")
    artifact = build_artifact(workdir)
    confidence: dict[str, Any] = {"source": "head", "threshold": 0.5, "artifact": str(artifact)}
    config = {
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False}, "models": [
            {"name": "sure", "upstream_name": f"say:{SURE}", **CHEAP},
            {"name": "hedging", "upstream_name": f"say:{HEDGE}", **CHEAP},
            {"name": "strong", "upstream_name": f"say:{STRONG_TEXT}", **STRONG},
        ]}],
        "workflows": [
            {"name": "sure", "kind": "cascade", "stages": ["sure", "strong"], "confidence": confidence},
            {"name": "hedging", "kind": "cascade", "stages": ["hedging", "strong"], "confidence": confidence},
            {"name": "scored", "kind": "ratings", "candidates": ["hedging", "sure"],
             "head": {"artifact": str(artifact)}},
        ],
    }
    proc = GatewayProcess(config, workdir).start(timeout=90)
    yield proc
    proc.terminate()


@pytest.mark.parametrize(("workflow", "answered"), [("sure", "sure"), ("hedging", "strong")])
def test_the_head_accepts_a_clear_answer_and_escalates_a_hedge(
    head_gateway: GatewayProcess, workflow: str, answered: str
) -> None:
    sdk = OpenAI(base_url=head_gateway.base_url, api_key="unused", max_retries=0, timeout=60)
    raw = sdk.chat.completions.with_raw_response.create(
        model=f"cascade/{workflow}", messages=[{"role": "user", "content": QUESTION}])
    assert raw.headers["x-pointsman-model"] == answered
    confidence = extension(raw.parse())["steps"][0]["confidence"]
    assert (confidence >= 0.5) is (answered == workflow)


def test_ratings_can_score_with_the_head(head_gateway: GatewayProcess) -> None:
    sdk = OpenAI(base_url=head_gateway.base_url, api_key="unused", max_retries=0, timeout=60)
    raw = sdk.chat.completions.with_raw_response.create(
        model="ratings/scored", messages=[{"role": "user", "content": QUESTION}])
    completion = raw.parse()
    assert completion.choices[0].message.content == SURE and raw.headers["x-pointsman-stage"] == "1:sure"
    ext = extension(completion)
    assert [s["step"] for s in ext["steps"]] == ["candidate", "candidate"]  # no judge sub-call
    ratings = {r["model"]: r for r in ext["ratings"]}
    assert ratings["sure"]["rank"] == 1 and ratings["sure"]["score"] > ratings["hedging"]["score"]
    assert ratings["sure"]["mode"] == "head"
    rows = feedback(head_gateway, raw.headers["x-pointsman-request-id"], 2)
    assert {(r["model"], r["source"]) for r in rows} == {("sure", "judge"), ("hedging", "judge")}
