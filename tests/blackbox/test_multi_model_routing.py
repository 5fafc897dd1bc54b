"""Black-box: a ``multi_model`` route chooses among three models with the trained quality head.

The gateway runs as a subprocess with ``classifiers.routers_dir`` pointing at a quality head trained
this session on RouterBench-train (static encoder); three fake upstream models stand for the
RouterBench models they are mapped to. What is asserted is the routing: which model answered
(headers), and that the decision log holds the per-model quality scores the choice was made from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

# Configured model -> (RouterBench model of the quality head, $ per million input / output tokens).
MODELS = {
    "premium": ("gpt-4-1106-preview", 10.0, 30.0),
    "middle": ("mistralai/mixtral-8x7b-chat", 0.6, 0.6),
    "budget": ("mistralai/mistral-7b-chat", 0.2, 0.2),
}


def _route(name: str, lam: float) -> dict[str, object]:
    return {
        "name": name,
        "policy": "rules",
        "multi_model": {
            "lambda": lam,
            "candidates": list(MODELS),
            "quality_models": {model: label for model, (label, _, _) in MODELS.items()},
        },
    }


def multi_config(upstream: FakeUpstream, routers_dir: Path) -> dict[str, object]:
    return {
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [
                {"name": name, "upstream_name": "ok", "input_cost_per_mtok": cin, "output_cost_per_mtok": cout}
                for name, (_, cin, cout) in MODELS.items()
            ],
        }],
        "classifiers": {"encoder": "static", "routers_dir": str(routers_dir)},
        "routes": [_route("auto", 0.1), _route("best", 0.0), _route("cheapest", 100.0)],
    }


@pytest.fixture(scope="module")
def gateway_mm(
    upstream: FakeUpstream, quality_routers_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(multi_config(upstream, quality_routers_dir), tmp_path_factory.mktemp("multi"))
    proc.start(timeout=60)
    yield proc
    proc.terminate()


@pytest.fixture
def sdk(gateway_mm: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway_mm.base_url, api_key="unused", max_retries=0, timeout=30)


def _ask(sdk: OpenAI, route: str, prompt: str) -> tuple[str, str, str]:
    raw = sdk.chat.completions.with_raw_response.create(model=route, messages=[{"role": "user", "content": prompt}])
    raw.parse()
    return raw.headers["x-pointsman-model"], raw.headers["x-pointsman-route"], raw.headers["x-pointsman-request-id"]


PROMPT = "Which is heavier, a kilogram of feathers or a kilogram of iron? A) feathers B) iron C) the same"


def test_the_multi_model_rule_chooses_and_records_quality_scores(sdk: OpenAI, gateway_mm: GatewayProcess) -> None:
    model, route, rid = _ask(sdk, "auto", PROMPT)
    assert route == "auto" and model in MODELS
    record = gateway_mm.decision(rid)
    assert record["model"] == model
    assert f"best utility {model}" in record["reason"]
    quality = json.loads(record["signals"])["quality"]
    assert set(quality["value"]) >= {label for label, _, _ in MODELS.values()}
    assert quality["detail"]["artifact"] == "quality-routerbench-static"
    details = json.loads(record["decision"])["details"]
    # Every candidate's quality, read under its mapped RouterBench name.
    assert details["qualities"] == {name: quality["value"][label] for name, (label, _, _) in MODELS.items()}
    # The choice is the utility argmax over what was recorded (costs normalised by the dearest, 40 $/M).
    utility = {name: details["qualities"][name] - 0.1 * (cin + cout) / 40.0 for name, (_, cin, cout) in MODELS.items()}
    assert model == max(utility, key=lambda name: utility[name])
    assert details["utility"] == pytest.approx(utility[model], abs=1e-3)


def test_lambda_moves_the_choice_between_quality_and_price(sdk: OpenAI, gateway_mm: GatewayProcess) -> None:
    best, _, rid = _ask(sdk, "best", PROMPT)
    qualities = json.loads(gateway_mm.decision(rid)["decision"])["details"]["qualities"]
    assert best == max(qualities, key=lambda name: qualities[name])
    cheapest, _, _ = _ask(sdk, "cheapest", PROMPT)
    assert cheapest == "budget"


def test_route_endpoint_shows_quality_scores_and_the_ranking(gateway_mm: GatewayProcess) -> None:
    response = httpx.post(f"{gateway_mm.base_url}/route", json={
        "model": "auto", "messages": [{"role": "user", "content": PROMPT}]}, timeout=30)
    assert response.status_code == 200
    explained = response.json()
    ranking = explained["multi_model"]["ranking"]
    assert ranking[0]["model"] == explained["model"]
    assert {entry["model"] for entry in ranking} == set(MODELS)
    assert {entry["quality_key"] for entry in ranking} == {label for label, _, _ in MODELS.values()}
    assert all(entry["eligible"] and 0 < entry["quality"] < 1 for entry in ranking)
    utilities = [entry["utility"] for entry in ranking]
    assert utilities == sorted(utilities, reverse=True)
    assert "gpt-4-1106-preview" in explained["signals"]["quality"]["value"]
