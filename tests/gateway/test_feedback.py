"""``POST /v1/feedback`` black-box through a gateway subprocess: answers served by a fake upstream,
feedback posted with httpx, rows read from the gateway's real SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from gateway.auth import hash_key
from policies.echo import client_echo
from store import FeedbackRecord
from store.outcomes import served_feedback
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess
from tests.polling import eventually
from tests.store.conftest import sync_pg_schema
from tests.store.test_migrations import build_v1_sqlite

KEYS = {"team-a": "sk-team-a-0123456789", "team-b": "sk-team-b-9876543210"}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
LABELS = {"good": 1.0, "meh": 0.5, "bad": 0.0}
NEVER_ISSUED = "psm-" + "0" * 32


def gateway_config(upstream: FakeUpstream, keys: dict[str, str], **sections: Any) -> dict[str, Any]:
    return {
        "auth": {"api_keys": [{"name": name, "sha256": hash_key(key)} for name, key in keys.items()]},
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [{"name": "fake-ok", "upstream_name": "ok"}],
        }],
        "routes": [{"name": "auto", "model": "fake-ok"}],
        "feedback": {"labels": LABELS, "write_timeout": 30.0},
        **sections,
    }


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(gateway_config(upstream, KEYS), tmp_path_factory.mktemp("gw-feedback")).start()
    yield proc
    proc.terminate()


def serve(gateway: GatewayProcess, tenant: str = "team-a") -> str:
    """One chat completion through the gateway; its request id."""
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS[tenant], max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    return str(raw.headers["x-pointsman-request-id"])


def post(gateway: GatewayProcess, body: Any, tenant: str | None = "team-a", key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or KEYS[tenant or 'team-a']}"} if tenant or key else {}
    if isinstance(body, bytes):
        return httpx.post(f"{gateway.base_url}/feedback", content=body, headers=headers, timeout=60)
    return httpx.post(f"{gateway.base_url}/feedback", json=body, headers=headers, timeout=60)


def feedback_rows(db: Path, request_id: str | None = None) -> list[dict[str, Any]]:
    """Feedback rows posted through the API. Implicit signals the gateway records on its own
    (source "implicit", written asynchronously) are left out: they are not what these tests post."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        if request_id is None:
            return [dict(r) for r in conn.execute("SELECT * FROM feedback WHERE source != 'implicit'")]
        sql = "SELECT * FROM feedback WHERE request_id = ? AND source != 'implicit' ORDER BY metric, source, model"
        return [dict(r) for r in conn.execute(sql, (request_id,))]
    finally:
        conn.close()


