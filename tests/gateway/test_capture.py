"""Conversation capture through the real gateway: embeddings (and opted-in text) next to decisions."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from openai import OpenAI

from classifiers.conversation import conversation_text
from classifiers.encoders import load_encoder
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

KNOB = {"cost_quality": {"signal": "difficulty", "strong": "big", "weak": "small", "threshold": 0.5}}
REDACT = {"name": "redact-pii", "priority": 90, "when": {"signal": "pii", "op": "truthy"},
          "action": {"redact": ["email"]}}


@pytest.fixture(scope="module")
def gw(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "big", "upstream_name": "ok"}, {"name": "small", "upstream_name": "ok"}]}],
        "classifiers": {"encoder": "static"},
        "routes": [
            {"name": "keep", "policy": "rules", "rules": [REDACT], **KNOB,
             "record": {"text": True, "text_retention_days": 1}},
            {"name": "embed", "policy": "rules", **KNOB},
            {"name": "nothing", "policy": "rules", **KNOB, "record": {"embedding": False}},
            {"name": "rules-only", "policy": "rules", "rules": [REDACT], "model": "small",
             "record": {"text": True}},
            {"name": "static", "model": "small"},
        ],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("capture")).start(timeout=60)
    yield proc
    proc.terminate()


def ask(gw: GatewayProcess, route: str, messages: list[dict[str, Any]]) -> str:
    client = OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    sent: Any = messages
    raw = client.chat.completions.with_raw_response.create(model=route, messages=sent)
    raw.parse()
    return str(raw.headers["x-pointsman-request-id"])


def conversation(gw: GatewayProcess, request_id: str) -> dict[str, Any] | None:
    con = sqlite3.connect(gw.db_path)
    con.row_factory = sqlite3.Row
    try:
        row = con.execute("SELECT * FROM conversations WHERE request_id = ?", (request_id,)).fetchone()
    finally:
        con.close()
    return None if row is None else dict(row)


def test_the_embedding_the_policy_used_is_kept_with_the_encoder_id(gw: GatewayProcess) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Explain recursion to a child {uuid.uuid4().hex}"}]
    rid = ask(gw, "embed", messages)
    record = gw.decision(rid)
    assert "difficulty" in record["signals"]
    row = conversation(gw, rid)
    assert row is not None  # written in the same transaction as the decision
    encoder = load_encoder("static")
    assert row["encoder_id"] == encoder.id
    kept = np.frombuffer(row["embedding"], dtype="<f4")
    expected = encoder.encode([conversation_text({"messages": messages}, max_chars=2000)])[0]
    np.testing.assert_allclose(kept, expected, rtol=1e-5, atol=1e-6)
    assert row["text"] is None and row["expires_at"] is None  # text only when the route opts in


def test_text_is_kept_redacted_with_its_expiry_only_when_opted_in(gw: GatewayProcess) -> None:
    messages = [{"role": "user", "content": f"Email bob.smith@acme-corp.com the plan {uuid.uuid4().hex}"}]
    before = time.time()
    rid = ask(gw, "keep", messages)
    gw.decision(rid)
    row = conversation(gw, rid)
    assert row is not None and row["embedding"]
    kept = orjson.loads(row["text"])
    assert kept[0]["role"] == "user" and "[EMAIL]" in kept[0]["content"]
    assert "bob.smith@acme-corp.com" not in row["text"]  # what went upstream: redacted
    assert before + 86_400 - 5 <= row["expires_at"] <= time.time() + 86_400 + 5
    assert "bob.smith" not in gw.log() and "the plan" not in gw.log()


def test_routes_that_did_not_encode_or_opted_out_keep_nothing(gw: GatewayProcess) -> None:
    ids = [ask(gw, route, [{"role": "user", "content": f"Hello there {uuid.uuid4().hex}"}])
           for route in ("nothing", "rules-only", "static")]
    for rid in ids:
        gw.decision(rid)
    last = ask(gw, "embed", [{"role": "user", "content": f"A barrier {uuid.uuid4().hex}"}])
    eventually(lambda: conversation(gw, last) is not None, "the barrier's conversation")
    assert [conversation(gw, rid) for rid in ids] == [None, None, None]
