"""``/ready`` while the embedded local model is down: its replica does not count as usable.

The gateway restarts a crashed model child on its own (``LocalModelServer``); until it runs again,
readiness must not tell a load balancer to send traffic that only the local model could serve. The
gateway here is the real app served by uvicorn in-process; ``app.state.local_model`` is what
``pointsman serve`` sets (any object with ``running``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.upstream import FakeUpstream
from tests.gateway.test_tracing import InProcessGateway


@dataclass
class ModelChild:
    running: bool


def _config(upstream: FakeUpstream, db: Path, *, with_other: bool) -> dict[str, Any]:
    backends = [{"name": "local", "base_url": upstream.base_url, "health": {"enabled": False},
                 "models": [{"name": "smol", "upstream_name": "ok"}]}]
    if with_other:
        backends.append({"name": "cloud", "base_url": upstream.base_url, "health": {"enabled": False},
                         "models": [{"name": "big", "upstream_name": "ok"}]})
    return {"server": {"host": "127.0.0.1"}, "store": {"kind": "sqlite", "path": str(db)}, "backends": backends}


def _ready(gateway: InProcessGateway) -> int:
    return httpx.get(f"http://127.0.0.1:{gateway.port}/ready", timeout=10).status_code


def test_ready_follows_the_local_model_when_it_is_the_only_backend(upstream: FakeUpstream, tmp_path: Path) -> None:
    with InProcessGateway(_config(upstream, tmp_path / "a.db", with_other=False), None) as gateway:
        child = ModelChild(running=True)
        gateway.app.state.local_model = child
        assert _ready(gateway) == 200
        child.running = False  # crashed; the supervisor is restarting it
        assert _ready(gateway) == 503
        child.running = True
        assert _ready(gateway) == 200


def test_another_backend_keeps_the_gateway_ready(upstream: FakeUpstream, tmp_path: Path) -> None:
    with InProcessGateway(_config(upstream, tmp_path / "b.db", with_other=True), None) as gateway:
        gateway.app.state.local_model = ModelChild(running=False)
        assert _ready(gateway) == 200
