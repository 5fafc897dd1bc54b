"""Feedback posted to a running gateway after ``pointsman forget`` (another process) deleted its request.

The gateway remembers the request ids it issued recently, so feedback on an id it just answered is accepted
before its decision is flushed. After a forget those ids are still remembered: feedback posted right
afterwards re-created rows for the forgotten request. The forget leaves a tombstone in the store; the
feedback write skips rows it covers, and the client gets the 404 an unknown id gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from store import DecisionStore, FeedbackRecord, PostgresDecisionStore, SQLiteDecisionStore
from tests.fakes.upstream import FakeUpstream
from tests.gateway.test_feedback import KEYS, assert_error, gateway_config, post, serve
from tests.gatewayproc import REPO, GatewayProcess
from tests.polling import eventually
from tests.store.conftest import sync_pg_schema


def _forget(url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "forget", "--store", url, *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _stored_feedback(store: DecisionStore, request_id: str) -> list[FeedbackRecord]:
    async def read() -> list[FeedbackRecord]:
        await store.open()
        try:
            return await store.fetch_feedback(request_id)
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("who", ["request", "tenant"])
def test_feedback_on_a_request_forgotten_while_the_gateway_runs_is_a_404_and_stores_nothing(
    upstream: FakeUpstream, tmp_path: Path, kind: str, who: str
) -> None:
    config = gateway_config(upstream, KEYS)
    with contextlib.ExitStack() as stack:
        if kind == "postgres":
            dsn = stack.enter_context(sync_pg_schema())
            config["store"] = {"kind": "postgres", "dsn": dsn, "flush_interval": 0.05}
            url = dsn

            def store() -> DecisionStore:
                return PostgresDecisionStore(dsn)
        else:
            proc_db = tmp_path / "decisions.db"
            url = f"sqlite://{proc_db}"

            def store() -> DecisionStore:
                return SQLiteDecisionStore(str(proc_db))

        proc = GatewayProcess(config, tmp_path).start()
        stack.callback(proc.terminate)
        forgotten = serve(proc)
        assert post(proc, {"request_id": forgotten, "score": 1.0}).status_code == 200
        kept = serve(proc, "team-b")

        out = _forget(url, *(("--request-id", forgotten) if who == "request" else ("--tenant", "team-a")))
        assert out.startswith("forgot "), out

        # The gateway still remembers the id as team-a's: before the tombstone this was a 200 and a new row.
        assert_error(post(proc, {"request_id": forgotten, "score": 0.0, "comment": "again"}), 404,
                     "request_not_found", "request_id")
        assert _stored_feedback(store(), forgotten) == []
        # Nothing else is refused: another tenant's request, and team-a's requests made after the forget.
        assert post(proc, {"request_id": kept, "score": 1.0}, tenant="team-b").status_code == 200
        later = serve(proc)
        assert post(proc, {"request_id": later, "score": 0.5}).status_code == 200
        assert [f.score for f in _stored_feedback(store(), later)] == [0.5]


def _ask(proc: GatewayProcess, tenant: str, session: str, text: str) -> str:
    client = OpenAI(base_url=proc.base_url, api_key=KEYS[tenant], max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], extra_headers={"x-pointsman-session-id": session})
    return str(raw.headers["x-pointsman-request-id"])


def test_feedback_the_gateway_derives_after_a_tenant_forget_is_not_written_for_its_earlier_requests(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Implicit (and judge) feedback is made by the gateway after the request it is about: a re-ask
    arriving after ``forget --tenant`` makes a row about a request issued before it. That row knew no issue
    time, its decision was deleted, so the store took the row's own time (after the forget) and wrote it
    back. It now carries its request's issue time, which the tenant's tombstone covers."""
    question = "How do I sort a list of tuples in Python by the second item?"
    proc_db = tmp_path / "decisions.db"
    proc = GatewayProcess(gateway_config(upstream, KEYS), tmp_path).start()
    try:
        forgotten = _ask(proc, "team-a", "s-a", question)
        control = _ask(proc, "team-b", "s-b", question)
        out = _forget(f"sqlite://{proc_db}", "--tenant", "team-a")
        assert out.startswith("forgot "), out
        _ask(proc, "team-a", "s-a", question + "?")  # re-asks: implicit rows about the first requests
        _ask(proc, "team-b", "s-b", question + "?")
        store = SQLiteDecisionStore(str(proc_db))
        # team-b's row was queued after team-a's: once it is written, team-a's was written or skipped.
        eventually(lambda: [f.metric for f in _stored_feedback(store, control)] == ["reask"], "team-b's reask row")
        assert _stored_feedback(store, forgotten) == []
    finally:
        proc.terminate()
