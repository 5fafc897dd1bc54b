"""A route that names a trained pair the other way round reads that pair's head reversed.

``pointsman train`` calls the model with the higher mean quality strong. Here the cheap model does
better on average (it answers every chat prompt, the dear one none) but only the dear model solves the
math, so training names the pair ``cheap`` (strong) vs ``dear`` (weak). An operator's route naming
``dear`` strong and ``cheap`` weak must route math to ``dear`` and chat to ``cheap``, with a score that
is P(dear strictly better) and a target share that holds from the first request. Real registry from a
real labelled file (static encoder), built the way ``pointsman eval`` builds a route.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from classifiers.registry import RouterRegistry
from gateway.cli import main
from policies.brain import RoutingConfigError, build_brain, explain_request, parse_routing_config
from tests.evals.labelled_files import prompts, write_jsonl
from tests.fakes.routers import add_version

DEAR, CHEAP = "dear-model", "cheap-model"
MATH = "Compute 417 * 23 - 9 and show each step."
CHAT = "Write a short friendly note to Anna about their wedding."


def labelled(seed: int, n: int) -> list[dict[str, Any]]:
    """Math: only the dear model is right. Chat: the cheap one always, the dear one on every other
    prompt (a tie there). About five chat prompts per math one, so the cheap model has the higher mean
    quality, and "cheap strictly better" holds on only half the chat prompts while "dear strictly
    better" never does: the two directions' probabilities are not mirror images."""
    out: list[dict[str, Any]] = []
    chat = 0
    for text, is_math in prompts(seed, n):
        if is_math:
            if len(out) % 3:
                continue  # keep about a third of the math prompts
            out.append({"prompt": text, "scores": {DEAR: 1.0, CHEAP: 0.0}})
        else:
            chat += 1
            out.append({"prompt": text, "scores": {DEAR: float(chat % 2), CHEAP: 1.0}})
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reversed")
    data = write_jsonl(root / "labels.jsonl", labelled(seed=11, n=300))
    out = root / "routers"
    code = main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(out), "--no-progress",
                 "--folds", "3"])
    assert code == 0
    return out


def config(routers_dir: Path, strong: str, weak: str, **knob: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [{"name": DEAR}, {"name": CHEAP}]}],
        "routes": [{"name": "auto", "policy": "rules",
                    "cost_quality": {"strong": strong, "weak": weak, **(knob or {"threshold": 0.5})}}],
        "classifiers": {"encoder": "static", "routers_dir": str(routers_dir)},
    }


async def decide(routing: dict[str, Any], *texts: str) -> list[dict[str, Any]]:
    brain = build_brain(parse_routing_config(routing, env={}), sticky=False, explore=False)
    await brain.start()
    try:
        return [
            await explain_request(brain, "auto", {"model": "auto", "messages": [{"role": "user", "content": t}]})
            for t in texts
        ]
    finally:
        await brain.close()


def test_training_names_the_better_model_on_average_strong(registry: Path) -> None:
    version = RouterRegistry(registry).active_version()
    assert version is not None
    (pair,) = json.loads((registry / "versions" / version / "version.json").read_text())["pairs"]
    assert (pair["strong"], pair["weak"]) == (CHEAP, DEAR)


