"""``logging.format: json``: every line the gateway writes is one JSON object, a request's lines carry
its request id, and neither an API key nor prompt text ever reaches the log."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import httpx

from gateway.auth import hash_key
from gateway.config import LoggingConfig
from gateway.errors import PointsmanError
from gateway.logs import JsonFormatter, configure, request_id, scrub
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

CLIENT_KEY = "sk-client-SECRET-0123456789"
UPSTREAM_KEY = "sk-upstream-SECRET-9876543210"
MARKER = "PROMPT-MARKER-7f3a9c"


def test_gateway_writes_json_lines_with_request_ids_and_no_secrets(upstream: FakeUpstream, tmp_path: Path) -> None:
    config = {
        "logging": {"format": "json", "level": "info"},
        "auth": {"api_keys": [{"name": "team", "sha256": hash_key(CLIENT_KEY)}]},
        "retry": {"attempts": 2, "backoff_base": 0.0},
        "backends": [{
            "name": "fake", "base_url": upstream.base_url, "api_key": UPSTREAM_KEY, "health": {"enabled": False},
            "models": [{"name": "fake-ok", "upstream_name": "ok"}, {"name": "fake-500", "upstream_name": "always-500"}],
        }],
        "routes": [{"name": "auto", "model": "fake-ok"}],
    }
    gateway = GatewayProcess(config, tmp_path).start()
    try:
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        messages = [{"role": "user", "content": f"my secret is {MARKER}"}]
        ok = httpx.post(f"{gateway.base_url}/chat/completions", headers=headers, timeout=30,
                        json={"model": "auto", "messages": messages, "user": "json-logs"})
        assert ok.status_code == 200, ok.text
        failed = httpx.post(f"{gateway.base_url}/chat/completions", headers=headers, timeout=30,
                            json={"model": "fake-500", "messages": messages, "user": "json-logs"})
        assert failed.status_code == 502, failed.text
        unauthorised = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                                  headers={"Authorization": "Bearer sk-wrong-SECRET-000000"},
                                  json={"model": "auto", "messages": messages})
        assert unauthorised.status_code == 401
    finally:
        assert gateway.terminate() == 0
    text = gateway.log()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "the gateway logged nothing"
    entries = []
    for line in lines:
        entry = json.loads(line)  # every line is one JSON object
        assert {"ts", "level", "logger", "message"} <= set(entry), entry
        entries.append(entry)
    failed_id = failed.headers["x-pointsman-request-id"]
    mine = [e for e in entries if e.get("request_id") == failed_id]
    assert any(e["logger"] == "pointsman.upstream" for e in mine), mine  # the upstream failure's detail
    [summary] = [e for e in mine if e["logger"] == "pointsman.service"]
    assert failed_id in summary["message"] and (summary["status"], summary["model"]) == (502, "fake-500")
    assert all("color_message" not in e for e in entries)
    assert any(e["logger"].startswith("uvicorn") for e in entries)  # uvicorn's own lines are JSON too
    for secret in (CLIENT_KEY, UPSTREAM_KEY, "sk-wrong-SECRET", MARKER):
        assert secret not in text


def test_json_formatter_masks_credentials_and_drops_prompt_extras() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(include_prompts=False))
    logger = logging.getLogger("pointsman.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    token = request_id.set("req-123")
    try:
        logger.warning("calling with Authorization: Bearer abc.def-ghi and key sk-abcdefghijkl",
                       extra={"headers": {"Authorization": "Bearer xyz", "Accept": "json"}, "prompt": MARKER,
                              "model": "m1"})
    finally:
        request_id.reset(token)
        logger.removeHandler(handler)
    entry = json.loads(out.getvalue())
    assert entry["request_id"] == "req-123" and entry["level"] == "warning" and entry["model"] == "m1"
    assert entry["headers"] == {"Authorization": "[redacted]", "Accept": "json"}
    assert "prompt" not in entry and MARKER not in out.getvalue()
    assert "abc.def-ghi" not in entry["message"] and "sk-abcdefghijkl" not in entry["message"]
    assert scrub("no secrets here") == "no secrets here"


def test_include_prompts_keeps_prompt_extras() -> None:
    formatter = JsonFormatter(include_prompts=LoggingConfig(include_prompts=True).include_prompts)
    record = logging.makeLogRecord({"msg": "x", "levelname": "INFO", "name": "t", "prompt": MARKER})
    assert json.loads(formatter.format(record))["prompt"] == MARKER


def _logged_failure(include_prompts: bool, text_format: bool) -> str:
    """What the configured log prints for an unexpected error whose messages quote a client's text."""
    stream = io.StringIO()
    handler = configure(LoggingConfig(format="text" if text_format else "json", include_prompts=include_prompts),
                        stream)
    try:
        try:
            try:
                int(f"my secret is {MARKER}")  # a builtin error quoting the client's value
            except ValueError as exc:
                raise KeyError(f"{MARKER} as a key") from exc
        except KeyError as exc:
            raise PointsmanError("the gateway's own words", code="internal_error") from exc
    except PointsmanError:
        logging.getLogger("pointsman.test").exception("unhandled error on POST /v1/chat/completions")
    try:
        {}[f"{MARKER} key"]
    except KeyError:
        logging.getLogger("pointsman.test").exception("implicit feedback failed")
    logging.getLogger().removeHandler(handler)
    return stream.getvalue()


def test_logged_tracebacks_withhold_foreign_exception_messages_unless_prompts_are_included() -> None:
    # An unexpected error's traceback is logged by the last-resort middleware (gateway/contain.py) and by
    # every follow-up that must not fail a request: int(value) or a KeyError can quote the prompt.
    for text_format in (True, False):
        logged = _logged_failure(include_prompts=False, text_format=text_format)
        assert MARKER not in logged, logged
        assert "ValueError: [message withheld" in logged and "KeyError: [message withheld" in logged
        assert "the gateway's own words" in logged and "test_json_logs.py" in logged  # own text and frames stay
        assert MARKER in _logged_failure(include_prompts=True, text_format=text_format)


def test_a_line_holding_half_a_surrogate_pair_is_still_one_json_line() -> None:
    """orjson refuses a lone surrogate (a file name or an environment value can hold one); logging then
    printed a 'Logging error' traceback with the record's raw arguments, unmasked, and lost the line."""
    out, errors = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(include_prompts=False))
    logger = logging.getLogger("pointsman.test.json-surrogate")
    logger.addHandler(handler)
    logger.propagate = False
    stderr, sys.stderr = sys.stderr, errors
    try:
        logger.warning("cannot read %s with key sk-abcdefghijkl", "routers-\udce9", extra={"path": "x\ud800"})
    finally:
        sys.stderr = stderr
        logger.removeHandler(handler)
    assert errors.getvalue() == ""
    entry = json.loads(out.getvalue())
    assert entry["message"].startswith("cannot read routers-\udce9") and "sk-abcdefghijkl" not in entry["message"]
    assert entry["path"] == "x\ud800"
