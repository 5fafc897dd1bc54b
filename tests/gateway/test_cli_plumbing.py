"""The ``pointsman`` command line's own argument handling: what it refuses, with which message and exit code."""

from __future__ import annotations

import builtins
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auth import KeyChecker
from gateway.cli import main
from gateway.config import ApiKey

REPO = Path(__file__).resolve().parent.parent.parent

CONFIG = {
    "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False}, "models": ["m"]}],
    "routes": [{"name": "auto", "model": "m"}],
}


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "store": {"path": str(tmp_path / "d.db")}}))
    # The timeout only stops a gateway that started serving instead of refusing its arguments.
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_a_port_outside_0_to_65535_is_a_usage_error_not_another_port(tmp_path: Path, port: str) -> None:
    # server.port is checked (0-65535) in a config file, but --port went around the check: 70000 served
    # on port 4464 (70000 - 65536) while uvicorn said "running on ...:70000", and -1 exited 3 with
    # "Servname not supported for ai_socktype".
    result = _serve(tmp_path, "--port", port)
    assert result.returncode == 2, result.stderr
    assert "--port" in result.stderr and "0 to 65535" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "running on" not in result.stderr


def test_hash_key_of_nothing_is_a_usage_error_not_a_digest_no_request_can_match(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `echo "$UNSET" | pointsman hash-key -` printed sha256("") and exited 0: a key in auth.api_keys that
    # no client can ever present ("Authorization: Bearer " is a missing key), so every client got a 401.
    for args, stdin in ((["hash-key", ""], ""), (["hash-key", "-"], "\n"), (["hash-key", "-"], "")):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        with pytest.raises(SystemExit) as exited:
            main(args)
        captured = capsys.readouterr()
        assert exited.value.code == 2 and captured.out == "", (args, captured)
        assert "the key is empty" in captured.err


def test_hash_key_digests_the_key_as_the_gateway_reads_it_from_the_header(
    capsys: pytest.CaptureFixture[str]
) -> None:
    # The gateway strips the bearer token before hashing it (HTTP drops a header value's outer white
    # space anyway), so a key pasted with a space or a newline around it had a digest that never matched.
    for pasted in ("sk-team-123", " sk-team-123", "sk-team-123\n", "\tsk-team-123  "):
        assert main(["hash-key", pasted]) == 0
        digest = capsys.readouterr().out.strip()
        checker = KeyChecker([ApiKey(name="team", sha256=digest)])
        assert checker.tenant_for("Bearer sk-team-123") == "team", repr(pasted)


def test_with_json_logs_a_start_up_failure_is_one_json_line_too(tmp_path: Path) -> None:
    # logging.format: json promises one JSON object per line on stderr; the line saying why the gateway
    # would not start (here: a store.path that is a directory) was printed as plain text, which a log
    # pipeline parsing JSON drops or flags: the one line an operator of a crash-looping gateway needs.
    taken = tmp_path / "a-directory"
    taken.mkdir()
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "store": {"path": str(taken)}, "logging": {"format": "json"}}))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "nothing said why the gateway did not start"
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    [fatal] = [e for e in entries if e["level"] == "error"]
    assert "cannot open the decision store" in fatal["message"] and str(taken) in fatal["message"], fatal


@pytest.mark.parametrize("user", [
    {"limits": {"routes": {"auto": {"requests_per_minute": 10}}}},  # rate limits kept in the shared state
    {"routes": [{"name": "auto", "model": "m", "cache": {"mode": "exact"}}]},  # the response cache's entries
], ids=["limits", "cache"])
def test_a_redis_url_option_redis_cannot_read_stops_start_up_with_a_message_not_a_traceback(
    tmp_path: Path, user: dict[str, Any]
) -> None:
    # redis-py reads options from the URL's query (?socket_timeout=5): one it cannot parse raised its
    # ValueError out of the start-up check (limits) or of the app's start-up (cache), so `pointsman serve`
    # died with a traceback (exit 1 or 3) on a config `pointsman check-config` calls ok. The password
    # must not be shown either.
    url = "redis://:SECRET-PW-42@127.0.0.1:1/0?socket_timeout=5s"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        **CONFIG, "store": {"path": str(tmp_path / "d.db")}, **user, "shared_state": {"kind": "redis", "url": url},
    }))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "SECRET-PW-42" not in result.stderr, result.stderr
    assert "shared_state.url" in result.stderr and "socket_timeout" in result.stderr, result.stderr


def test_check_config_refuses_what_serve_would_refuse_before_connecting_to_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # check-config "runs the same pre-flight as serve", starting nothing: it said ok for a shared_state.url
    # option redis-py cannot read and for tracing without the otel extra, both of which stop serve.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "shared_state": {"kind": "redis",
                                                              "url": "redis://127.0.0.1:1/0?socket_timeout=5s"}}))
    assert main(["check-config", str(path)]) == 2
    assert "shared_state.url: Invalid value for 'socket_timeout'" in capsys.readouterr().err

    real_import = builtins.__import__

    def no_sdk(name: str, *args: Any, **kwargs: Any) -> Any:  # the otel extra not installed
        if name.startswith("opentelemetry.sdk"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    path.write_text(yaml.safe_dump({**CONFIG, "tracing": {"enabled": True}}))
    assert main(["check-config", str(path)]) == 0  # installed here
    capsys.readouterr()
    monkeypatch.setattr(builtins, "__import__", no_sdk)
    assert main(["check-config", str(path)]) == 2
    assert "tracing.enabled: OpenTelemetry is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("who", [["--request-id", "psm-0123"], ["--purge-expired"]])
def test_forget_cache_redis_without_a_tenant_is_a_usage_error_not_silently_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], who: list[str]
) -> None:
    # The response cache is forgotten per tenant only (its keys carry a digest of the tenant): with
    # --request-id the Redis URL was accepted and ignored, and the command exited 0 having deleted the
    # stored decision but not the cached answer, which the operator had asked to delete too.
    store = tmp_path / "d.db"
    with pytest.raises(SystemExit) as exited:
        main(["forget", "--store", str(store), *who, "--cache-redis", "redis://127.0.0.1:1/0"])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == "", captured
    assert "--cache-redis" in captured.err and "--tenant" in captured.err


def test_with_json_logs_warnings_about_the_config_itself_are_json_lines_too(tmp_path: Path) -> None:
    # The config is read (and warns: a deprecated key, a shadowed guard) before its logging section is
    # applied: those warnings went out through a plain-text handler, so the first lines of a JSON log
    # were not JSON. They are held until the log is set up, then written in its format.
    taken = tmp_path / "a-directory"  # a store that cannot be opened: the gateway stops right after
    taken.mkdir()
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "store": {"path": str(taken)}, "logging": {"format": "json"},
                                    "server": {"log_prompts": False}}))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]  # every line is JSON
    [warning] = [e for e in entries if "server.log_prompts is deprecated" in e["message"]]
    assert warning["level"] == "warning" and warning["logger"] == "pointsman.config", warning


def test_a_config_that_does_not_load_still_shows_the_warnings_read_before_it_failed(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "server": {"log_prompts": False}, "routes": "not a list"}))
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "server.log_prompts is deprecated" in result.stderr and "routes" in result.stderr, result.stderr
