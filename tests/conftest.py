"""Shared fixtures: a fake upstream on loopback and a gateway subprocess configured against it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.fakes.upstream import BEHAVIOURS, FakeUpstream, free_port
from tests.gatewayproc import GatewayProcess


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def backup_upstream() -> Iterator[FakeUpstream]:
    """A second, healthy upstream that fallbacks go to."""
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


def standard_config(upstream: FakeUpstream, backup: FakeUpstream) -> dict[str, Any]:
    """Every fake behaviour as a model ``fake-<behaviour>``, plus fallbacks to a backup backend."""
    dead_port = free_port()  # nothing listens here: "upstream down"
    fast = {"connect": 1.0, "first_byte": 1.0, "total": 10.0, "idle": 0.6}
    return {
        "backends": [
            {
                "name": "fake",
                "base_url": upstream.base_url,
                "api_key": "sk-upstream-secret",
                "timeouts": fast,
                "health": {"enabled": False},
                "models": [
                    {"name": f"fake-{b}", "upstream_name": b, "input_cost_per_mtok": 1.0,
                     "output_cost_per_mtok": 2.0}
                    for b in BEHAVIOURS
                ] + [
                    {"name": "fake-always-500-fb", "upstream_name": "always-500", "fallbacks": ["backup-ok"]},
                    {"name": "fake-hang-fb", "upstream_name": "hang", "fallbacks": ["backup-ok"]},
                    {"name": "fake-error-event-fb", "upstream_name": "error-event:502", "fallbacks": ["backup-ok"]},
                    {"name": "fake-error-event-refused", "upstream_name": "error-event:context"},
                    {"name": "fake-comments-first", "upstream_name": "comments-first"},
                ],
            },
            {
                "name": "backup",
                "base_url": backup.base_url,
                "health": {"enabled": False},
                "models": [{"name": "backup-ok", "upstream_name": "ok"}],
            },
            {
                "name": "down",
                "base_url": f"http://127.0.0.1:{dead_port}/v1",
                "health": {"enabled": False},
                "timeouts": fast,
                "models": [
                    {"name": "down-model", "upstream_name": "ok"},
                    {"name": "down-model-fb", "upstream_name": "ok", "fallbacks": ["backup-ok"]},
                ],
            },
        ],
        "routes": [
            {"name": "auto", "model": "fake-ok"},
            {"name": "resilient", "model": "down-model", "fallbacks": ["backup-ok"]},
        ],
        "retry": {"attempts": 3, "backoff_base": 0.01, "backoff_max": 0.05, "respect_retry_after_max": 2},
        "breaker": {"failure_threshold": 1000, "cooldown": 1},
    }


@pytest.fixture(scope="session")
def gateway(
    upstream: FakeUpstream, backup_upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(standard_config(upstream, backup_upstream), tmp_path_factory.mktemp("gw")).start()
    yield proc
    proc.terminate()


@pytest.fixture
def client(gateway: GatewayProcess) -> OpenAI:
    """The official SDK with its own retries off: what is tested is the gateway's behaviour."""
    return OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0, timeout=30)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def routing_data_dir(subdir: str) -> Path:
    """The shared routing data (``../shared/data`` or ``$POINTSMAN_DATA_DIR``) holding ``subdir``.

    The data is not vendored (RouterBench may not be); CI always has it beside the clone, so there a
    missing directory fails the test, elsewhere it skips it.
    """
    from evals.data import resolve_data_dir

    path = resolve_data_dir()
    if not (path / subdir).is_dir():
        message = f"routing data not found at {path / subdir} (set POINTSMAN_DATA_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def quality_routers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A routers directory holding ``quality-routerbench-static``, trained once per session on the real
    RouterBench-train data with the static encoder (``pointsman train --quality routerbench``'s code path;
    one C instead of the grid, to keep the suite fast).
    """
    from evals.quality import build_quality

    data_dir = routing_data_dir("routerbench-train")
    out = tmp_path_factory.mktemp("routers")
    build_quality(data_dir, ["static"], out, seed=0, c_grid=(0.001,), progress=False, log=lambda _: None)
    return out