async def test_the_route_naming_the_pair_reversed_routes_math_to_the_dear_model(
    registry: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pointsman.routing"):
        forward = await decide(config(registry, CHEAP, DEAR), MATH, CHAT)
        assert "routing encoder" in caplog.text and "reversed" not in caplog.text
        reverse = await decide(config(registry, DEAR, CHEAP), MATH, CHAT)
    assert (f"route auto: strong {DEAR} vs weak {CHEAP} reads the pair head difficulty-{CHEAP}--{DEAR}-static "
            f"reversed") in caplog.text
    assert [e["model"] for e in reverse] == [DEAR, CHEAP]
    math_p, chat_p = (e["signals"]["difficulty"]["value"] for e in reverse)
    # P(dear strictly better): about 1 on math, about 0 on chat, where it ties or loses.
    assert math_p > 0.8 and chat_p < 0.15
    # Its own calibration: the forward head's P(cheap strictly better) on chat is about a half (ties on
    # half the chat prompts), so 1 minus it would have called chat a coin flip for the dear model.
    forward_chat = forward[1]["signals"]["difficulty"]["value"]
    assert 0.3 < forward_chat < 0.7 and 1.0 - forward_chat > chat_p + 0.2
    assert forward[0]["model"] == DEAR  # as trained: cheap is "strong", not needed for math
    # The explanation says which head was read the other way round; the forward one says nothing.
    assert reverse[0]["signals"]["difficulty"]["detail"]["reversed_from"] == f"difficulty-{CHEAP}--{DEAR}-static"
    assert "reversed_from" not in forward[0]["signals"]["difficulty"]["detail"]
    assert all(e["router_version"] == RouterRegistry(registry).active_version() for e in reverse)


async def test_a_target_share_starts_from_the_reversed_scores(registry: Path) -> None:
    version = RouterRegistry(registry).active_version()
    assert version is not None
    manifest = json.loads(next((registry / "versions" / version).glob("difficulty-*/manifest.json")).read_text())
    reversed_quantiles = manifest["reverse"]["score_quantiles"]["values"]
    (first,) = await decide(config(registry, DEAR, CHEAP, target_strong_share=0.3), MATH)
    knob = first["knob"]
    # Seeded from the reversed head's score quantiles: calibrated from the first request, with the
    # threshold where 30% of the trained prompts' reversed scores lie above it.
    assert (knob["threshold_source"], first["model"]) == ("calibrated", DEAR)
    assert reversed_quantiles[60] <= knob["threshold"] <= reversed_quantiles[80]
    assert manifest["reverse"]["score_quantiles"] != manifest["score_quantiles"]


def test_a_head_without_a_reverse_record_is_refused_naming_the_key(tmp_path: Path) -> None:
    # Heads trained before the reverse calibration was recorded cannot be read the other way round.
    old = RouterRegistry(tmp_path / "routers")
    add_version(old, {(CHEAP, DEAR): 0.9})
    with pytest.raises(RoutingConfigError) as caught:
        build_brain(parse_routing_config(config(old.root, DEAR, CHEAP), env={}))
    message = str(caught.value)
    assert f"routes.auto.cost_quality: no difficulty head for strong '{DEAR}', weak '{CHEAP}'" in message
    assert "a head exists for the reverse pair, trained before heads recorded how to read them reversed" in message


def test_eval_of_the_reversed_route_names_the_head_and_cautions(registry: Path, tmp_path: Path) -> None:
    # pointsman eval replays the route as served: read reversed, said so in the report; and since the
    # route's strong model does worse on average, APGR reads upside down, said before the verdict.
    # Prompts none of the training ones (the chat templates repeat): a reference number on each.
    fresh = [{**r, "prompt": f"{r['prompt']} (ref {i})"} for i, r in enumerate(labelled(seed=12, n=300))]
    held = write_jsonl(tmp_path / "held.jsonl", fresh)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config(registry, DEAR, CHEAP, target_strong_share=0.2)))
    code = main(["eval", "--config", str(cfg), "--route", "auto", "--data", f"file:{held}", "--out",
                 str(tmp_path / "report"), "--no-progress"])
    assert code == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["pair"]["reversed_from"] == f"difficulty-{CHEAP}--{DEAR}-static"
    assert report["quality_gap"]["inverted"]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert f"scored by the pair head difficulty-{CHEAP}--{DEAR}-static read reversed" in markdown
    assert "Caution: the weak model does better than the strong one" in markdown
    # The route's choices are right: at a 20% dear-model share (about the math share) the quality beats
    # both always-cheap and always-dear by far.
    knob, routers = report["knob"], report["routers"]
    best_fixed = max(routers["always_weak"]["quality"]["value"], routers["always_strong"]["quality"]["value"])
    assert knob["quality"]["value"] > best_fixed + 0.1, (knob, routers)
