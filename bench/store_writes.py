"""What one decision row costs to write, through the real stores, on a table that already holds rows.

The decision recorder writes records in batches (``write_batch``, 256 rows by default) from its own
thread (SQLite) or pool connection (PostgreSQL). Each row also goes into the unique index on
``request_id``; whether ids arrive in order decides whether that index grows at its end or has a
random page dirtied per row. This script fills a fresh table with ``--prefill`` rows, then times
``--rows`` more in 256-row batches, once per id scheme:

* ``time-ordered``: the gateway's ids (``gateway.responses.new_request_id``: milliseconds, then 80 random bits);
* ``random``: 128 random bits, what the gateway issued until 2026-12-07.

Reported per row: CPU of this process (the gateway's side: encoding, binding, and for SQLite the
whole database engine) and wall time (for PostgreSQL mostly the server's work).

Run: ``.venv/bin/python bench/store_writes.py [--store sqlite|postgres] [--prefill 300000 --rows 50000]``
(PostgreSQL: ``--dsn``, default the local test database; a scratch schema is created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

from gateway.responses import new_request_id
from store.base import DecisionStore
from store.postgres import PostgresDecisionStore
from store.records import DecisionRecord
from store.sqlite import SQLiteDecisionStore

BATCH = 256


def random_id() -> str:
    return "psm-" + os.urandom(16).hex()


SCHEMES: dict[str, Callable[[], str]] = {"time-ordered": new_request_id, "random": random_id}


def record(request_id: str) -> DecisionRecord:
    """A passthrough request's row, as the gateway writes it (~450 bytes stored)."""
    return DecisionRecord(
        request_id=request_id, created_at=time.time(), endpoint="chat.completions", route=None,
        requested_model="fake-model", decision={"policy": "direct", "candidates": ["fake-model"]},
        reason="model requested by name", model="fake-model", backend="fake", replica="http://127.0.0.1:9401/v1",
        status=200, outcome="ok", attempts=1, latency_ms=0.3, prompt_tokens=12, completion_tokens=7,
        cost_usd=2.6e-5,
    )


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _open(
    kind: str, scheme: str, workdir: Path, dsn: str
) -> tuple[DecisionStore, Callable[[], Awaitable[None]]]:
    """An opened empty store, and what removes its data afterwards."""
    if kind == "sqlite":
        sqlite_store = SQLiteDecisionStore(str(workdir / f"{scheme}.db"))
        await sqlite_store.open()

        async def unlink() -> None:
            for suffix in ("", "-wal", "-shm"):  # the next round starts from an empty file
                (workdir / f"{scheme}.db{suffix}").unlink(missing_ok=True)

        return sqlite_store, unlink
    import asyncpg

    schema = f"bench_store_writes_{scheme.replace('-', '_')}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    await admin.execute(f"CREATE SCHEMA {schema}")
    pg_store = PostgresDecisionStore(dsn, server_settings={"search_path": schema})
    await pg_store.open()

    async def drop() -> None:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()

    return pg_store, drop


async def measure(kind: str, scheme: str, prefill: int, rows: int, workdir: Path, dsn: str) -> tuple[float, float]:
    """(CPU us, wall us) per row written after ``prefill`` rows, with ids from ``scheme``."""
    make_id = SCHEMES[scheme]
    store, cleanup = await _open(kind, scheme, workdir, dsn)
    try:
        for _ in track(range(prefill // BATCH), description=f"{kind} {scheme}: filling", transient=True):
            await store.write_batch([record(make_id()) for _ in range(BATCH)])
        batches = [[record(make_id()) for _ in range(BATCH)] for _ in range(max(rows // BATCH, 1))]
        cpu0, wall0 = _cpu(), time.perf_counter()
        for batch in batches:
            await store.write_batch(batch)
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    finally:
        await store.close()
        await cleanup()
    n = len(batches) * BATCH
    return cpu / n * 1e6, wall / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cost of a decision row written through the real store")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--prefill", type=int, default=300_000, help="rows in the table before timing")
    parser.add_argument("--rows", type=int, default=50_000, help="rows timed")
    parser.add_argument("--rounds", type=int, default=2, help="repeats of each scheme, interleaved")
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, float]]] = {scheme: [] for scheme in SCHEMES}
    with tempfile.TemporaryDirectory(prefix="store-writes-") as tmp:
        for _ in range(args.rounds):
            for scheme in SCHEMES:
                results[scheme].append(asyncio.run(measure(args.store, scheme, args.prefill, args.rows, Path(tmp),
                                                           args.dsn)))
    table = Table(title=f"{args.store}: one decision row after {args.prefill:,} rows ({BATCH}-row batches)")
    for column in ("request ids", "CPU us/row (each round)", "wall us/row (each round)"):
        table.add_column(column)
    for scheme, runs in results.items():
        table.add_row(scheme, " / ".join(f"{c:.1f}" for c, _ in runs), " / ".join(f"{w:.1f}" for _, w in runs))
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
