"""Reading what a gateway stored, straight from its SQLite file (tests read the store, not the API)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any


def feedback_rows(db: Path, request_id: str, source: str) -> list[dict[str, Any]]:
    """A request's feedback rows from ``source``, metadata decoded; none while the store is not written yet."""
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute(
            "SELECT * FROM feedback WHERE request_id = ? AND source = ?", (request_id, source)
        ).fetchall()
    except sqlite3.OperationalError:  # the schema is created by the gateway's first flush
        return []
    finally:
        con.close()
    out = []
    for row in rows:
        item = dict(row)
        item["metadata"] = json.loads(item["metadata"]) if isinstance(item["metadata"], str) else item["metadata"]
        out.append(item)
    return out
