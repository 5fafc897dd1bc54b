"""A running gateway picks up a registry promotion without a restart, and survives a broken version.

The real gateway subprocess serves ``classifiers.routers_dir: <registry>``; versions are written and
promoted through the registry API while it runs (what ``pointsman train`` / ``pointsman promote`` do).
Each version's pair head gives a known P(strong needed), so which version decided is visible in the
chosen model as well as in ``/v1/route``, the ``x-pointsman-router`` header, the decision record and
``/metrics``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from classifiers.registry import RouterRegistry
from tests.fakes.routers import add_version, break_version
from tests.fakes.upstream import FakeUpstream, free_port
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

MESSAGES: list[Any] = [{"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}]
STRONG, WEAK = {("big", "small"): 0.9}, {("big", "small"): 0.1}


def gateway_config(upstream: FakeUpstream, registry: Path) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
            "models": [{"name": "big", "upstream_name": "ok"}, {"name": "small", "upstream_name": "ok"}],
        }],
        "routes": [{"name": "auto", "policy": "rules",
                    "cost_quality": {"strong": "big", "weak": "small", "threshold": 0.5}}],
        "classifiers": {"encoder": "static", "routers_dir": str(registry), "reload_interval": 0.1},
    }


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> RouterRegistry:
    registry = RouterRegistry(tmp_path_factory.mktemp("registry") / "routers")
    add_version(registry, STRONG)  # the first version becomes active
    return registry


@pytest.fixture(scope="module")
def gateway(
    upstream: FakeUpstream, registry: RouterRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(gateway_config(upstream, registry.root), tmp_path_factory.mktemp("gw-reload")).start()
    yield proc
    proc.terminate()


def dry_run(gateway: GatewayProcess) -> dict[str, Any]:
    response = httpx.post(f"{gateway.base_url}/route", json={"model": "auto", "messages": MESSAGES}, timeout=30)
    assert response.status_code == 200, response.text
    explanation: dict[str, Any] = response.json()
    return explanation


def serve(gateway: GatewayProcess) -> tuple[str, str, str]:
    """One chat completion: (model that answered, x-pointsman-router, request id)."""
    client = OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    headers = raw.headers
    return headers["x-pointsman-model"], headers["x-pointsman-router"], headers["x-pointsman-request-id"]


def metric(gateway: GatewayProcess, pattern: str) -> float | None:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    found = re.search(rf"^{pattern} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_a_promotion_reaches_the_running_gateway(gateway: GatewayProcess, registry: RouterRegistry) -> None:
    first = registry.active_version()
    assert first is not None
    before = dry_run(gateway)
    assert (before["router_version"], before["model"]) == (first, "big")
    model, router, request_id = serve(gateway)
    assert (model, router) == ("big", first)
    assert gateway.decision(request_id)["router_version"] == first

    second = add_version(registry, WEAK)
    assert dry_run(gateway)["router_version"] == first  # added, not promoted: nothing changes
    registry.promote(second, {"decision": "promoted", "reason": "test"})

    eventually(lambda: dry_run(gateway)["router_version"] == second, "the promoted version serves /v1/route")
    after = dry_run(gateway)
    assert after["model"] == "small"
    assert after["signals"]["difficulty"]["value"] == pytest.approx(0.1)
    model, router, request_id = serve(gateway)
    assert (model, router) == ("small", second)
    assert gateway.decision(request_id)["router_version"] == second
    assert metric(gateway, rf'pointsman_router_info\{{version="{second}"\}}') == 1.0
    assert metric(gateway, r'pointsman_router_reloads_total\{result="ok"\}') == 1.0
    assert gateway.proc is not None and gateway.proc.poll() is None  # the same process throughout


def test_a_broken_version_keeps_the_old_router_serving(gateway: GatewayProcess, registry: RouterRegistry) -> None:
    serving, model = registry.active_version(), dry_run(gateway)["model"]
    failures = metric(gateway, r'pointsman_router_reloads_total\{result="failed"\}') or 0.0
    broken = add_version(registry, STRONG)
    break_version(registry, broken)
    registry.promote(broken, {"decision": "promoted", "reason": "test"})

    eventually(lambda: metric(gateway, r'pointsman_router_reloads_total\{result="failed"\}') == failures + 1,
               "the failed reload is counted")
    assert dry_run(gateway)["router_version"] == serving
    assert serve(gateway)[:2] == (model, serving)
    assert metric(gateway, rf'pointsman_router_info\{{version="{serving}"\}}') == 1.0
    assert "router reload failed" in gateway.log() and "does not match the manifest" in gateway.log()

    # The watcher lives on: the next good promotion is picked up.
    fixed = add_version(registry, STRONG)
    registry.promote(fixed, {"decision": "promoted", "reason": "test"})
    eventually(lambda: dry_run(gateway)["router_version"] == fixed, "a later good version serves")
    assert serve(gateway)[:2] == ("big", fixed)


def test_a_registry_created_after_start_up_is_picked_up(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # routers_dir named before `pointsman train --out` first wrote it: the shipped heads serve (with a
    # warning saying so), then the registry's first version, without a restart. It was never watched.
    root = tmp_path_factory.mktemp("later") / "routers"
    proc = GatewayProcess(gateway_config(upstream, root), tmp_path_factory.mktemp("gw-later")).start()
    try:
        assert dry_run(proc)["router_version"].startswith("bundled-")
        version = add_version(RouterRegistry(root), STRONG)  # the first version becomes active
        eventually(lambda: dry_run(proc)["router_version"] == version, "the new registry serves", timeout=30)
        assert serve(proc)[:2] == ("big", version)
    finally:
        proc.terminate()


def _failed_reloads(gateway: GatewayProcess) -> float:
    return metric(gateway, r'pointsman_router_reloads_total\{result="failed"\}') or 0.0


@pytest.mark.parametrize("breakage", ["registry moved away", "registry.json deleted", "active.json deleted"])
def test_a_registry_that_goes_away_keeps_the_last_version_serving(
    gateway: GatewayProcess, registry: RouterRegistry, tmp_path: Path, breakage: str
) -> None:
    # A registry directory moved or unmounted, or its registry.json / active.json deleted (no pointsman
    # command does either) resolved to the shipped heads, and every replica silently swapped to them.
    serving, model = registry.active_version(), dry_run(gateway)["model"]
    failures = _failed_reloads(gateway)
    root = registry.root
    aside = tmp_path / "aside"
    moved = {"registry moved away": root, "registry.json deleted": root / "registry.json",
             "active.json deleted": root / "active.json"}[breakage]
    moved.rename(aside)
    try:
        eventually(lambda: _failed_reloads(gateway) > failures or dry_run(gateway)["router_version"] != serving,
                   "the gateway notices the change")
        after = dry_run(gateway)
        assert (after["router_version"], after["model"]) == (serving, model)
        assert serve(gateway)[:2] == (model, serving)
        assert _failed_reloads(gateway) == failures + 1, gateway.log()[-3000:]  # one move, one failed reload
        assert metric(gateway, rf'pointsman_router_info\{{version="{serving}"\}}') == 1.0
        assert "rather than falling back to the shipped heads" in gateway.log()
    finally:
        aside.rename(moved)
    # Back in place: the same version, and the watcher still follows promotions.
    newer = add_version(registry, WEAK if model == "big" else STRONG)
    registry.promote(newer, {"decision": "promoted", "reason": "test"})
    eventually(lambda: dry_run(gateway)["router_version"] == newer, "a later promotion serves")


@pytest.mark.parametrize("breakage", ["version.json truncated", "version.json not an object", "active version deleted"])
def test_a_gateway_started_on_a_broken_active_version_says_which_file(
    upstream: FakeUpstream, tmp_path: Path, breakage: str
) -> None:
    # A truncated version.json stopped start-up with a bare JSON parser message naming no file, one that
    # is not an object with a traceback, and an active.json naming a deleted version with a quoted KeyError.
    registry = RouterRegistry(tmp_path / "routers")
    version = add_version(registry, STRONG)
    version_dir = registry.version_dir(version)
    if breakage == "active version deleted":
        shutil.rmtree(version_dir)
        named = registry.root / "active.json"
    else:
        named = version_dir / "version.json"
        named.write_text("{" if breakage == "version.json truncated" else "[]")
    config = tmp_path / "config.yaml"
    server = {"host": "127.0.0.1", "port": free_port()}  # never another gateway's, should it start
    config.write_text(json.dumps({**gateway_config(upstream, registry.root), "server": server}))  # JSON is YAML
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"pointsman: classifiers.routers_dir: {named}"), line
