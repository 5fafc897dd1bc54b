"""What a client reads when something fails: the gateway's own words, never the upstream's address or
a library's exception text, and never more than a short, digit-masked echo of what the client sent.

Every fault behaviour of the fake upstream (plus a dead port) is driven through a real gateway,
streamed and not; every client-facing error (OpenAI-shaped JSON bodies and SSE error events) is
checked. The detail a client must not see has to reach the gateway's log instead.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import standard_config
from tests.fakes.upstream import BEHAVIOURS, FakeUpstream
from tests.gatewayproc import GatewayProcess

MESSAGES = [{"role": "user", "content": "hello"}]
CARD = "4111111111111111"
CARD_SPACED = "4111 1111 1111 1111"

# Library internals and exception text: none of it may reach a client.
FORBIDDEN_TEXT = (
    "127.0.0.1", "localhost", "http://", "https://", "aiohttp", "ClientConnector", "ClientPayload",
    "ClientOSError", "ServerDisconnected", "ssl:default", "TransferEncodingError", "ContentLengthError",
    "Errno", "errno", "<", "Traceback", "gaierror", "Connect call failed",
)
EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b")  # OSError, ConnectionResetError, ...

# Behaviours that do not make the gateway fail.
NOT_FAULTS = {"ok", "slow-drip"}
# (behaviour, stream) pairs that show the client no error text at all, so there is nothing to check:
# a streamed request answered 200 with a non-SSE body is passed through as is (no error event).
NO_ERROR_TEXT = {("malformed", True)}


@dataclass
class Setup:
    gateway: GatewayProcess
    ports: dict[str, int] = field(default_factory=dict)  # what the client must never learn


def _config(upstream: FakeUpstream, backup: FakeUpstream) -> dict[str, Any]:
    config = standard_config(upstream, backup)
    # One attempt: every first failure is what the client sees (429 and 500 included), and hangs
    # cost one timeout each. A short total timeout bounds the non-streamed reads of stalled bodies.
    config["retry"] = {"attempts": 1, "backoff_base": 0.01, "backoff_max": 0.05}
    for backend in config["backends"]:
        if "timeouts" in backend:
            backend["timeouts"] = {"connect": 1.0, "first_byte": 1.0, "total": 2.0, "idle": 0.6}
    config["classifiers"] = {"encoder": "static"}
    config["routes"].append({
        "name": "knob",
        "policy": "rules",
        "cost_quality": {"signal": "difficulty", "strong": "backup-ok", "weak": "fake-ok", "threshold": 0.5},
    })
    return config


@pytest.fixture(scope="module")
def setup(
    upstream: FakeUpstream, backup_upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    config = _config(upstream, backup_upstream)
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-errtext")).start(timeout=60)
    dead = next(b for b in config["backends"] if b["name"] == "down")["base_url"]
    ports = {"upstream": upstream.port, "backup": backup_upstream.port,
             "dead": int(re.search(r":(\d+)/", dead).group(1))}  # type: ignore[union-attr]
    yield Setup(proc, ports)
    proc.terminate()


def _leaks(text: str, ports: dict[str, int]) -> list[str]:
    """What in ``text`` a client must not see."""
    found = [bad for bad in FORBIDDEN_TEXT if bad in text]
    found += [f"{name} port {port}" for name, port in ports.items() if re.search(rf"(?<!\d){port}(?!\d)", text)]
    found += [f"exception name {m}" for m in EXCEPTION_NAME.findall(text)]
    return found


def _client_errors(gateway: GatewayProcess, model: str, stream: bool) -> list[str]:
    """Every error text the client receives for one request: a JSON error body, or SSE error events."""
    body = {"model": model, "messages": MESSAGES, "user": uuid.uuid4().hex, "stream": stream}
    errors: list[str] = []
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", f"{gateway.base_url}/chat/completions", json=body
    ) as response:
        raw = response.read()
    if response.status_code != 200:
        error = orjson.loads(raw)
        assert set(error) == {"error"}, raw  # OpenAI's shape, so the message is where a client looks
        errors.append(raw.decode())
    elif stream:
        for line in raw.decode().splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                event = orjson.loads(line[5:])
                if "error" in event:
                    errors.append(line)
    return errors


FAULT_CASES = [
    pytest.param(f"fake-{b}", stream, id=f"{b}-{'stream' if stream else 'json'}")
    for b in BEHAVIOURS if b not in NOT_FAULTS for stream in (False, True) if (b, stream) not in NO_ERROR_TEXT
] + [
    pytest.param("down-model", False, id="dead-port-json"),
    pytest.param("down-model", True, id="dead-port-stream"),
]


@pytest.mark.parametrize(("model", "stream"), FAULT_CASES)
def test_fault_errors_carry_no_upstream_address_or_library_text(setup: Setup, model: str, stream: bool) -> None:
    errors = _client_errors(setup.gateway, model, stream)
    assert errors, f"{model} (stream={stream}) should have failed in front of the client"
    leaks = {text: _leaks(text, setup.ports) for text in errors}
    assert not any(leaks.values()), f"client-facing error text leaks upstream detail: {leaks}"


def test_connect_failure_detail_reaches_the_log(setup: Setup) -> None:
    """The detail a client no longer sees (which replica, what the library said) is in the log."""
    gateway, dead = setup.gateway, setup.ports["dead"]
    assert _client_errors(gateway, "down-model", False)
    deadline = time.monotonic() + 5
    while f"127.0.0.1:{dead}" not in gateway.log():
        if time.monotonic() > deadline:
            tail = "\n".join(gateway.log().splitlines()[-15:])
            raise AssertionError(f"the gateway log does not name the dead replica 127.0.0.1:{dead}:\n{tail}")
        time.sleep(0.05)
    line = next(line for line in gateway.log().splitlines() if f"127.0.0.1:{dead}" in line)
    # The library's own account of the failure (refused connection) is kept for the operator.
    assert re.search(r"connect|refused|Errno", line, re.IGNORECASE), line


# --- client text echoed in errors and stored in decision records --------------------------------


def _card_leaks(text: str) -> list[str]:
    found = [form for form in (CARD, CARD_SPACED) if form in text]
    if CARD in re.sub(r"\D", "", text):
        found.append("the card's digits with separators")
    return found


def _record_leaks(record: dict[str, Any]) -> dict[str, list[str]]:
    return {column: leaks for column, value in record.items()
            if value is not None and (leaks := _card_leaks(str(value)))}


def _post(gateway: GatewayProcess, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
          ) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}{path}", json=body, headers=headers or {}, timeout=30)


def test_unknown_model_with_card_number_is_not_echoed_or_stored(setup: Setup) -> None:
    gateway = setup.gateway
    model = f"{CARD_SPACED} and more text that a client pasted into the model field by mistake"
    response = _post(gateway, "/chat/completions", {"model": model, "messages": MESSAGES})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["status"] == 404
    dry_run = _post(gateway, "/route", {"model": model, "messages": MESSAGES})
    assert dry_run.status_code == 404

    problems = []
    if _card_leaks(response.text):
        problems.append(f"the 404 echoes the card number: {response.text}")
    if _record_leaks(record):
        problems.append(f"the decision record stores the card number: {_record_leaks(record)}")
    if _card_leaks(dry_run.text):
        problems.append(f"POST /v1/route echoes the card number: {dry_run.text}")
    assert not problems, "\n".join(problems)


def test_long_unknown_model_is_echoed_and_stored_bounded(setup: Setup) -> None:
    gateway = setup.gateway
    model = "m" * 9_990 + "-end-model"  # 10,000 characters
    response = _post(gateway, "/chat/completions", {"model": model, "messages": MESSAGES})
    assert response.status_code == 404
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    dry_run = _post(gateway, "/route", {"model": model, "messages": MESSAGES})
    assert dry_run.status_code == 404

    problems = []
    for where, message in (("chat/completions", response.json()["error"]["message"]),
                           ("route", dry_run.json()["error"]["message"])):
        if "-end-model" in message or len(message) >= 500:
            problems.append(f"POST /v1/{where} echoes the model unbounded: a {len(message)}-character message")
    stored = {column: len(str(value)) for column, value in record.items()
              if value is not None and len(str(value)) >= 1000}
    if stored:
        problems.append(f"decision record columns keep the 10,000-character model name: {stored}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("where", ["header", "field"])
def test_bad_threshold_with_card_number_is_not_echoed_or_stored(setup: Setup, where: str) -> None:
    gateway = setup.gateway
    body: dict[str, Any] = {"model": "knob", "messages": MESSAGES}
    headers = {}
    if where == "header":
        headers["x-pointsman-threshold"] = CARD
    else:
        body["pointsman"] = {"threshold": CARD}
    response = _post(gateway, "/chat/completions", body, headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_threshold", response.text
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["status"] == 400 and record["route"] == "knob"

    problems = []
    if _card_leaks(response.text):
        problems.append(f"the 400 echoes the card number: {response.text}")
    if _record_leaks(record):
        problems.append(f"the decision record stores the card number: {_record_leaks(record)}")
    assert not problems, "\n".join(problems)
