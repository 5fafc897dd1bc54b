"""What ``pointsman forget`` and the text purge delete from a SQLite store is gone from its files, not only
from its tables: a copy of the files (a backup, a disk image, ``strings pointsman.db``) must not give a
forgotten tenant's conversation text or feedback comments back.

A gateway keeps its connection open, so the store's write-ahead log (``<db>-wal``) is never deleted
while it serves: it keeps the page images every transaction wrote, inserts of the rows forgotten since
among them, until later writes happen to overwrite them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
from openai import OpenAI

from gateway.auth import hash_key
from store import ConversationRecord, DecisionRecord, SQLiteDecisionStore
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess
from tests.polling import eventually

KEYS = {"acme": "sk-acme-0123456789", "other": "sk-other-9876543210"}
KNOB = {"cost_quality": {"signal": "difficulty", "strong": "big", "weak": "small", "threshold": 0.5}}


def _files_holding(db: Path, marker: str) -> list[str]:
    """The store's files (the database, its WAL and shared memory) whose bytes hold ``marker``."""
    return sorted(p.name for p in db.parent.glob(db.name + "*") if marker.encode() in p.read_bytes())


def _forget(db: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "forget", "--store", f"sqlite://{db}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_forgotten_tenants_text_and_comments_leave_the_files_of_a_store_a_gateway_writes_to(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    config = {
        "auth": {"api_keys": [{"name": name, "sha256": hash_key(key)} for name, key in KEYS.items()]},
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "big", "upstream_name": "ok"}, {"name": "small", "upstream_name": "ok"}]}],
        "classifiers": {"encoder": "static"},
        "routes": [{"name": "auto", "policy": "rules", **KNOB, "record": {"text": True}}],
    }
    gateway = GatewayProcess(config, tmp_path).start(timeout=60)
    db = gateway.db_path
    secret, kept = f"forget-me-{uuid.uuid4().hex}", f"keep-me-{uuid.uuid4().hex}"
    try:
        for tenant, marker in (("acme", secret), ("other", kept)):
            client = OpenAI(base_url=gateway.base_url, api_key=KEYS[tenant], max_retries=0, timeout=30)
            for i in range(5):
                raw = client.chat.completions.with_raw_response.create(
                    model="auto", messages=[{"role": "user", "content": f"About {marker} number {i}"}])
                request_id = raw.headers["x-pointsman-request-id"]
                posted = httpx.post(f"{gateway.base_url}/feedback", timeout=30,
                                    headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                                    json={"request_id": request_id, "score": 1, "comment": f"{marker} was fine"})
                assert posted.status_code == 200, posted.text
                gateway.decision(request_id)
        eventually(lambda: _files_holding(db, secret) and _files_holding(db, kept), "both tenants' text is stored")

        out = _forget(db, "--tenant", "acme")
        assert out.startswith("forgot tenant 'acme': deleted 5 decisions, 5 feedback rows, 5 conversations"), out

        # The store is still the gateway's: it answers and records, and the other tenant's text is all there.
        client = OpenAI(base_url=gateway.base_url, api_key=KEYS["other"], max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}])
        gateway.decision(raw.headers["x-pointsman-request-id"])
        assert _files_holding(db, secret) == []
        assert _files_holding(db, kept) != []
    finally:
        assert gateway.terminate() == 0
    assert _files_holding(db, secret) == []
    assert _files_holding(db, kept) != []


async def _expired_and_live_text(db: Path, expired: str, live: str) -> SQLiteDecisionStore:
    store = SQLiteDecisionStore(str(db))
    await store.open()
    await store.write_batch([
        DecisionRecord(request_id=f"r-{i}", created_at=1_700_000_000.0 + i, endpoint="chat.completions",
                       route="auto", requested_model="auto", tenant="acme",
                       conversation=ConversationRecord(f"r-{i}", 1_700_000_000.0, tenant="acme", text=f"[{text!r}]",
                                                       expires_at=expires_at))
        for i, (text, expires_at) in enumerate([(expired, 1_700_000_100.0), (live, 4_000_000_000.0)])
    ])
    return store


def test_purged_text_leaves_the_files_of_a_store_that_stays_open(tmp_path: Path) -> None:
    """The retention purge (the gateway's own, every 10 minutes, and ``forget --purge-expired``) deletes the
    text of expired conversations: it must not stay readable in the write-ahead log of the open store."""
    db = tmp_path / "decisions.db"
    expired, live = f"expired-{uuid.uuid4().hex}", f"live-{uuid.uuid4().hex}"

    async def run() -> None:
        store = await _expired_and_live_text(db, expired, live)
        try:
            assert _files_holding(db, expired) and _files_holding(db, live)
            assert await store.purge_expired_text(2_000_000_000.0) == 1  # the gateway's purge, on its connection
            assert _files_holding(db, expired) == []
            assert _files_holding(db, live) != []
        finally:
            await store.close()

    asyncio.run(run())

    # The operator's purge, from another process, while a gateway holds the store open.
    db2 = tmp_path / "other.db"

    async def held() -> None:
        store = await _expired_and_live_text(db2, expired, live)
        try:
            out = await asyncio.to_thread(_forget, db2, "--purge-expired")
            assert "purged the text of 1 conversations" in out, out
            assert _files_holding(db2, expired) == []
            assert _files_holding(db2, live) != []
        finally:
            await store.close()

    asyncio.run(held())
