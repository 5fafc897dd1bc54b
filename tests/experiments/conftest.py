"""Gateways with experiments, against the fake upstream on loopback, driven with the openai SDK.

Models (the fake's behaviour is its upstream name, ``tests/fakes/upstream.py``): ``ctl`` answers as
``ok``; ``alt`` answers ``say:alt answer``; the shadow arms' models have upstream names unique to
the session (``say:<tag>``), so the fake's request count for them says whether a shadow ever called
a backend. Every answer is 11 prompt and 7 completion tokens.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

RUN = uuid.uuid4().hex[:8]  # tags this session's shadow models in the shared fake's counts
CHEAP = {"input_cost_per_mtok": 1.0, "output_cost_per_mtok": 2.0}
CHEAP_CALL = (11 * 1.0 + 7 * 2.0) / 1e6
MESSAGES = [{"role": "user", "content": "Say hello."}]


def shadow_script(name: str) -> str:
    """The fake's upstream name for the shadow model ``name`` (unique to this session)."""
    return f"say:shadow {name} {RUN}"


def backend(upstream: FakeUpstream, models: dict[str, str]) -> dict[str, Any]:
    """One fake backend serving ``{model: upstream name}`` at the cheap price, with quick timeouts."""
    return {
        "name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
        "timeouts": {"connect": 2, "first_byte": 10, "total": 20, "idle": 5},
        "models": [{"name": name, "upstream_name": script, **CHEAP} for name, script in models.items()],
    }


def key() -> str:
    """A fresh ``user``."""
    return f"user-{uuid.uuid4().hex}"


def upstream_calls(upstream: FakeUpstream, script: str) -> int:
    """Requests the fake received for the upstream model ``script`` (any user)."""
    return sum(n for (model, _), n in upstream.state.requests.items() if model == script)


def rows(gateway: GatewayProcess, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of the gateway's SQLite decision log (JSON columns decoded)."""
    con = sqlite3.connect(gateway.db_path)
    con.row_factory = sqlite3.Row
    try:
        found = [dict(r) for r in con.execute(sql, params)]
    finally:
        con.close()
    for row in found:
        for column in ("decision", "signals", "workflow", "spec", "detail"):
            if isinstance(row.get(column), str):
                row[column] = json.loads(row[column])
    return found


def metric(url: str, family: str, **labels: str) -> float:
    """The sum of a metric family's samples with ``labels`` at the gateway's ``/metrics``."""
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    if family not in families:
        return 0.0
    return sum(
        s.value for s in families[family].samples
        if not s.name.endswith("_created") and all(s.labels.get(k) == v for k, v in labels.items())
    )


def start(config: dict[str, Any], workdir: Path) -> GatewayProcess:
    return GatewayProcess(config, workdir).start(timeout=60)
