"""``pointsman forget --request-id`` forgets a request's experiment shadows with it: the shadow arms'
decision rows (``<id>:shadow:<arm>``, ``shadow_of`` = the id) and what hangs off them, on real SQLite
and PostgreSQL, through the store and through the command line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable

import pytest

from store import ConversationRecord, DecisionRecord, FeedbackRecord, SubCallRecord, open_store_url
from store.base import DecisionStore
from tests.gatewayproc import REPO
from tests.store.conftest import pg_schema

pytestmark = pytest.mark.asyncio(loop_scope="session")

MakeRecord = Callable[..., DecisionRecord]
SERVED, OTHER = "req-000001", "req-000002"


def _served_and_shadows(make_record: MakeRecord, served: str, i: int) -> list[DecisionRecord]:
    """A served request in experiment ``exp`` and its two shadow arms' decisions, all of tenant acme."""
    record = make_record(i, request_id=served, tenant="acme", experiment="exp", experiment_arm="control",
                         conversation=ConversationRecord(served, 1.0, tenant="acme", text="[]"))
    shadows = [
        make_record(i, request_id=f"{served}:shadow:{arm}", tenant="acme", experiment="exp", experiment_arm=arm,
                    shadow_of=served, outcome="shadow",
                    subcalls=[SubCallRecord(f"{served}:shadow:{arm}", 0, "wf", "step", model="m", tenant="acme")])
        for arm in ("a", "b")
    ]
    return [record, *shadows]


def _feedback_on(request_ids: list[str]) -> list[FeedbackRecord]:
    # Judge rows on shadows carry no tenant here: forget must find them through their decision.
    return [FeedbackRecord(rid, 1.0, source="judge", model="m") for rid in request_ids] + [
        FeedbackRecord(rid, 0.5, tenant="acme") for rid in request_ids
    ]


async def _fill(store: DecisionStore, make_record: MakeRecord) -> None:
    rows = _served_and_shadows(make_record, SERVED, 1) + _served_and_shadows(make_record, OTHER, 2)
    await store.write_batch(rows)
    await store.write_feedback(_feedback_on([r.request_id for r in rows]))


async def _left(store: DecisionStore) -> set[str]:
    """Request ids that still have a decision or any feedback."""
    logged = await store.logged_requests()
    ids = {item.record.request_id for item in logged}
    for rid in (SERVED, OTHER):
        for shadow in (rid, f"{rid}:shadow:a", f"{rid}:shadow:b"):
            if await store.fetch_feedback(shadow) or await store.fetch_subcalls(shadow):
                ids.add(shadow)
    return ids


async def test_forgetting_a_request_forgets_its_shadows(store: DecisionStore, make_record: MakeRecord) -> None:
    await _fill(store, make_record)
    counts = await store.forget(request_id=SERVED)
    # The served decision and its two shadows; two feedback rows on each; its conversation; the shadows' sub-calls.
    assert counts == {"decisions": 3, "feedback": 6, "conversations": 1, "subcalls": 2}
    assert await _left(store) == {OTHER, f"{OTHER}:shadow:a", f"{OTHER}:shadow:b"}, "another request was touched"
    assert await store.forget(request_id=SERVED) == {"decisions": 0, "feedback": 0, "conversations": 0, "subcalls": 0}
    # A tenant's forget still finds its shadows too (they carry the tenant).
    assert (await store.forget(tenant="acme"))["decisions"] == 3
    assert await _left(store) == set()


async def _fill_url(url: str, make_record: MakeRecord) -> None:
    store = open_store_url(url)
    await store.open()
    try:
        await _fill(store, make_record)
    finally:
        await store.close()


async def _left_url(url: str) -> set[str]:
    store = open_store_url(url, existing=True)
    await store.open()
    try:
        return await _left(store)
    finally:
        await store.close()


def _forget_command(url: str, request_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "forget", "--store", url, "--request-id", request_id],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_pointsman_forget_request_id_leaves_no_shadow_behind(
    kind: str, make_record: MakeRecord, tmp_path: object
) -> None:
    async def check(url: str) -> None:
        await _fill_url(url, make_record)
        done = await asyncio.to_thread(_forget_command, url, SERVED)
        assert done.returncode == 0, done.stderr
        # PostgreSQL adds a line: the tables it VACUUMed (tests/store/test_forget_postgres_vacuum.py).
        assert done.stdout.splitlines()[0] == (
            f"forgot request '{SERVED}': deleted 3 decisions, 6 feedback rows, 1 conversations, 2 workflow sub-calls")
        assert await _left_url(url) == {OTHER, f"{OTHER}:shadow:a", f"{OTHER}:shadow:b"}

    if kind == "sqlite":
        await check(f"sqlite://{tmp_path}/decisions.db")
        return
    async with pg_schema() as dsn:
        await check(dsn)
