"""A bad routing policy stops the gateway at start-up, with a message naming the offending key."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.upstream import free_port


def _config(route: dict[str, Any]) -> dict[str, Any]:
    return {
        "server": {"port": free_port()},
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [{"name": "small"}, {"name": "big"}]}],
        "routes": [{"name": "auto", "policy": "rules", **route}],
    }


BAD_POLICIES = [
    pytest.param(
        {"rules": [{"name": "r", "when": {"signal": "domian", "op": "eq", "value": "code"},
                    "action": {"route": "big"}}],
         "model": "small"},
        "routes.auto.rules.0.when.signal: unknown signal 'domian'",
        id="unknown-signal",
    ),
    pytest.param(
        # Nothing computes a signal called 'tokens': it used to pass validation and then stop start-up
        # with "no trained head for encoder 'static'", pointing at the wrong thing.
        {"rules": [{"name": "r", "when": {"signal": "tokens", "op": "gt", "value": 1000},
                    "action": {"route": "big"}}],
         "model": "small"},
        "routes.auto.rules.0.when.signal: unknown signal 'tokens' "
        "(known: difficulty, domain, jailbreak, length, pii, quality, tools)",
        id="signal-nothing-computes",
    ),
    pytest.param(
        {"rules": [{"name": "r", "action": {"route": "big"},
                    "when": {"all": [{"signal": "difficulty", "op": "gt", "value": 0.8},
                                     {"signal": "difficulty", "op": "lt", "value": 0.2}]}}],
         "model": "small"},
        "routes.auto.rules.0.when.all",
        id="impossible-condition",
    ),
    pytest.param(
        {"cost_quality": {"signal": "difficulty", "strong": "gpt-5", "weak": "small", "threshold": 0.5}},
        "routes.auto.cost_quality.strong: unknown model 'gpt-5'",
        id="missing-model",
    ),
    pytest.param(
        {"rules": [{"name": "r", "when": {"signal": "jailbreak", "op": "ge", "value": 1.5},
                    "action": {"block": "no"}}], "model": "small"},
        "routes.auto.rules.0.when",
        id="threshold-out-of-range",
    ),
]


@pytest.mark.parametrize(("route", "expected"), BAD_POLICIES)
def test_serve_refuses_a_bad_policy_naming_the_key(tmp_path: Path, route: dict[str, Any], expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_config(route)))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr, result.stderr


def test_a_good_policy_passes_check_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_config(
        {"rules": [{"name": "r", "when": {"signal": "pii", "op": "truthy"}, "action": {"redact": ["email"]}}],
         "cost_quality": {"signal": "difficulty", "strong": "big", "weak": "small", "threshold": 0.3}})))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_serve_refuses_a_head_trained_on_another_encoder(tmp_path: Path) -> None:
    # routers_dir is searched before the shipped artifacts: a head there that was trained on the
    # other encoder's vectors must stop start-up, not be scored with meaningless inputs.
    from classifiers.provider import DEFAULT_ROUTERS_DIR

    routers = tmp_path / "routers"
    shutil.copytree(DEFAULT_ROUTERS_DIR / "difficulty-gpt4-mixtral-minilm", routers / "difficulty-gpt4-mixtral-static")
    config = _config({"cost_quality": {"signal": "difficulty", "strong": "big", "weak": "small", "threshold": 0.5}})
    config["classifiers"] = {"encoder": "static", "routers_dir": str(routers)}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "classifiers.routers_dir:" in result.stderr
    assert "trained on encoder 'minilm-l6-v2', not 'static'" in result.stderr


def _multi_model_config(tmp_path: Path, routers_dir: Path, multi_model: dict[str, Any]) -> Path:
    config = _config({"multi_model": multi_model})
    config["classifiers"] = {"encoder": "static", "routers_dir": str(routers_dir)}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _serve(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_serve_refuses_a_multi_model_route_without_a_quality_head(tmp_path: Path) -> None:
    path = _multi_model_config(tmp_path, tmp_path / "no-artifacts", {"candidates": ["small", "big"]})
    result = _serve(path)
    assert result.returncode == 2, result.stderr
    assert "routes.auto.multi_model.quality_signal: signal 'quality' cannot be computed: no quality head" \
        in result.stderr
    assert "pointsman train --quality routerbench" in result.stderr


def test_check_config_runs_the_same_preflight_as_serve(tmp_path: Path) -> None:
    # A config that parses but cannot serve must not pass check-config (used in CI before a deploy).
    path = _multi_model_config(tmp_path, tmp_path / "no-artifacts", {"candidates": ["small", "big"]})
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout
    assert "routes.auto.multi_model.quality_signal: signal 'quality' cannot be computed" in result.stderr
    assert "ok" not in result.stdout


def test_serve_refuses_candidates_the_quality_head_cannot_score(tmp_path: Path, quality_routers_dir: Path) -> None:
    # 'small' is not a RouterBench model and has no mapping; 'big' maps to a label with a typo.
    path = _multi_model_config(tmp_path, quality_routers_dir, {
        "candidates": ["small", "big"], "quality_models": {"big": "gpt-4-1106-previw"}})
    result = _serve(path)
    assert result.returncode == 2, result.stderr
    assert "routes.auto.multi_model.candidates.0: 'small' is not a model of the quality head " \
           "quality-routerbench-static" in result.stderr
    assert "map it with multi_model.quality_models" in result.stderr
    assert "routes.auto.multi_model.quality_models.big: 'gpt-4-1106-previw' is not a model of the quality head " \
           "quality-routerbench-static (did you mean 'gpt-4-1106-preview'?)" in result.stderr