def assert_error(response: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error


# --- accepted feedback ---------------------------------------------------------------------------


def test_score_thumbs_and_label_are_stored_before_the_answer(gateway: GatewayProcess) -> None:
    request_id = serve(gateway)
    response = post(gateway, {"request_id": request_id, "score": 0.75, "comment": "close enough"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "feedback" and body["id"].startswith("fb-")
    assert (body["request_id"], body["metric"], body["score"], body["source"]) == (request_id, "quality", 0.75, "user")
    assert body["model"] == "fake-ok" and body["comment"] == "close enough"  # default: the model that answered
    # The 200 came after the commit: the row is there now, no waiting.
    [row] = feedback_rows(gateway.db_path, request_id)
    assert (row["score"], row["tenant"], row["comment"], row["model"]) == (0.75, "team-a", "close enough", "fake-ok")

    assert post(gateway, {"request_id": request_id, "thumbs": "down", "metric": "tone"}).status_code == 200
    assert post(gateway, {"request_id": request_id, "thumbs": True, "metric": "style"}).status_code == 200
    assert post(gateway, {"request_id": request_id, "label": "meh", "metric": "facts"}).status_code == 200
    judged = post(gateway, {"request_id": request_id, "score": 1, "source": "judge", "model": "fake-ok"})
    assert judged.status_code == 200 and judged.json()["model"] == "fake-ok"
    rows = {(r["metric"], r["source"], r["model"]): (r["score"], r["label"]) for r in feedback_rows(
        gateway.db_path, request_id)}
    assert rows == {
        ("facts", "user", "fake-ok"): (0.5, "meh"),
        ("quality", "judge", "fake-ok"): (1.0, None),
        ("quality", "user", "fake-ok"): (0.75, None),
        ("style", "user", "fake-ok"): (1.0, "up"),
        ("tone", "user", "fake-ok"): (0.0, "down"),
    }


def test_repeats_are_idempotent(gateway: GatewayProcess) -> None:
    request_id = serve(gateway)
    ids = {post(gateway, {"request_id": request_id, "thumbs": "up"}).json()["id"] for _ in range(3)}
    assert len(ids) == 1
    assert len(feedback_rows(gateway.db_path, request_id)) == 1
    # A changed mind replaces the row under the same id.
    again = post(gateway, {"request_id": request_id, "thumbs": "down"})
    assert again.json()["id"] in ids
    [row] = feedback_rows(gateway.db_path, request_id)
    assert row["score"] == 0.0


# --- 404, 401, 400 -------------------------------------------------------------------------------


def test_unknown_and_foreign_request_ids_are_404(gateway: GatewayProcess) -> None:
    request_id = serve(gateway, "team-a")
    gateway.decision(request_id)  # flushed: the store knows it too, not only this process
    before = len(feedback_rows(gateway.db_path))
    never = post(gateway, {"request_id": NEVER_ISSUED, "score": 1.0})
    assert_error(never, 404, "request_not_found", "request_id")
    foreign = post(gateway, {"request_id": request_id, "score": 1.0}, tenant="team-b")
    assert_error(foreign, 404, "request_not_found", "request_id")
    # Another tenant's id reads exactly like one never issued (only the id in the message differs).
    assert foreign.json()["error"]["type"] == never.json()["error"]["type"] == "invalid_request_error"
    assert len(feedback_rows(gateway.db_path)) == before
    assert post(gateway, {"request_id": request_id, "score": 1.0}, tenant="team-a").status_code == 200


def test_no_or_wrong_api_key_is_401(gateway: GatewayProcess) -> None:
    request_id = serve(gateway)
    assert_error(post(gateway, {"request_id": request_id, "score": 1.0}, tenant=None), 401, "invalid_api_key")
    assert_error(post(gateway, {"request_id": request_id, "score": 1.0}, key="sk-nope"), 401, "invalid_api_key")


@pytest.mark.parametrize(("body", "param"), [
    ({"score": 1.5}, "score"),
    ({"score": -0.01}, "score"),
    ({"score": "high"}, "score"),
    ({"score": True}, "score"),
    ({"score": 0.5, "thumbs": "up"}, "thumbs"),
    ({"thumbs": "up", "label": "good"}, "label"),
    ({}, "score"),
    ({"thumbs": "sideways"}, "thumbs"),
    ({"thumbs": 1}, "thumbs"),
    ({"label": "superb"}, "label"),
    ({"score": 1, "metric": "not an identifier!"}, "metric"),
    ({"score": 1, "metric": "x" * 65}, "metric"),
    ({"score": 1, "source": "implicit"}, "source"),
    ({"score": 1, "comment": "x" * 2001}, "comment"),
    ({"score": 1, "comment": 42}, "comment"),
    ({"score": 1, "model": ["a"]}, "model"),
    ({"score": 1, "scroe": 1}, "scroe"),
])
def test_bad_values_are_400_naming_the_param(gateway: GatewayProcess, body: dict[str, Any], param: str) -> None:
    request_id = serve(gateway)
    response = post(gateway, {"request_id": request_id, **body})
    assert_error(response, 400, param=param)
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert feedback_rows(gateway.db_path, request_id) == []


@pytest.mark.parametrize("body", [{"score": 1}, {"request_id": 7, "score": 1}, {"request_id": "", "score": 1}])
def test_missing_request_id_is_400(gateway: GatewayProcess, body: dict[str, Any]) -> None:
    assert_error(post(gateway, body), 400, param="request_id")


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'{"request_id": "a", "request_id": "b", "score": 1}'])
def test_malformed_bodies_are_400(gateway: GatewayProcess, raw: bytes) -> None:
    assert_error(post(gateway, raw), 400)


# --- load ----------------------------------------------------------------------------------------


async def test_a_thousand_concurrent_posts_leave_exactly_a_thousand_rows(gateway: GatewayProcess) -> None:
    # aiohttp rather than httpx here: httpx.AsyncClient manages ~50 requests/s at this concurrency
    # on this machine (aiohttp ~500), which would make this test take a minute.
    request_ids = await asyncio.to_thread(lambda: [serve(gateway) for _ in range(20)])
    before = len(feedback_rows(gateway.db_path))
    bodies = [
        {"request_id": rid, "score": (i % 10) / 10, "metric": f"m{i}"}
        for rid in request_ids for i in range(50)
    ]
    headers = {"Authorization": f"Bearer {KEYS['team-a']}"}
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=200)) as session:

        async def post_all(items: list[dict[str, Any]]) -> set[int]:
            async def one(body: dict[str, Any]) -> int:
                async with session.post(f"{gateway.base_url}/feedback", json=body) as response:
                    await response.read()
                    return response.status

            return set(await asyncio.gather(*(one(body) for body in items)))

        assert await post_all(bodies) == {200}
        assert len(feedback_rows(gateway.db_path)) - before == 1000
        # Repeats posted concurrently with new keys: only the new keys add rows.
        more = [{"request_id": rid, "thumbs": "up", "metric": "extra"} for rid in request_ids]
        assert await post_all(bodies[:200] + more) == {200}
        assert len(feedback_rows(gateway.db_path)) - before == 1020
        async with session.get(f"{gateway.url}/metrics") as response:
            metrics = await response.text()
    accepted = next(line for line in metrics.splitlines()
                    if line.startswith('pointsman_feedback_total{outcome="accepted"}'))
    assert float(accepted.split()[-1]) >= 1220


