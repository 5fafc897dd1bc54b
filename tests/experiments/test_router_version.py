"""A ``router_version`` arm: the route's own policy over the heads of another version of the router
registry, served beside the active version through a real gateway. The registry's versions hold pair
heads with a known answer (``tests/fakes/routers.py``): the active v1 says "strong" for every prompt,
the candidate v2 says "weak"."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from classifiers.registry import RouterRegistry
from policies.experiments.assign import ArmTable, assignment_key
from tests.experiments.conftest import MESSAGES, backend, start
from tests.fakes.routers import add_version
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    registry = RouterRegistry(tmp_path_factory.mktemp("registry") / "routers")
    v1 = add_version(registry, {("big", "small"): 0.9})
    v2 = add_version(registry, {("big", "small"): 0.1})  # not promoted: v1 stays active
    return registry.root, v1, v2


@pytest.fixture(scope="module")
def gateway(
    upstream: FakeUpstream, versions: tuple[Path, str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    root, _, v2 = versions
    config: dict[str, Any] = {
        "backends": [backend(upstream, {"big": "say:big answer", "small": "say:small answer"})],
        "classifiers": {"encoder": "static", "routers_dir": str(root)},
        "routes": [{"name": "auto", "policy": "rules",
                    "cost_quality": {"strong": "big", "weak": "small", "threshold": 0.5}}],
        "experiments": [{"name": "rv", "route": "auto",
                         "arms": [{"name": "control", "control": True}, {"name": "next", "router_version": v2}]}],
    }
    proc = start(config, tmp_path_factory.mktemp("router-version"))
    yield proc
    proc.terminate()


def user_in(arm: str) -> str:
    while True:
        user = f"u-{uuid.uuid4().hex}"
        point = assignment_key("rv", "user", "conversation", {"user": user}, {}, "x")
        assert point is not None
        if ArmTable({"control": 0.5, "next": 0.5}).pick(point.fraction) == arm:
            return user


def test_each_arm_decides_on_its_own_router_version(gateway: GatewayProcess, versions: tuple[Path, str, str]) -> None:
    _, v1, v2 = versions
    sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)
    for arm, version, model in (("control", v1, "big"), ("next", v2, "small")):
        user = user_in(arm)
        raw = sdk.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES, user=user)
        assert raw.headers["x-pointsman-arm"] == f"rv/{arm}"
        assert (raw.headers["x-pointsman-router"], raw.headers["x-pointsman-model"]) == (version, model)
        record = gateway.decision(raw.headers["x-pointsman-request-id"])
        assert (record["router_version"], record["experiment_arm"], record["model"]) == (version, arm, model)
        explained = httpx.post(f"{gateway.base_url}/route",
                               json={"model": "auto", "messages": MESSAGES, "user": user}).json()
        assert (explained["router_version"], explained["model"], explained["experiment"]["arm"]) == (
            version, model, arm)
