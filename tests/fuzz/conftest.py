"""One gateway subprocess for the whole fuzz suite, configured to reach every interesting code path."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, free_port
from tests.fuzz.strategies import MAX_BODY_BYTES
from tests.gatewayproc import GatewayProcess


def fuzz_config(upstream: FakeUpstream) -> dict[str, Any]:
    """Models whose ``upstream_name`` differs from their name (the body is re-encoded before it is
    forwarded) and one whose name is its wire name (forwarded byte for byte); a ``policy: rules``
    route ``auto`` with every rule kind over the static encoder's ``difficulty``; a static route; a
    backend nothing listens on (502/503 paths)."""
    fast = {"connect": 1.0, "first_byte": 5.0, "total": 20.0, "idle": 5.0}
    return {
        "server": {"max_body_bytes": MAX_BODY_BYTES},
        "backends": [
            {
                "name": "fake",
                "base_url": upstream.base_url,
                "health": {"enabled": False},
                "timeouts": fast,
                "models": [
                    {"name": "small-model", "upstream_name": "ok", "input_cost_per_mtok": 0.6,
                     "output_cost_per_mtok": 0.6},
                    {"name": "big-model", "upstream_name": "ok", "input_cost_per_mtok": 10,
                     "output_cost_per_mtok": 30, "tags": ["tools"]},
                    {"name": "embed-model", "upstream_name": "ok"},
                    {"name": "ok"},  # name == wire name: the raw body goes upstream unchanged
                ],
            },
            {
                "name": "down",
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "health": {"enabled": False},
                "timeouts": fast,
                "models": [{"name": "down-model", "upstream_name": "ok"}],
            },
        ],
        "classifiers": {"encoder": "static"},
        "routes": [
            {
                "name": "auto",
                "policy": "rules",
                "signals": {"keywords": {"urgent": {"keywords": ["urgent", "asap"]}}},
                "rules": [
                    {"name": "block-jailbreak", "priority": 100,
                     "when": {"signal": "jailbreak", "op": "ge", "value": 0.8},
                     "action": {"block": "blocked by policy", "status": 403}},
                    {"name": "redact-pii", "priority": 90, "when": {"signal": "pii", "op": "truthy"},
                     "action": {"redact": ["email", "credit_card"]}},
                    {"name": "tools-need-big", "priority": 60, "when": {"signal": "tools", "op": "truthy"},
                     "action": {"route": "big-model"}},
                    {"name": "urgent-to-big", "priority": 50, "when": {"signal": "urgent", "op": "truthy"},
                     "action": {"route": "big-model"}},
                    {"name": "long-is-strong", "priority": 40,
                     "when": {"signal": "length", "op": "gt", "value": 20000}, "action": {"tier": "strong"}},
                ],
                "cost_quality": {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                                 "threshold": 0.5},
                "sticky": {"enabled": True, "ttl": 600, "escalate": True},
            },
            {"name": "fixed", "model": "small-model"},
        ],
        "retry": {"attempts": 2, "backoff_base": 0.01, "backoff_max": 0.02, "respect_retry_after_max": 1},
        "breaker": {"failure_threshold": 5, "cooldown": 1},
    }


class _DropAppTracebacks(logging.Filter):
    """The fake upstream raises on bodies it cannot read (the gateway answers 502, as it should);
    its uvicorn logs a traceback for each, which would bury a failure report."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Exception in ASGI application")


@pytest.fixture(scope="session")
def fuzz_upstream() -> Iterator[FakeUpstream]:
    """The suite's own fake upstream: its request log is cleared per case so a long run stays small."""
    quiet = _DropAppTracebacks()
    logging.getLogger("uvicorn.error").addFilter(quiet)
    fake = FakeUpstream().start()
    yield fake
    fake.stop()
    logging.getLogger("uvicorn.error").removeFilter(quiet)


@pytest.fixture(scope="session")
def fuzz_gateway(fuzz_upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(fuzz_config(fuzz_upstream), tmp_path_factory.mktemp("fuzz-gw")).start(timeout=120)
    yield proc
    proc.terminate()
    keep = os.environ.get("POINTSMAN_FUZZ_FAILURES")
    if keep:  # the gateway's log (tracebacks of failing cases) next to the saved requests
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(proc.log_path, Path(keep) / "gateway.log")