# --- store outage --------------------------------------------------------------------------------


def test_store_outage_is_503_and_nothing_is_acknowledged(gateway: GatewayProcess) -> None:
    """Another process holds the SQLite write lock (a backup, a long manual transaction): the
    feedback cannot be written, so the answer is 503 with Retry-After, never a 200."""
    request_id = serve(gateway)
    gateway.decision(request_id)
    holder = sqlite3.connect(gateway.db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # takes the write lock; readers still read (WAL)
        response = post(gateway, {"request_id": request_id, "score": 0.25})
        assert_error(response, 503, "store_unavailable")
        assert response.headers["retry-after"] == "1"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert feedback_rows(gateway.db_path, request_id) == []
    retried = post(gateway, {"request_id": request_id, "score": 0.25})
    assert retried.status_code == 200, retried.text
    assert [r["score"] for r in feedback_rows(gateway.db_path, request_id)] == [0.25]
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'pointsman_feedback_total{outcome="unavailable"} 1.0' in metrics


# --- ids not flushed yet, and ids from before an upgrade -----------------------------------------


def test_an_id_not_yet_flushed_is_known(upstream: FakeUpstream, tmp_path: Path) -> None:
    config = gateway_config(upstream, KEYS)
    proc = GatewayProcess(config, tmp_path)
    config["store"] = {"kind": "sqlite", "path": str(proc.db_path), "flush_interval": 60, "batch_size": 10_000}
    # Every 404 waits recheck_after (default flush_interval + 0.2: a minute here) before answering.
    config["feedback"] = {**config["feedback"], "recheck_after": 0.3}
    proc = GatewayProcess(config, tmp_path).start()
    try:
        request_id = serve(proc)
        assert post(proc, {"request_id": request_id, "thumbs": "up"}).status_code == 200
        assert proc.decisions() == []  # the decision record is still queued in the gateway
        assert [r["score"] for r in feedback_rows(proc.db_path, request_id)] == [1.0]
        assert_error(post(proc, {"request_id": request_id, "thumbs": "up"}, tenant="team-b"), 404, "request_not_found")
    finally:
        assert proc.terminate() == 0
    assert [d["request_id"] for d in proc.decisions()] == [request_id]  # flushed at shutdown


def test_a_v1_database_is_upgraded_and_its_requests_take_feedback(upstream: FakeUpstream, tmp_path: Path) -> None:
    """The gateway starts on a database written by the first schema; the old rows stay and old
    request ids (found in the store, not in the process) take feedback, tenant-scoped."""
    keys = {"acme": "sk-acme-0123456789", "globex": "sk-globex-0123456789"}
    proc = GatewayProcess(gateway_config(upstream, keys), tmp_path)
    build_v1_sqlite(str(proc.db_path))
    proc.start()
    try:
        assert len(proc.decisions()) == 5
        ok = post(proc, {"request_id": "old-1", "score": 0.0, "metric": "speed"}, key=keys["acme"])
        assert ok.status_code == 200, ok.text
        assert_error(post(proc, {"request_id": "old-1", "score": 0.0}, key=keys["globex"]), 404, "request_not_found")
        new_id = OpenAI(base_url=proc.base_url, api_key=keys["globex"], max_retries=0).chat.completions \
            .with_raw_response.create(model="auto", messages=MESSAGES).headers["x-pointsman-request-id"]
        assert post(proc, {"request_id": new_id, "label": "good"}, key=keys["globex"]).status_code == 200
    finally:
        assert proc.terminate() == 0
    assert len(proc.decisions()) == 6
    rows = feedback_rows(proc.db_path, "old-1")
    assert [(r["metric"], r["score"], r["tenant"]) for r in rows] == [("quality", 1.0, "acme"), ("speed", 0.0, "acme")]

    # pointsman forget, on the same database.
    def forget(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", "forget", "--store", f"sqlite://{proc.db_path}", *args],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )

    by_id = forget("--request-id", "old-1")
    assert by_id.returncode == 0, by_id.stderr
    assert by_id.stdout.strip() == (
        "forgot request 'old-1': deleted 1 decisions, 2 feedback rows, 0 conversations, 0 workflow sub-calls")
    by_tenant = forget("--tenant", "globex", "--purge-expired")
    assert by_tenant.returncode == 0, by_tenant.stderr
    assert by_tenant.stdout.splitlines() == [
        "forgot tenant 'globex': deleted 3 decisions, 1 feedback rows, 0 conversations, 0 workflow sub-calls",
        "purged the text of 0 conversations past their retention",
    ]
    assert {d["request_id"] for d in proc.decisions()} == {"old-0", "old-2"}
    nothing = forget()
    assert nothing.returncode == 2 and "--tenant" in nothing.stderr
    # A mistyped store path is an error, not an empty new database that "forgot" nothing.
    typo = proc.db_path.with_name("typo.db")
    wrong = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "forget", "--store", f"sqlite://{typo}", "--tenant", "acme"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert wrong.returncode == 2 and "no SQLite database at" in wrong.stderr and not wrong.stdout
    assert not typo.exists()


@pytest.mark.parametrize("counts", ["-100,5", "9223372036854775813,1", "5,-1"])
def test_an_upstream_usage_that_cannot_be_true_loses_neither_the_answer_nor_its_record(
    upstream: FakeUpstream, tmp_path: Path, counts: str
) -> None:
    # A negative count failed the request with a 500 after the answer was in (and its record never
    # existed: feedback on it was a 404); one past 64 bits stopped the decision log for good.
    config = gateway_config(upstream, KEYS)
    config["backends"][0]["models"].append({"name": "odd-usage", "upstream_name": f"usage:{counts}",
                                            "input_cost_per_mtok": 10, "output_cost_per_mtok": 30})
    proc = GatewayProcess(config, tmp_path).start()
    try:
        client = OpenAI(base_url=proc.base_url, api_key=KEYS["team-a"], max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(model="odd-usage", messages=MESSAGES)
        assert raw.parse().choices[0].message.content == "an answer"
        ids = [str(raw.headers["x-pointsman-request-id"])]
        with client.chat.completions.with_streaming_response.create(
            model="odd-usage", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        ) as streamed:
            assert "".join(streamed.iter_lines()).count("[DONE]") == 1
            ids.append(streamed.headers["x-pointsman-request-id"])
        ids.append(serve(proc))  # a normal request after them is logged too
        for request_id in ids:
            assert post(proc, {"request_id": request_id, "score": 1}).status_code == 200
        for request_id in ids[:2]:
            record = proc.decision(request_id)
            assert record["status"] == 200
            for count in (record["prompt_tokens"], record["completion_tokens"]):
                assert count is None or 0 <= count < 2**31  # a count that cannot be true is unknown
        assert proc.decision(ids[2])["prompt_tokens"] == 11
    finally:
        proc.terminate()
    assert "Traceback" not in proc.log() and "write failed" not in proc.log()


# --- 404s that tell nothing, the default model, judge rows kept apart -------------------------------

RECHECK = 0.6  # feedback.recheck_after of the gateways below: every 404 waits this long


def _not_found_shape(response: httpx.Response, request_id: str) -> dict[str, Any]:
    """A 404's status and body with the (masked) echo of its own id taken out: what must not differ."""
    assert_error(response, 404, "request_not_found", "request_id")
    error = dict(response.json()["error"])
    assert client_echo(request_id, 48) in error["message"], error
    error["message"] = error["message"].replace(client_echo(request_id, 48), "<id>")
    return {"status": response.status_code, "content-type": response.headers["content-type"], "error": error}


def _timed_post(gateway: GatewayProcess, body: dict[str, Any], tenant: str = "team-a") -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = post(gateway, body, tenant=tenant)
    return response, time.monotonic() - started


def _refused_request_id(gateway: GatewayProcess) -> str:
    """The id of a chat request answered 401 (a bad key): its record has no tenant."""
    response = httpx.post(f"{gateway.base_url}/chat/completions", headers={"Authorization": "Bearer sk-nope"},
                          json={"model": "auto", "messages": MESSAGES}, timeout=30)
    assert response.status_code == 401
    return str(response.headers["x-pointsman-request-id"])


@pytest.mark.parametrize("flushed", [False, True])
def test_another_tenants_id_is_a_404_that_reads_and_times_like_a_never_issued_one(
    upstream: FakeUpstream, tmp_path: Path, flushed: bool
) -> None:
    """Another tenant's id, and the id of a request refused with 401, answer the same 404 as an id never
    issued, and not before recheck_after: whether the id is only in this process's memory (not flushed)
    or in the store too. Lower bounds only: an upper bound would fail on a loaded machine."""
    config = gateway_config(upstream, KEYS)
    proc = GatewayProcess(config, tmp_path)
    flush = {"flush_interval": 0.05} if flushed else {"flush_interval": 60, "batch_size": 10_000}
    config["store"] = {"kind": "sqlite", "path": str(proc.db_path), **flush}
    config["feedback"] = {**config["feedback"], "recheck_after": RECHECK}
    proc = GatewayProcess(config, tmp_path).start()
    try:
        theirs, refused = serve(proc, "team-b"), _refused_request_id(proc)
        never = "psm-" + "7" * len(theirs.removeprefix("psm-"))  # the same length: the same echo
        if flushed:
            proc.decision(theirs)
            proc.decision(refused)
        else:
            assert proc.decisions() == [], "the records must still be only in the gateway's memory"
        shapes, times = {}, {}
        for name, request_id in (("never", never), ("foreign", theirs), ("refused", refused)):
            response, times[name] = _timed_post(proc, {"request_id": request_id, "score": 1.0})
            shapes[name] = _not_found_shape(response, request_id)
        assert shapes["foreign"] == shapes["never"] == shapes["refused"]
        for name, took in times.items():
            assert took >= 0.8 * RECHECK, f"the {name} id's 404 came after {took:.3f}s, before recheck_after"
        # The owner's own id is known at once, flushed or not, and its row says which model answered.
        ok = post(proc, {"request_id": theirs, "score": 1.0}, tenant="team-b")
        assert ok.status_code == 200 and ok.json()["model"] == "fake-ok", ok.text
    finally:
        assert proc.terminate() == 0
    assert [r["model"] for r in feedback_rows(proc.db_path, theirs)] == ["fake-ok"]
    assert feedback_rows(proc.db_path, never) == feedback_rows(proc.db_path, refused) == []


def _fb(row: dict[str, Any]) -> FeedbackRecord:
    return FeedbackRecord(row["request_id"], row["score"], metric=row["metric"], source=row["source"],
                          model=row["model"], tenant=row["tenant"])


def test_the_default_model_is_the_one_that_answered_and_naming_it_replaces_the_same_row(
    gateway: GatewayProcess,
) -> None:
    request_id = serve(gateway)
    first = post(gateway, {"request_id": request_id, "score": 0.7})
    assert first.status_code == 200 and first.json()["model"] == "fake-ok", first.text
    # The same outcome, the answering model named: one answer keeps one explicit outcome.
    named = post(gateway, {"request_id": request_id, "score": 0.2, "model": "fake-ok"})
    assert named.status_code == 200 and named.json()["id"] == first.json()["id"], named.text
    blank = post(gateway, {"request_id": request_id, "score": 0.3, "model": ""})  # "" as before: the answer
    assert blank.status_code == 200 and blank.json()["id"] == first.json()["id"], blank.text
    [row] = feedback_rows(gateway.db_path, request_id)
    assert (row["model"], row["score"]) == ("fake-ok", 0.3)
    # Read as the served answer's outcome by the off-policy and A/B readers.
    assert served_feedback([_fb(row)], "fake-ok", "quality").explicit == 0.3

    unknown = post(gateway, {"request_id": request_id, "score": 0.5, "model": "nope-123"})
    assert_error(unknown, 400, param="model")
    assert "fake-ok" in unknown.json()["error"]["message"] and "nope-###" in unknown.json()["error"]["message"]
    assert [r["model"] for r in feedback_rows(gateway.db_path, request_id)] == ["fake-ok"]


def test_clients_cannot_replace_the_gateways_own_judge_rows(upstream: FakeUpstream, tmp_path: Path) -> None:
    """A request the gateway compares (or a ratings workflow answers) gets the gateway's own ``judge``
    rows under ``quality``: a client's judge row there would replace a verdict, so it is a 400 naming
    ``source``; under another metric, and on requests the gateway does not judge, clients post ``judge``."""
    config = gateway_config(upstream, KEYS)
    config["backends"][0]["models"] += [
        {"name": "f-big", "upstream_name": "ok"}, {"name": "f-small", "upstream_name": "ok"},
        {"name": "biased", "upstream_name": "always-a"}, {"name": "rater", "upstream_name": "rater"},
    ]
    config["routes"].append({"name": "compared", "policy": "rules", "cost_quality": {
        "signal": "difficulty", "strong": "f-big", "weak": "f-small", "threshold": 0.5},
        "compare": {"share": 1.0, "judge": "biased"}})
    config["workflows"] = [{"name": "rated", "kind": "ratings", "candidates": ["f-big", "f-small"], "judge": "rater"}]
    config["classifiers"] = {"encoder": "static"}
    proc = GatewayProcess(config, tmp_path).start(timeout=60)
    client = OpenAI(base_url=proc.base_url, api_key=KEYS["team-a"], max_retries=0, timeout=30)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="compared", messages=MESSAGES, extra_headers={"x-pointsman-threshold": "0"})
        compared, served = raw.headers["x-pointsman-request-id"], raw.headers["x-pointsman-model"]
        assert served == "f-big"

        def verdicts() -> dict[str, float]:
            rows = [r for r in feedback_rows(proc.db_path, compared) if r["source"] == "judge"]
            return {r["model"]: r["score"] for r in rows}

        eventually(lambda: set(verdicts()) == {"f-big", "f-small"}, "the comparison's judge rows", timeout=20)
        before = verdicts()
        for model in ("f-big", "f-small", None):
            body = {"request_id": compared, "score": 1.0 - before["f-big"], "source": "judge"}
            assert_error(post(proc, {**body, **({"model": model} if model else {})}), 400, param="source")
        assert verdicts() == before, "a client replaced the gateway's verdict"
        elsewhere = post(proc, {"request_id": compared, "score": 0.4, "source": "judge", "metric": "judge_quality"})
        assert elsewhere.status_code == 200 and elsewhere.json()["model"] == "f-big", elsewhere.text
        assert post(proc, {"request_id": compared, "thumbs": "up"}).status_code == 200

        rated = client.chat.completions.with_raw_response.create(model="ratings/rated", messages=MESSAGES)
        rated_id = rated.headers["x-pointsman-request-id"]
        assert_error(post(proc, {"request_id": rated_id, "score": 1.0, "source": "judge"}), 400, param="source")

        plain = serve(proc)  # not compared, not rated: the gateway writes no judge rows on it
        ok = post(proc, {"request_id": plain, "score": 0.9, "source": "judge"})
        assert ok.status_code == 200 and ok.json()["model"] == "fake-ok", ok.text
    finally:
        assert proc.terminate() == 0
    assert verdicts() == before
    assert {(r["metric"], r["source"], r["model"]) for r in feedback_rows(proc.db_path, compared)} == {
        ("quality", "judge", "f-big"), ("quality", "judge", "f-small"),  # the gateway's, as it wrote them
        ("judge_quality", "judge", "f-big"), ("quality", "user", "f-big"),  # the client's
    }


# --- ids no gateway issues read the same on every store ---------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_request_id_holding_nul_is_a_404_on_either_store(upstream: FakeUpstream, tmp_path: Path, kind: str) -> None:
    """PostgreSQL text cannot hold U+0000: looking such an id up raised, and the feedback was answered
    503 store_unavailable with Retry-After (a client retrying it for ever, the unavailable count rising)
    where SQLite answered 404. No issued id holds one: a 404 on both, and nothing is stored."""
    config = gateway_config(upstream, KEYS)
    config["feedback"] = {**config["feedback"], "recheck_after": 0.05}
    with contextlib.ExitStack() as stack:
        if kind == "postgres":
            config["store"] = {"kind": "postgres", "dsn": stack.enter_context(sync_pg_schema())}
        proc = GatewayProcess(config, tmp_path).start()
        stack.callback(proc.terminate)
        request_id = serve(proc)
        for odd in (request_id + "\x00", request_id[:8] + "\x00" + request_id[8:], "\x00"):
            assert_error(post(proc, {"request_id": odd, "score": 1.0}), 404, "request_not_found", "request_id")
        assert post(proc, {"request_id": request_id, "score": 1.0}).status_code == 200  # the store still answers
        metrics = httpx.get(proc.url + "/metrics", timeout=30).text
        assert 'pointsman_feedback_total{outcome="not_found"} 3.0' in metrics, metrics
        assert 'outcome="unavailable"' not in metrics, metrics
