"""The ``experiments:`` section: a valid experiment is normalised (shares, control, spec), and every
mistake is refused at start-up with the key that is wrong — by the config loader, by ``pointsman
check-config`` and by the routing brain for what needs the router registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from classifiers.registry import RouterRegistry
from gateway.cli import main as pointsman
from gateway.config import parse_config
from gateway.errors import ConfigError
from policies.brain import RoutingConfigError, build_brain, parse_routing_config
from tests.fakes.routers import add_version

BASE: dict[str, Any] = {
    "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                  "models": [{"name": "big"}, {"name": "small"}]}],
    "routes": [
        {"name": "auto", "policy": "rules", "cost_quality": {"strong": "big", "weak": "small", "threshold": 0.5}},
        {"name": "plain", "model": "small"},
    ],
}
CONTROL = {"name": "control", "control": True}


def with_experiments(*experiments: dict[str, Any]) -> dict[str, Any]:
    return {**BASE, "experiments": list(experiments)}


def test_a_valid_experiment_is_normalised() -> None:
    config = parse_config(with_experiments({
        "name": "knob", "route": "auto", "key": "api_key", "start": "2025-01-01T00:00:00",
        "arms": [{**CONTROL, "weight": 2},
                 {"name": "eager", "weight": 1, "policy": {"cost_quality": {"threshold": 0.2}}},
                 {"name": "mini", "model": "small"},
                 {"name": "big", "shadow": True, "model": "big", "call_backend": True, "budget_usd_per_hour": 0.5}],
    }), env={})
    experiment = config.experiments[0]
    assert experiment.shares() == {"control": 0.5, "eager": 0.25, "mini": 0.25}
    assert experiment.start_ts == 1735689600.0  # no zone: UTC
    spec = experiment.spec(config.routes[0])
    assert (spec["control"], spec["key"], spec["missing_key"], spec["strong"], spec["weak"]) == (
        "control", "api_key", "conversation", "big", "small")
    assert [(a["name"], a["kind"], a["weight"], a["shadow"]) for a in spec["arms"]] == [
        ("control", "route", 0.5, False), ("eager", "policy", 0.25, False), ("mini", "model", 0.25, False),
        ("big", "model", 0.0, True)]
    assert spec["arms"][3]["call_backend"] is True and spec["arms"][3]["budget_usd_per_hour"] == 0.5
    assert spec["guardrails"]["min_requests"] == 100 and spec["allocation"]["kind"] == "fixed"
    # Offline replay reads the same section.
    assert parse_routing_config(with_experiments(*[e.model_dump(mode="json", by_alias=True, exclude_unset=True)
                                                   for e in config.experiments]), env={}).experiments


BAD: list[tuple[dict[str, Any], str]] = [
    ({"name": "e", "route": "nope", "arms": [CONTROL, {"name": "a"}]},
     "experiments.e.route: unknown route 'nope'"),
    ({"name": "e", "route": "auto", "arms": [{"name": "a"}, {"name": "b"}]},
     "experiments.e.arms: exactly one served arm must be the control"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {**CONTROL, "name": "c2"}]},
     "experiments.e.arms: exactly one served arm must be the control"),
    ({"name": "e", "route": "auto", "arms": [CONTROL]}, "experiments.e.arms: an experiment needs a control"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "control"}]},
     "experiments.e.arms: two arms are named 'control'"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "weight": 0}]},
     "experiments.e.arms.a.weight: Input should be greater than 0"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "model": "gpt-9"}]},
     "experiments.e.arms.a.model: unknown model 'gpt-9'"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "model": "big", "policy": {"model": "x"}}]},
     "experiments.e.arms.a: an arm is at most one of policy, model, router_version"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "policy": {"cost_quality": {"stong": "big"}}}]},
     "experiments.e.arms.a.policy.cost_quality.stong: unknown key"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "policy": {"cost_quality": {"weak": "tiny"}}}]},
     "experiments.e.arms.a.policy.cost_quality.weak: unknown model 'tiny'"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "policy": {"model": "big"}}]},
     "experiments.e.arms.a.policy: set only one default decision, not model and cost_quality"),
    ({"name": "e", "route": "auto",
      "arms": [CONTROL, {"name": "a", "policy": {"rules": [{"name": "r", "when": {"signal": "domian", "op": "truthy"},
                                                            "action": {"route": "big"}}]}}]},
     "experiments.e.arms.a.policy.rules.0.when.signal: unknown signal 'domian'"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "s", "shadow": True, "call_backend": True}]},
     "experiments.e.arms.s.budget_usd_per_hour: call_backend needs a spend cap"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "s", "shadow": True, "weight": 2}]},
     "experiments.e.arms.s.weight: a shadow arm takes no traffic share"),
    ({"name": "e", "route": "auto", "arms": [{**CONTROL, "shadow": True}, {"name": "a"}]},
     "experiments.e.arms.control: a shadow arm cannot be the control"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "call_backend": True}]},
     "experiments.e.arms.a.call_backend: only for shadow arms"),
    ({"name": "e", "route": "auto", "key": "cookie", "arms": [CONTROL, {"name": "a"}]},
     "experiments.e.key: Input should be 'api_key', 'user', 'session' or 'conversation'"),
    ({"name": "e", "route": "auto", "start": "2025-02-01", "end": "2025-01-01", "arms": [CONTROL, {"name": "a"}]},
     "experiments.e.end: 2025-01-01T00:00:00+00:00 is not after start"),
    ({"name": "e", "route": "auto", "allocation": {"lambda": 0.2}, "arms": [CONTROL, {"name": "a"}]},
     "experiments.e.allocation.lambda: only used with kind: thompson"),
    ({"name": "e", "route": "auto", "guardrails": {"max_error_rate_increase": 2}, "arms": [CONTROL, {"name": "a"}]},
     "experiments.e.guardrails.max_error_rate_increase: Input should be less than or equal to 1"),
    ({"name": "e/1", "route": "auto", "arms": [CONTROL, {"name": "a"}]}, "experiments.0.name: String should match"),
    # the names go into the x-pointsman-arm header: ASCII only (a Unicode \w let 'bêta' through)
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "bêta"}]},
     "experiments.e.arms.bêta.name: String should match"),
    ({"name": "café", "route": "auto", "arms": [CONTROL, {"name": "a"}]}, "experiments.café.name: String should match"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "router_version": "latest"}]},
     "experiments.e.arms.a.router_version: String should match pattern"),
    ({"name": "e", "route": "plain", "arms": [CONTROL, {"name": "a", "router_version": "v0002-1a2b3c4d"}]},
     "experiments.e.arms.a.router_version: route 'plain' is static; it reads no router heads"),
    ({"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "wieght": 1}]},
     "experiments.e.arms.a.wieght: unknown key"),
]


@pytest.mark.parametrize(("experiment", "message"), BAD, ids=[f"{m.split(':')[0]}-{i}" for i, (_, m) in enumerate(BAD)])
def test_a_bad_experiment_is_refused_naming_its_key(experiment: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(with_experiments(experiment), env={})
    assert message in str(raised.value)
    with pytest.raises(RoutingConfigError) as replayed:  # pointsman eval reads the section the same way
        parse_routing_config(with_experiments(experiment), env={})
    assert message in str(replayed.value)


def test_two_experiments_on_one_route_must_not_overlap_in_time() -> None:
    first = {"name": "one", "route": "plain", "end": "2025-02-01T00:00:00Z", "arms": [CONTROL, {"name": "a"}]}
    second = {"name": "two", "route": "plain", "start": "2025-01-15T00:00:00Z", "arms": [CONTROL, {"name": "a"}]}
    with pytest.raises(ConfigError, match=r"experiments\.two\.route: experiment 'one' also runs on route 'plain'"):
        parse_config(with_experiments(first, second), env={})
    parse_config(with_experiments(first, {**second, "start": "2025-02-01T00:00:00Z"}), env={})  # back to back: fine


def test_check_config_refuses_a_bad_experiment_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(with_experiments(
        {"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "model": "gpt-9"}]})))
    assert pointsman(["check-config", str(path)]) == 2
    assert "experiments.e.arms.a.model: unknown model 'gpt-9'" in capsys.readouterr().err
    path.write_text(yaml.safe_dump(with_experiments(
        {"name": "e", "route": "auto", "arms": [CONTROL, {"name": "a", "model": "small"}]})))
    assert pointsman(["check-config", str(path)]) == 0


def test_a_router_version_arm_needs_a_registry_that_holds_the_version(tmp_path: Path) -> None:
    experiment = {"name": "e", "route": "auto", "arms": [CONTROL, {"name": "v", "router_version": "v0002-1a2b3c4d"}]}
    with pytest.raises(RoutingConfigError, match=r"experiments\.e\.arms\.v\.router_version: classifiers\.routers_dir "
                                                 r".* is not a router registry"):
        build_brain(parse_routing_config(with_experiments(experiment), env={}))
    registry = RouterRegistry(tmp_path / "routers")
    add_version(registry, {("big", "small"): 0.9})
    data = {**with_experiments(experiment), "classifiers": {"encoder": "static", "routers_dir": str(registry.root)}}
    missing = r"experiments\.e\.arms\.v\.router_version: no version 'v0002-1a2b3c4d'"
    with pytest.raises(RoutingConfigError, match=missing):
        build_brain(parse_routing_config(data, env={}))
