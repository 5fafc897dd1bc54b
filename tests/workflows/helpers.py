"""Reading what a workflow request left behind: the response's extension, the decision record, the
sub-call rows (from the gateway's SQLite store, waiting for the batch writer)."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from tests.gatewayproc import GatewayProcess


def extension(completion: Any) -> dict[str, Any]:
    """The ``pointsman`` extension field of an SDK completion or chunk (pydantic keeps extra fields)."""
    extra = completion.model_extra or {}
    value = extra.get("pointsman")
    assert isinstance(value, dict), f"no pointsman extension in {completion!r}"
    return value


def record(gateway: GatewayProcess, request_id: str) -> dict[str, Any]:
    """The decision record, its JSON columns decoded."""
    row = gateway.decision(request_id)
    for column in ("signals", "decision", "workflow"):
        if isinstance(row.get(column), str):
            row[column] = json.loads(row[column])
    return row


def subcalls(gateway: GatewayProcess, request_id: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The ``subcalls`` rows of a request, in order (written with its decision record)."""
    gateway.decision(request_id, timeout)  # same transaction: once the decision is there, so are they
    con = sqlite3.connect(gateway.db_path)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM subcalls WHERE request_id = ? ORDER BY idx", (request_id,))]
    finally:
        con.close()


def feedback(gateway: GatewayProcess, request_id: str, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The feedback rows of a request, once ``count`` of them are written."""
    deadline = time.monotonic() + timeout
    while True:
        con = sqlite3.connect(gateway.db_path)
        con.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in con.execute(
                "SELECT * FROM feedback WHERE request_id = ? ORDER BY model", (request_id,))]
        except sqlite3.OperationalError:
            rows = []
        finally:
            con.close()
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)
