"""The embedded default (``pointsman serve`` with no config) in front of the real SmolLM2 child.

What a client of the gateway sees: requests the model cannot serve are 400s passed through (not 502s
after three retried 500s), a tool-calling follow-up is answered, a streamed context overflow is a 400,
a client that disconnects stops the generation, a killed model child comes back, and a gateway
terminated during start-up leaves no files and no child behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway._llama_child import PARENT_PID_ENV, STATS_PATH
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
EOS = "2"  # SmolLM2's <|im_end|>; a -100 bias on it makes a generation run to max_tokens
READY = re.compile(r"ready at (http://127\.0\.0\.1:\d+)/v1 \(pid (\d+)\)")
RESTARTED = re.compile(r"restarted at (http://127\.0\.0\.1:\d+)/v1 \(pid (\d+)")


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("embedded-local")
    proc = GatewayProcess(None, workdir).start(timeout=180)
    yield proc
    assert proc.terminate() == 0


def child_of(gateway: GatewayProcess) -> tuple[str, int]:
    """The model child's root URL and pid, from the gateway's latest "ready at" log line."""
    matches = READY.findall(gateway.log())
    assert matches, gateway.log()[-3000:]
    url, pid = matches[-1]
    return url, int(pid)


def child_stats(gateway: GatewayProcess) -> dict[str, int]:
    url, _ = child_of(gateway)
    return dict(httpx.get(url + STATS_PATH, timeout=10).json())


def post(gateway: GatewayProcess, body: dict[str, Any], path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(gateway.base_url + path, json=body, timeout=120)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}], **fields}


def children_of(parent: int) -> list[int]:
    """Running llama.cpp children whose parent (by the environment it gave them) is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"_llama_child.py" in cmdline and f"{PARENT_PID_ENV}={parent}".encode() in environ and state != "Z":
            found.append(int(entry))
    return found


def test_tool_call_follow_up_through_the_gateway(embedded: GatewayProcess) -> None:
    messages = [
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    response = post(embedded, chat(messages=messages))
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["choices"][0]["message"]["content"], str)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
         "messages[0].content[1]"),
        ({"temperature": "hot"}, "temperature"),
        ({"tools": "x"}, "tools"),
        ({"n": 2}, "n"),
        ({"n": 2, "stream": True}, "n"),
    ],
)
def test_what_the_model_cannot_take_is_a_400_not_a_502(
    embedded: GatewayProcess, fields: dict[str, Any], param: str
) -> None:
    before = child_stats(embedded)
    response = post(embedded, chat(**fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert child_stats(embedded)["generations_started"] == before["generations_started"]


def test_json_schema_response_format_through_the_gateway(embedded: GatewayProcess) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    response = post(embedded, chat(max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "number", "schema": schema}}))
    assert response.status_code == 200, response.text
    assert isinstance(json.loads(response.json()["choices"][0]["message"]["content"])["answer"], int)


def test_a_streamed_context_overflow_is_a_400(embedded: GatewayProcess) -> None:
    request = chat(messages=[{"role": "user", "content": "hello world " * 10_000}])
    plain = post(embedded, request)
    assert plain.status_code == 400 and plain.json()["error"]["code"] == "context_length_exceeded"
    with httpx.stream("POST", embedded.base_url + "/chat/completions", json={**request, "stream": True},
                      timeout=120) as streamed:
        assert streamed.status_code == 400
        body = json.loads(streamed.read())
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == plain.json()["error"]["message"]


def test_a_client_that_disconnects_stops_the_generation(embedded: GatewayProcess) -> None:
    """Unstreamed, 700 tokens: the client hangs up, the gateway closes its upstream connection, the child stops."""
    before = child_stats(embedded)
    request = json.dumps(
        chat(max_tokens=700, logit_bias={EOS: -100}, messages=[{"role": "user", "content": "Write a story."}])
    ).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(request)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", embedded.port)) as client:
        client.sendall(head + request)
        eventually(lambda: child_stats(embedded)["tokens_generated"] - before["tokens_generated"] >= 5,
                   "generating", timeout=60)
    eventually(lambda: child_stats(embedded)["generations_finished"] > before["generations_finished"],
               "the generation ended", timeout=60)
    after = child_stats(embedded)
    assert after["generations_stopped"] == before["generations_stopped"] + 1, after
    assert after["tokens_generated"] - before["tokens_generated"] < 700


def test_a_killed_model_child_comes_back(embedded: GatewayProcess) -> None:
    """Killed with SIGKILL: restarted on the same port, and the gateway answers from it again."""
    assert embedded.proc is not None
    url, pid = child_of(embedded)
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: RESTARTED.search(embedded.log()), "the restart logged", timeout=90)
    restarted = RESTARTED.search(embedded.log())
    assert restarted is not None and restarted.group(1) == url
    assert children_of(embedded.proc.pid) == [int(restarted.group(2))] != [pid]
    # The gateway may have marked the replica down while it was gone; it answers again eventually.
    eventually(lambda: post(embedded, chat(max_tokens=2)).status_code == 200, "an answer", timeout=90)
    assert "exited unexpectedly with code -9" in embedded.log()


def test_sigterm_during_start_up_leaves_no_files_and_no_child(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    port = GatewayProcess(None, tmp_path).port
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        # While the model child is loading (it was spawned about a second in).
        eventually(lambda: children_of(proc.pid), "the model child", timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    eventually(lambda: not children_of(proc.pid), "the model child gone", timeout=30)
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("pointsman-llama-")]
