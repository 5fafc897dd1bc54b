"""Config loading: ``${VAR}`` substitution, and errors that name the offending key — through the
library (``parse_config``/``load_config``) and through the ``pointsman`` CLI a user runs."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_config, parse_config
from gateway.errors import ConfigError
from tests.gatewayproc import REPO


def _backend(**overrides: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {"name": "main", "base_url": "http://127.0.0.1:9/v1", "models": [{"name": "m1"}]}
    backend.update(overrides)
    return backend


def _error(data: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={} if env is None else env)
    return str(info.value)


# --- ${VAR} substitution -----------------------------------------------------------------------


def test_env_var_is_substituted() -> None:
    config = parse_config({"backends": [_backend(api_key="${UPSTREAM_KEY}")]}, env={"UPSTREAM_KEY": "sk-123"})
    assert config.backends[0].api_key == "sk-123"


def test_env_var_default_used_only_when_unset() -> None:
    data = {"backends": [_backend(api_key="${UPSTREAM_KEY:-sk-default}")]}
    assert parse_config(data, env={}).backends[0].api_key == "sk-default"
    assert parse_config(data, env={"UPSTREAM_KEY": "sk-set"}).backends[0].api_key == "sk-set"


def test_env_var_empty_default_and_set_but_empty() -> None:
    data = {"backends": [_backend(api_key="x${SUFFIX:-}")]}
    assert parse_config(data, env={}).backends[0].api_key == "x"
    assert parse_config(data, env={"SUFFIX": ""}).backends[0].api_key == "x"


def test_env_var_inside_a_longer_string_and_in_lists() -> None:
    data = {"backends": [_backend(base_url=None, replicas=["http://${HOST_A}:8000/v1", "http://${HOST_B:-b.local}/v1"])]}
    config = parse_config(data, env={"HOST_A": "10.0.0.5"})
    assert config.backends[0].replica_urls == ("http://10.0.0.5:8000/v1", "http://b.local/v1")


def test_env_var_substituted_number_is_validated_as_a_number() -> None:
    data = {"backends": [_backend()], "server": {"port": "${PORT:-9123}", "drain_timeout": "${DRAIN}"}}
    config = parse_config(data, env={"DRAIN": "2.5"})
    assert config.server.port == 9123 and config.server.drain_timeout == 2.5
    message = _error(data, env={"DRAIN": "soon"})
    assert "server.drain_timeout" in message


def test_substituted_value_is_not_substituted_again() -> None:
    config = parse_config({"backends": [_backend(api_key="${KEY}")]}, env={"KEY": "${OTHER}", "OTHER": "no"})
    assert config.backends[0].api_key == "${OTHER}"


def test_missing_env_var_without_default_names_the_key_and_the_variable() -> None:
    message = _error({"backends": [_backend(), _backend(name="second", api_key="Bearer ${MISSING_TOKEN}",
                                                        models=[{"name": "m2"}])]})
    assert "backends.1.api_key" in message
    assert "MISSING_TOKEN" in message


def test_load_config_reads_yaml_and_substitutes(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "backends:\n"
        "  - name: main\n"
        "    base_url: ${BASE:-http://127.0.0.1:9/v1}\n"
        "    api_key: \"${KEY}\"\n"
        "    models: [{name: m1}]\n"
        "routes: [{name: auto, model: m1}]\n"
    )
    config = load_config(path, env={"KEY": "sk-file"})
    assert config.backends[0].base_url == "http://127.0.0.1:9/v1"
    assert config.backends[0].api_key == "sk-file"
    assert config.routes[0].model == "m1"


def test_load_config_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, env={})
    # Saved by a Windows editor: UTF-8 with a byte-order mark loads; UTF-16 is named, not a traceback.
    good = "backends: [{name: b, base_url: 'http://127.0.0.1:9/v1', models: [m1]}]\nroutes: [{name: auto, model: m1}]\n"
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbf" + good.encode())
    assert load_config(bom, env={}).routes[0].model == "m1"
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes(good.encode("utf-16"))
    with pytest.raises(ConfigError, match=r"utf16\.yaml: line 1: not UTF-8 text \(byte 0xff\); save the file as UTF-8"):
        load_config(utf16, env={})


# --- validation errors name the key ------------------------------------------------------------


def test_unknown_nested_key_is_named() -> None:
    message = _error({"backends": [_backend(timeouts={"conect": 1.0})]})
    assert "backends.0.timeouts.conect: unknown key" in message


def test_unknown_top_level_key_is_named() -> None:
    message = _error({"backends": [_backend()], "sever": {"port": 1}})
    assert "sever: unknown key" in message


def test_wrong_type_is_named() -> None:
    message = _error({"backends": [_backend(timeouts={"connect": "fast"})]})
    assert "backends.0.timeouts.connect" in message


def test_minilm_bf16_on_the_onnx_runtime_is_named() -> None:
    message = _error(
        {
            "backends": [_backend()],
            "classifiers": {"encoder": "minilm", "minilm_runtime": "onnx", "minilm_dtype": "bfloat16"},
        }
    )
    assert "classifiers" in message and "minilm_runtime: torchscript" in message
    for runtime in ("torchscript", "torch", "auto"):
        ok = parse_config(
            {"backends": [_backend()], "classifiers": {"minilm_runtime": runtime, "minilm_dtype": "bfloat16"}}, env={}
        )
        assert ok.classifiers.minilm_dtype == "bfloat16"
    defaults = parse_config({"backends": [_backend()]}, env={}).classifiers
    assert (defaults.minilm_runtime, defaults.minilm_dtype) == ("auto", "auto")


def test_route_to_unknown_model_is_named() -> None:
    message = _error({"backends": [_backend()], "routes": [{"name": "auto", "model": "gpt-9"}]})
    assert "routes.auto.model" in message and "gpt-9" in message


def test_route_fallback_to_unknown_model_is_named() -> None:
    message = _error({"backends": [_backend()], "routes": [{"name": "auto", "model": "m1", "fallbacks": ["ghost"]}]})
    assert "routes.auto.fallbacks" in message and "ghost" in message


def test_duplicate_model_is_named() -> None:
    message = _error({"backends": [_backend(), _backend(name="other")]})
    assert "backends.other.models" in message and "'m1'" in message and "twice" in message


def test_model_fallback_to_unknown_model_is_named() -> None:
    message = _error({"backends": [_backend(models=[{"name": "m1", "fallbacks": ["ghost"]}])]})
    assert "backends.main.models.m1.fallbacks" in message and "ghost" in message


def test_base_url_and_replicas_both_set_is_named() -> None:
    message = _error({"backends": [_backend(replicas=["http://127.0.0.1:10/v1"])]})
    assert "backends.0" in message and "not both" in message


def test_neither_base_url_nor_replicas_is_named() -> None:
    message = _error({"backends": [_backend(base_url=None)]})
    assert "backends.0" in message and "base_url" in message and "replicas" in message


def test_postgres_without_dsn_is_named() -> None:
    message = _error({"backends": [_backend()], "store": {"kind": "postgres"}})
    assert "store" in message and "store.dsn" in message


def test_non_http_url_is_named() -> None:
    message = _error({"backends": [_backend(base_url="localhost:8000/v1")]})
    assert "backends.0.base_url" in message


def test_every_error_is_reported_at_once() -> None:
    message = _error({"backends": [_backend(timeouts={"conect": 1}, max_concurency=3)]})
    assert "backends.0.timeouts.conect: unknown key" in message
    assert "backends.0.max_concurency: unknown key" in message


def test_a_wrong_shape_says_what_yaml_expected_and_got() -> None:
    message = _error({"backends": [_backend(models={"name": "m1"})], "routes": {"auto": {"model": "m1"}}})
    assert "backends.0.models: expected a list, got a mapping" in message
    assert "routes: expected a list, got a mapping" in message
    assert "expected a mapping (key: value), got a number (3)" in _error({"backends": [_backend(timeouts=3)]})
    assert "tuple" not in message and "dictionary" not in message  # pydantic's Python words stay out


def test_an_unknown_key_names_the_closest_key_of_its_own_section() -> None:
    message = _error({
        "server": {"prot": 8080},
        "backends": [_backend(base_url=None, url="http://127.0.0.1:9/v1", timeouts={"conect": 1})],
        "routes": [{"name": "auto", "policy": "rules", "cost_quality": {"strong": "m1", "weak": "m1", "treshold": 1}}],
    })
    assert "server.prot: unknown key (did you mean port?)" in message
    assert "backends.0.url: unknown key (did you mean base_url?)" in message
    assert "backends.0.timeouts.conect: unknown key (did you mean connect?)" in message
    assert "routes.0.cost_quality.treshold: unknown key (did you mean threshold?)" in message
    assert "store.zzz: unknown key\n" in _error({"backends": [_backend()], "store": {"zzz": 1}}) + "\n"  # no guess


def test_a_model_can_be_given_by_its_name_alone() -> None:
    config = parse_config({"backends": [_backend(models=["m1", {"name": "m2", "upstream_name": "x"}])]}, env={})
    assert [(m.name, m.wire_name) for m in config.backends[0].models] == [("m1", "m1"), ("m2", "x")]
    assert "backends.0.models.0: expected a mapping (key: value), got a number (7)" in _error(
        {"backends": [_backend(models=[7])]}
    )


def test_no_backends_is_an_error() -> None:
    assert "backends" in _error({})


def test_good_config_keeps_values_and_defaults() -> None:
    config = parse_config({
        "backends": [_backend(timeouts={"connect": 1.5}, health={"interval": 3})],
        "routes": [{"name": "auto", "model": "m1"}],
    }, env={})
    backend = config.backends[0]
    assert backend.timeouts.connect == 1.5 and backend.timeouts.idle == 30.0  # given, and the default
    assert backend.health.interval == 3 and backend.health.enabled is True
    assert backend.replica_urls == ("http://127.0.0.1:9/v1",)


# --- the CLI -----------------------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], cwd=REPO, capture_output=True, text=True,
        input=stdin, timeout=timeout,
    )


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_serve_with_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", {"backends": [_backend(timeouts={"conect": 1})]})
    started = time.monotonic()
    result = _cli("serve", "--config", str(bad))
    assert result.returncode == 2, result.stderr
    assert "backends.0.timeouts.conect: unknown key" in result.stderr
    assert time.monotonic() - started < 20, "a bad config must fail at start-up, not after serving"


def test_cli_serve_with_missing_env_var_exits_2(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", {"backends": [_backend(api_key="${POINTSMAN_TEST_UNSET_VAR}")]})
    result = _cli("serve", "--config", str(bad))
    assert result.returncode == 2
    assert "backends.0.api_key" in result.stderr and "POINTSMAN_TEST_UNSET_VAR" in result.stderr


def test_cli_check_config(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.yaml", {"backends": [_backend()], "routes": [{"name": "auto", "model": "m1"}]})
    result = _cli("check-config", str(good))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout
    bad = _write(tmp_path / "bad.yaml", {"backends": [_backend()], "routes": [{"name": "auto", "model": "x"}]})
    result = _cli("check-config", str(bad))
    assert result.returncode == 2 and "routes.auto.model" in result.stderr
    # --config FILE, as serve, route, eval and probe take it
    assert _cli("check-config", "--config", str(good)).returncode == 0
    result = _cli("check-config", "--config", str(bad))
    assert result.returncode == 2 and "routes.auto.model" in result.stderr
    result = _cli("check-config")
    assert result.returncode == 2 and "give the config file" in result.stderr


def test_cli_hash_key() -> None:
    expected = hashlib.sha256(b"sk-team-a").hexdigest()
    result = _cli("hash-key", "sk-team-a")
    assert result.returncode == 0 and result.stdout.strip() == expected
    from_stdin = _cli("hash-key", "-", stdin="sk-team-a\n")
    assert from_stdin.returncode == 0 and from_stdin.stdout.strip() == expected


# --- deprecated keys -------------------------------------------------------------------------------


def test_server_log_prompts_is_carried_over_to_the_switch_the_log_reads(caplog: pytest.LogCaptureFixture) -> None:
    # server.log_prompts was accepted but never read: a config saying true still kept prompts out.
    with caplog.at_level("WARNING", logger="pointsman.config"):
        config = parse_config({"server": {"log_prompts": True}, "backends": [_backend()]}, env={})
    assert config.logging.include_prompts is True
    assert "server.log_prompts is deprecated: use logging.include_prompts" in caplog.text
    assert parse_config({"backends": [_backend()]}, env={}).logging.include_prompts is False
    assert "contradicts logging.include_prompts" in _error(
        {"server": {"log_prompts": True}, "logging": {"include_prompts": False}, "backends": [_backend()]}
    )
