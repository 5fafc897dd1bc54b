"""The per-model quality head: trained on real RouterBench-train data (static encoder), held-out quality,
a safe artifact that says where its data came from, and the ``quality`` signal served from it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from classifiers.heads import load_head
from classifiers.provider import DEFAULT_ROUTERS_DIR, ClassifierSignalProvider, build_extractors, load_router_heads
from evals.quality import LICENSE, refuse_shipped_dir
from evals.train import main as train_main
from policies import RequestContext

ARTIFACT = "quality-routerbench-static"


@pytest.fixture(scope="module")
def manifest(quality_routers_dir: Path) -> dict[str, Any]:
    return json.loads((quality_routers_dir / ARTIFACT / "manifest.json").read_text())


def test_artifact_is_numpy_only_and_names_its_data_and_licence(quality_routers_dir: Path,
                                                                 manifest: dict[str, Any]) -> None:
    directory = quality_routers_dir / ARTIFACT
    assert sorted(p.name for p in directory.iterdir()) == ["manifest.json", "weights.npz"]
    head = load_head(directory)
    assert head.kind == "multilabel"
    assert "gpt-4-1106-preview" in head.labels and len(head.labels) == 11
    assert manifest["license"] == LICENSE == "none declared upstream: do not redistribute"
    assert manifest["redistributable"] is False
    data = manifest["data"]
    assert data["sources"][0]["license"] == LICENSE
    assert "RouterDC" in data["sources"][0]["url"]
    assert manifest["encoder"] == "minilm-static-256"
    assert manifest["feature_schema"]["cheap"]
    # Independent per-model probabilities, calibrated per label.
    proba = head.predict_proba(np.zeros((2, head.n_features)))
    assert proba.shape == (2, 11) and ((proba > 0) & (proba < 1)).all()
    assert head.calibration["method"] == "platt_per_label"


def test_held_out_quality_per_model(manifest: dict[str, Any]) -> None:
    metrics = manifest["metrics"]
    per_model = metrics["test_per_model"]
    gpt4 = per_model["gpt-4-1106-preview"]
    assert gpt4["n"] > 400
    assert gpt4["auc"] > 0.6  # measured 0.68 (static encoder; random is 0.5)
    assert metrics["test_mean_auc"] > 0.6  # measured 0.65 over the 11 models
    # Calibrated: the mean prediction is close to the held-out base rate for every model.
    for name, m in per_model.items():
        assert abs(m["mean_predicted"] - m["base_rate"]) < 0.1, name


def test_policy_trades_quality_for_cost_as_lambda_grows(manifest: dict[str, Any]) -> None:
    policy = manifest["metrics"]["test_policy"]
    at = policy["at_lambda"]
    cost = {float(lam): point["cost_usd"] for lam, point in at.items()}
    quality = {float(lam): point["quality"] for lam, point in at.items()}
    assert cost[0.0] > cost[0.1] > cost[0.2] >= cost[1.0]
    assert cost[1.0] < cost[0.0] / 5
    assert quality[0.0] > quality[1.0]
    # λ=0 follows the predicted-best model: about as good as the best single model (GPT-4, 0.89).
    assert quality[0.0] >= policy["single_models"]["gpt-4-1106-preview"]["quality"] - 0.02
    # The point of routing: at λ=0.2 it beats every single model that costs no more (measured 0.78 vs 0.75).
    assert quality[0.2] > at["0.2"]["best_single_at_cost"]["quality"]


def test_quality_signal_scores_every_model_from_one_encoding(quality_routers_dir: Path) -> None:
    from classifiers.batching import BatchingEncoder
    from classifiers.encoders import load_encoder

    heads = load_router_heads("static", quality_routers_dir)
    assert heads.quality is not None
    # The directory holds only the quality head; difficulty falls back to the shipped artifact.
    assert not heads.sources["difficulty"].startswith(str(quality_routers_dir))
    assert heads.sources["quality"].endswith(ARTIFACT)

    async def run() -> dict[str, Any]:
        encoder = BatchingEncoder(load_encoder("static"))
        encoder.start()
        try:
            provider = ClassifierSignalProvider(encoder=encoder, heads=heads, extractors=build_extractors())
            assert "quality" in provider.available
            body = {"messages": [{"role": "user", "content": "Write a Python function that reverses a list."}]}
            ctx = RequestContext(request_id="t", endpoint="chat.completions", route="auto", body=body)
            signals = await provider.compute({"quality", "length"}, ctx)
            return signals["quality"].as_dict()
        finally:
            await encoder.close()

    signal = asyncio.run(run())
    value = signal["value"]
    assert set(value) == set(heads.quality.labels)
    assert all(0.0 < p < 1.0 for p in value.values())
    assert 0.0 <= signal["confidence"] <= 1.0
    detail = signal["detail"]
    assert detail["artifact"] == ARTIFACT and detail["best"] in value


def test_two_quality_heads_for_one_encoder_are_ambiguous(quality_routers_dir: Path, tmp_path: Path) -> None:
    for name in ("quality-a-static", "quality-b-static"):
        (tmp_path / name).mkdir()
        for f in ("manifest.json", "weights.npz"):
            (tmp_path / name / f).write_bytes((quality_routers_dir / ARTIFACT / f).read_bytes())
    with pytest.raises(ValueError, match="more than one quality head"):
        load_router_heads("static", tmp_path)


@pytest.mark.parametrize("out", [DEFAULT_ROUTERS_DIR, DEFAULT_ROUTERS_DIR / "mine"])
def test_training_refuses_the_shipped_artifact_directory(out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="must not go into the package"):
        refuse_shipped_dir(out)
    code = train_main(["--quality", "routerbench", "--encoders", "static", "--out", str(out)])
    assert code == 2
    assert "shipped artifact directory" in capsys.readouterr().err
    assert not (DEFAULT_ROUTERS_DIR / "mine").exists()
    assert not list(DEFAULT_ROUTERS_DIR.glob("quality-*"))
