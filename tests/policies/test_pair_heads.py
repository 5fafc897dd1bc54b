"""A route's cost–quality knob reads the difficulty head trained for its own model pair.

Built the way ``pointsman eval`` builds a route (``policies.brain``, no gateway), over a real router
registry whose versions hold pair heads with a known answer (``tests/fakes/routers.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from classifiers.registry import RouterRegistry
from policies.brain import RoutingConfigError, build_brain, explain_request, parse_routing_config
from tests.fakes.routers import add_version
from tests.fakes.upstream import free_port

BODY = {"model": "auto", "messages": [{"role": "user", "content": "Prove that there are infinitely many primes."}]}


def config(routers_dir: Path | None, *routes: dict[str, Any]) -> dict[str, Any]:
    return {
        "server": {"port": free_port()},
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [{"name": n} for n in ("big", "small", "gpt-x", "gpt-y")]}],
        "routes": [{"name": "auto", "policy": "rules", "cost_quality": {"strong": "big", "weak": "small",
                                                                      "threshold": 0.5}}, *routes],
        "classifiers": {"encoder": "static", "routers_dir": str(routers_dir) if routers_dir else None},
    }


def knob(name: str, strong: str, weak: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "policy": "rules",
            "cost_quality": {"strong": strong, "weak": weak, "threshold": 0.5, **extra}}


@pytest.fixture
def registry(tmp_path: Path) -> RouterRegistry:
    """v1: big vs small says "strong" (0.9); other-big vs other-small says "weak" (0.1)."""
    registry = RouterRegistry(tmp_path / "routers")
    add_version(registry, {("big", "small"): 0.9, ("other-big", "other-small"): 0.1})
    return registry


async def explain(brain: Any, route: str) -> dict[str, Any]:
    return await explain_request(brain, route, {**BODY, "model": route})


async def test_each_route_reads_the_head_of_its_pair(registry: RouterRegistry) -> None:
    mapped = knob("mapped", "gpt-x", "gpt-y", difficulty_models={"gpt-x": "other-big", "gpt-y": "other-small"})
    brain = build_brain(parse_routing_config(config(registry.root, mapped), env={}), sticky=False, explore=False)
    await brain.start()
    try:
        auto, other = await explain(brain, "auto"), await explain(brain, "mapped")
    finally:
        await brain.close()
    assert auto["signals"]["difficulty"]["value"] == pytest.approx(0.9)
    assert auto["model"] == "big"
    # Mapped through difficulty_models onto the other trained pair.
    assert other["signals"]["difficulty"]["value"] == pytest.approx(0.1)
    assert other["model"] == "gpt-y"
    active = registry.active_version()
    assert active is not None
    assert auto["router_version"] == other["router_version"] == active


def test_no_head_for_the_pair_is_refused_naming_the_key(registry: RouterRegistry) -> None:
    routing = parse_routing_config(config(registry.root, knob("other", "gpt-x", "gpt-y")), env={})
    with pytest.raises(RoutingConfigError) as caught:
        build_brain(routing)
    message = str(caught.value)
    assert "routes.other.cost_quality: no difficulty head for strong 'gpt-x', weak 'gpt-y'" in message
    assert "strong 'big', weak 'small'" in message and "strong 'other-big', weak 'other-small'" in message
    assert "difficulty_models" in message
    assert "routes.auto" not in message  # the route whose pair has a head is fine


def test_a_mapping_to_an_untrained_pair_is_refused(registry: RouterRegistry) -> None:
    mapped = knob("mapped", "gpt-x", "gpt-y", difficulty_models={"gpt-x": "big", "gpt-y": "tiny"})
    with pytest.raises(RoutingConfigError, match=r"routes\.mapped\.cost_quality: .*as difficulty_models names "
                                                 r"them: strong 'big', weak 'tiny'"):
        build_brain(parse_routing_config(config(registry.root, mapped), env={}))


def test_difficulty_models_names_only_the_knobs_models() -> None:
    bad = knob("mapped", "gpt-x", "gpt-y", difficulty_models={"big": "other-big"})
    expected = r"routes\.mapped\.cost_quality: .*difficulty_models: 'big' is neither"
    with pytest.raises(RoutingConfigError, match=expected):
        parse_routing_config(config(None, bad), env={})


async def test_without_pair_heads_the_shipped_head_serves_every_pair(tmp_path: Path) -> None:
    # No routers_dir: the bundled priors, one difficulty head for whatever models a route names.
    brain = build_brain(parse_routing_config(config(None, knob("other", "gpt-x", "gpt-y")), env={}))
    await brain.start()
    try:
        auto, other = await explain(brain, "auto"), await explain(brain, "other")
    finally:
        await brain.close()
    assert auto["signals"]["difficulty"]["value"] == other["signals"]["difficulty"]["value"]
    assert auto["router_version"].startswith("bundled-")


async def test_a_pinned_request_finishes_on_its_version(registry: RouterRegistry) -> None:
    first = registry.active_version()
    second = add_version(registry, {("big", "small"): 0.1})
    brain = build_brain(parse_routing_config(config(registry.root), env={}))
    await brain.start()
    try:
        registry.promote(second, {"decision": "promoted", "reason": "test"})
        newer = brain.load_router()
        with brain.router.pin() as pinned:
            brain.router.swap(newer)  # a promotion lands while this request is being decided
            during = await explain(brain, "auto")
        after = await explain(brain, "auto")
    finally:
        await brain.close()
    assert pinned.version == first
    assert (during["router_version"], during["model"]) == (first, "big")
    assert (after["router_version"], after["model"]) == (second, "small")


def test_serve_refuses_a_route_without_its_pair_head(registry: RouterRegistry, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(registry.root, knob("other", "gpt-x", "gpt-y"))))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "routes.other.cost_quality: no difficulty head for strong 'gpt-x', weak 'gpt-y'" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_target_share_knob_recalibrates_on_a_new_version(registry: RouterRegistry) -> None:
    # Calibrated on the old head's scores, the threshold would mean nothing on the new head's scale.
    share = {"name": "auto", "policy": "rules", "cost_quality": {
        "strong": "big", "weak": "small", "target_strong_share": 0.5, "min_samples": 5}}
    routing = parse_routing_config({**config(registry.root), "routes": [share]}, env={})
    brain = build_brain(routing, historic_scores={"auto": [0.85, 0.9, 0.95] * 4})
    await brain.start()
    try:
        before = (await explain(brain, "auto"))["knob"]
        newer = add_version(registry, {("big", "small"): 0.1})
        registry.promote(newer, {"decision": "promoted", "reason": "test"})
        brain.router.swap(brain.load_router())
        after = (await explain(brain, "auto"))["knob"]
        # A version whose head recorded how its scores spread (as pointsman train does) starts from them.
        recorded = add_version(registry, {("big", "small"): 0.1}, score_quantiles=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
        registry.promote(recorded, {"decision": "promoted", "reason": "test"})
        brain.router.swap(brain.load_router())
        seeded = (await explain(brain, "auto"))["knob"]
    finally:
        await brain.close()
    assert (before["threshold_source"], before["samples"]) == ("calibrated", 12)
    assert (after["threshold_source"], after["samples"], after["threshold"]) == ("uncalibrated", 0, 0.5)
    assert (seeded["threshold_source"], seeded["samples"]) == ("calibrated", 6)
    assert seeded["threshold"] == pytest.approx(0.5, abs=0.1)  # the median of a uniform spread
