"""The ``logs:`` loader against a real PostgreSQL decision store: the same logged world written through
the store API into PostgreSQL and into SQLite reads back as the same labelled and off-policy rows, and
``pointsman eval --data logs:postgresql://...`` reports the off-policy section from it.

PostgreSQL is required, as for the store tests (``tests/store/conftest.py``): a server that cannot be
reached fails the test with a message saying so; it never skips.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from evals.labelled import LoadedSource, load_source
from evals.offpolicy import NO_PROPENSITY
from gateway.cli import main as pointsman
from store import PostgresDecisionStore, SQLiteDecisionStore
from tests.evals.test_offpolicy import N_NOT_RANDOMISED, eval_config, fill, world
from tests.store.conftest import pg_schema

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio(loop_scope="session")]


def summary(source: LoadedSource) -> dict[str, Any]:
    """What a loader produced, comparable across stores (the embeddings as lists)."""
    return {
        "rows": [(r.request_id, r.messages, r.qualities, r.costs, r.source, r.encoder_id,
                  None if r.embedding is None else r.embedding.tolist()) for r in source.rows],
        "skipped": source.skipped,
        "logged": [(r.request_id, r.served_model, r.propensity, r.quality, r.outcome_from, r.messages, r.cost_usd,
                    r.route, None if r.embedding is None else r.embedding.tolist()) for r in source.logged],
        "logged_skipped": source.logged_skipped,
    }


async def test_the_logs_loader_reads_postgres_like_sqlite(tmp_path: Path) -> None:
    records, feedback, truth = world(n=200, seed=5, judged=40)
    sqlite_db = tmp_path / "logs.db"
    await fill(SQLiteDecisionStore(str(sqlite_db)), records, feedback)
    from_sqlite = load_source(f"logs:sqlite:///{sqlite_db}")  # in a running loop: the loader uses a thread
    async with pg_schema() as dsn:
        await fill(PostgresDecisionStore(dsn), records, feedback)
        from_pg = load_source(f"logs:{dsn}")
        assert summary(from_pg) == summary(from_sqlite)
        # What the off-policy section reads: served model, propensity and outcome of every request with one.
        by_id = {r.request_id: r for r in from_pg.logged}
        explored = truth[:200]
        assert all(by_id[t.request_id].served_model == t.served for t in explored)
        assert all(by_id[t.request_id].propensity == pytest.approx(t.propensity) for t in explored)
        assert sum(r.propensity is None for r in from_pg.logged) == N_NOT_RANDOMISED
        # The 40 judged requests are labelled for both models (direct rows).
        assert sum(r.labelled_for("big-model", "small-model") for r in from_pg.rows) == 40

        # The command on the PostgreSQL URL (in a thread: it runs its own event loop).
        out = tmp_path / "report"
        code = await asyncio.to_thread(pointsman, [
            "eval", "--config", str(eval_config(tmp_path / "config.yaml")), "--data", f"logs:{dsn}",
            "--out", str(out), "--bootstrap", "50", "--no-progress"])
        assert code == 0
        report = json.loads((out / "report.json").read_text())
        assert report["estimator"]["name"] == "direct+ips+snips+dr"
        assert report["offpolicy"]["rows"]["used"] == 200
        assert report["offpolicy"]["rows"]["excluded"][NO_PROPENSITY] == N_NOT_RANDOMISED
