"""``pointsman route``: how a prompt would be routed, from the command line (no backend is called)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from tests.fakes.upstream import free_port

CONFIG = {
    "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                  "models": ["big", "small"]}],
    "routes": [{"name": "auto", "cost_quality": {"strong": "big", "weak": "small", "threshold": 0.5}}],
    "classifiers": {"encoder": "static"},
}


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return str(path)


def test_route_explains_and_takes_a_threshold_header(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "--config", config, "Say hi to Anna."]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["model"] in ("big", "small") and plain["knob"]["threshold"] == 0.5
    assert main(["route", "--config", config, "--header", "X-Pointsman-Threshold: 0", "Say hi to Anna."]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["model"] == "big" and forced["knob"]["threshold_source"] == "override"


def test_bad_route_input_is_a_usage_error_not_a_traceback(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["route", "--config", config, "--header", "no-colon", "hi"])
    assert exited.value.code == 2 and "'no-colon' is not NAME:VALUE" in capsys.readouterr().err
    # What the gateway answers with a 400 is one line here.
    assert main(["route", "--config", config, "--header", "x-pointsman-threshold:2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "header x-pointsman-threshold:" in err and "is not a number between 0 and 1" in err
    assert "Traceback" not in err
    assert main(["route", "--config", config, "--route", "nope", "hi"]) == 2
    assert "pointsman: no route 'nope' in the config (routes: auto)" in capsys.readouterr().err


def test_a_model_or_workflow_named_directly_is_explained_as_the_gateway_serves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # /v1/route answers a model's or a workflow's name with its fixed plan; the CLI said "no route".
    config = dict(CONFIG)
    models = [{"name": "big"}, {"name": "small", "fallbacks": ["big"]}]
    config["backends"] = [{**CONFIG["backends"][0], "models": models}]
    config["workflows"] = [{"name": "up", "kind": "cascade", "stages": ["small", "big"],
                            "confidence": {"source": "logprobs", "threshold": 0.5}}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["route", "--config", str(path), "--route", "small", "hi"]) == 0
    model = json.loads(capsys.readouterr().out)
    assert (model["policy"], model["model"], model["plan"]["candidates"]) == ("direct", "small", ["small", "big"])
    assert model["route"] is None and model["router_version"]
    assert main(["route", "--config", str(path), "--route", "cascade/up", "hi"]) == 0
    workflow = json.loads(capsys.readouterr().out)
    assert (workflow["model"], workflow["plan"]["workflow"]) == ("cascade/up", "up")
    assert workflow["reason"] == "workflow requested by name"


def test_a_sticky_route_is_explained_offline_without_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stickiness shared through Redis: `route` connected to it (and failed with Redis down). An offline
    # explanation decides the prompt as a first turn, as replay does, and says stickiness is not applied.
    port = free_port()  # nothing listens on it: Redis is down
    config = dict(CONFIG)
    config["routes"] = [{**CONFIG["routes"][0], "sticky": {"ttl": 600}}]
    config["shared_state"] = {"kind": "redis", "url": f"redis://127.0.0.1:{port}/0", "timeout": 0.5}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["route", "--config", str(path), "--header", "x-pointsman-threshold:0", "Say hi to Anna."]) == 0
    out, err = capsys.readouterr()
    explained = json.loads(out)
    assert explained["model"] == "big" and explained["sticky"] is None  # no session looked up
    assert "route auto: session stickiness is not applied offline" in err
    assert "Traceback" not in err


def test_a_prompt_no_model_can_serve_is_not_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # multi_model with no eligible candidate: the gateway answers 400, but route printed the explanation
    # and exited 0, the code the README gives a routed prompt.
    from tests.evals.labelled_files import STRONG, WEAK, rows, with_twin, write_jsonl

    data = write_jsonl(tmp_path / "labels.jsonl", with_twin(rows(seed=1, n=60), seed=1))
    routers = tmp_path / "routers"
    assert main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(routers),
                 "--no-progress", "--no-warm-start", "--folds", "2"]) == 0
    capsys.readouterr()
    config = {
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [{"name": STRONG, "context_window": 50}, {"name": WEAK, "context_window": 50}]}],
        "routes": [{"name": "auto", "multi_model": {"candidates": [STRONG, WEAK], "quality_signal": "quality"}}],
        "classifiers": {"encoder": "static", "routers_dir": str(routers)},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["route", "--config", str(path), "Say hi to Anna."]) == 0  # fits: routed
    assert json.loads(capsys.readouterr().out)["model"] in (STRONG, WEAK)
    assert main(["route", "--config", str(path), "Say hi to Anna. " * 100]) == 2
    out, err = capsys.readouterr()
    explained = json.loads(out)  # the explanation still shows why each model was left out
    assert explained["model"] is None and explained["error"]["code"] == "no_eligible_model"
    assert err.startswith("pointsman: No model of route 'auto' can serve this request: ")
    assert "context window is 50" in err and "Traceback" not in err


def test_a_routers_dir_that_is_a_file_is_refused_not_served_as_the_shipped_heads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # classifiers.routers_dir naming a file (a registry path mistyped onto registry.json, say) was taken for
    # a registry not made yet: check-config said ok and route explained with the shipped heads.
    registry_json = tmp_path / "registry.json"
    registry_json.write_text("{}")
    config = {**CONFIG, "classifiers": {"encoder": "static", "routers_dir": str(registry_json)}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    for command in (["check-config", str(path)], ["route", "--config", str(path), "hi"]):
        assert main(command) == 2, command
        out, err = capsys.readouterr()
        assert out == "" and "Traceback" not in err
        assert f"classifiers.routers_dir: {registry_json}: not a directory" in err, err
