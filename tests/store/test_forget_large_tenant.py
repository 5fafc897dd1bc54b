"""``pointsman forget --tenant`` on a SQLite store with a large tenant while a gateway writes to the same
file: the gateway's decision and feedback writes go through while the forget runs (it deletes in short
transactions), and a forget killed half-way leaves whole requests behind that a second run deletes."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
from openai import OpenAI

from gateway.auth import hash_key
from store import ConversationRecord, DecisionRecord, FeedbackRecord, SQLiteDecisionStore, SubCallRecord
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess

BIG = 20_000  # the large tenant's decisions: forty of the forget's transactions
KEY = "sk-team-a-0123456789"
CHILD_TABLES = ("feedback", "conversations", "subcalls")


def _big_tenant(i: int) -> DecisionRecord:
    """Decision ``i`` of tenant big: every other one with a conversation, every tenth with a sub-call."""
    rid = f"big-{i:06d}"
    return DecisionRecord(
        request_id=rid, created_at=1_700_000_000.0 + i, endpoint="chat.completions", route="auto",
        requested_model="auto", tenant="big",
        conversation=ConversationRecord(rid, 1.0, tenant="big", text="[]") if i % 2 == 0 else None,
        subcalls=[SubCallRecord(rid, 0, "wf", "step", model="m", tenant="big")] if i % 10 == 0 else [],
    )


async def _fill(db: Path) -> None:
    """BIG decisions of tenant big, feedback on every other one, and one feedback row of the tenant on a
    request whose decision was never written."""
    store = SQLiteDecisionStore(str(db))
    await store.open()
    try:
        await store.write_batch([_big_tenant(i) for i in range(BIG)])
        await store.write_feedback([FeedbackRecord(f"big-{i:06d}", 1.0, tenant="big") for i in range(0, BIG, 2)])
        await store.write_feedback([FeedbackRecord("big-never-logged", 0.0, tenant="big")])
    finally:
        await store.close()


def _count(db: Path, sql: str) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute(sql).fetchone()[0])
    finally:
        con.close()


def _big_left(db: Path) -> int:
    return _count(db, "SELECT count(*) FROM decisions WHERE tenant = 'big'")


def _forget(db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "forget", "--store", f"sqlite://{db}", "--tenant", "big"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_gateway_keeps_writing_while_a_large_tenant_is_forgotten(upstream: FakeUpstream, tmp_path: Path) -> None:
    # The forget was one transaction: for a tenant of 500 000 decisions it held the file's write lock
    # for ~11 s, the gateway's decision writes failed with SQLITE_BUSY and feedback was answered 503.
    config = {
        "auth": {"api_keys": [{"name": "team-a", "sha256": hash_key(KEY)}]},
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "fake-ok", "upstream_name": "ok"}]}],
        "routes": [{"name": "auto", "model": "fake-ok"}],
    }
    gateway = GatewayProcess(config, tmp_path)
    asyncio.run(_fill(gateway.db_path))
    gateway.start()
    client = OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=30)
    http = httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    served: list[str] = []
    during = 0  # feedback committed after the forget deleted its first rows and before its last
    try:
        forget = _forget(gateway.db_path)
        while forget.poll() is None:
            before = _big_left(gateway.db_path)
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "hi"}])
            served.append(raw.headers["x-pointsman-request-id"])
            answer = http.post(f"{gateway.base_url}/feedback", json={"request_id": served[-1], "score": 1.0})
            assert answer.status_code == 200, answer.text
            if before < BIG and _big_left(gateway.db_path) > 0:
                during += 1
        out, err = forget.communicate()
    finally:
        assert gateway.terminate() == 0
        http.close()
    assert forget.returncode == 0, err
    assert out.strip() == (f"forgot tenant 'big': deleted {BIG} decisions, {BIG // 2 + 1} feedback rows, "
                           f"{BIG // 2} conversations, {BIG // 10} workflow sub-calls")
    assert during > 0, "no feedback could be written while the forget ran: it held the write lock throughout"
    assert {d["request_id"] for d in gateway.decisions()} == set(served)
    assert _count(gateway.db_path, "SELECT count(*) FROM feedback WHERE tenant = 'team-a' AND source = 'user'") \
        == len(served)
    assert "write failed" not in gateway.log()


def test_a_forget_killed_half_way_leaves_whole_requests_and_a_second_run_finishes(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    asyncio.run(_fill(db))
    forget = _forget(db)
    while not 0 < _big_left(db) < BIG:
        assert forget.poll() is None, "the forget ended before it could be interrupted: it deletes in one go"
    forget.send_signal(signal.SIGKILL)
    forget.communicate()

    # No row of the tenant lost its decision: a later load or forget sees whole requests.
    for table in CHILD_TABLES:
        assert _count(db, f"SELECT count(*) FROM {table} t WHERE tenant = 'big' AND request_id != 'big-never-logged' "
                          "AND NOT EXISTS (SELECT 1 FROM decisions d WHERE d.request_id = t.request_id)") == 0, table
    left = {table: _count(db, f"SELECT count(*) FROM {table} WHERE tenant = 'big'")
            for table in ("decisions", *CHILD_TABLES)}
    assert 0 < left["decisions"] < BIG

    again = _forget(db)
    out, err = again.communicate()
    assert again.returncode == 0, err
    assert out.strip() == (
        f"forgot tenant 'big': deleted {left['decisions']} decisions, {left['feedback']} feedback rows, "
        f"{left['conversations']} conversations, {left['subcalls']} workflow sub-calls")
    for table in ("decisions", *CHILD_TABLES):
        assert _count(db, f"SELECT count(*) FROM {table}") == 0, table
