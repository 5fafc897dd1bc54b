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
    assert "backends.second.api_key" in message
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
    assert "backends.main.timeouts.conect: unknown key" in message


def test_unknown_top_level_key_is_named() -> None:
    message = _error({"backends": [_backend()], "sever": {"port": 1}})
    assert "sever: unknown key" in message


def test_wrong_type_is_named() -> None:
    message = _error({"backends": [_backend(timeouts={"connect": "fast"})]})
    assert "backends.main.timeouts.connect" in message


def test_write_timeout_must_be_a_positive_number_of_seconds() -> None:
    assert parse_config({"backends": [_backend()]}, env={}).server.write_timeout == 60.0
    config = parse_config({"backends": [_backend()], "server": {"write_timeout": 0.5}}, env={})
    assert config.server.write_timeout == 0.5
    for bad in (0, -1, "soon", float("inf"), float("nan")):
        message = _error({"backends": [_backend()], "server": {"write_timeout": bad}})
        assert "server.write_timeout" in message, (bad, message)


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
    assert "backends.main" in message and "not both" in message


def test_neither_base_url_nor_replicas_is_named() -> None:
    message = _error({"backends": [_backend(base_url=None)]})
    assert "backends.main" in message and "base_url" in message and "replicas" in message


def test_postgres_without_dsn_is_named() -> None:
    message = _error({"backends": [_backend()], "store": {"kind": "postgres"}})
    assert "store" in message and "store.dsn" in message


def test_non_http_url_is_named() -> None:
    message = _error({"backends": [_backend(base_url="localhost:8000/v1")]})
    assert "backends.main.base_url" in message


def test_every_error_is_reported_at_once() -> None:
    message = _error({"backends": [_backend(timeouts={"conect": 1}, max_concurency=3)]})
    assert "backends.main.timeouts.conect: unknown key" in message
    assert "backends.main.max_concurency: unknown key" in message


def test_a_wrong_shape_says_what_yaml_expected_and_got() -> None:
    message = _error({"backends": [_backend(models={"name": "m1"})], "routes": {"auto": {"model": "m1"}}})
    assert "backends.main.models: expected a list, got a mapping" in message
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
    assert "backends.main.url: unknown key (did you mean base_url?)" in message
    assert "backends.main.timeouts.conect: unknown key (did you mean connect?)" in message
    assert "routes.auto.cost_quality.treshold: unknown key (did you mean threshold?)" in message
    assert "store.zzz: unknown key\n" in _error({"backends": [_backend()], "store": {"zzz": 1}}) + "\n"  # no guess


def test_a_model_can_be_given_by_its_name_alone() -> None:
    config = parse_config({"backends": [_backend(models=["m1", {"name": "m2", "upstream_name": "x"}])]}, env={})
    assert [(m.name, m.wire_name) for m in config.backends[0].models] == [("m1", "m1"), ("m2", "x")]
    assert "backends.main.models.0: expected a mapping (key: value), got a number (7)" in _error(
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
    assert "backends.main.timeouts.conect: unknown key" in result.stderr
    assert time.monotonic() - started < 20, "a bad config must fail at start-up, not after serving"


def test_cli_serve_with_missing_env_var_exits_2(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", {"backends": [_backend(api_key="${POINTSMAN_TEST_UNSET_VAR}")]})
    result = _cli("serve", "--config", str(bad))
    assert result.returncode == 2
    assert "backends.main.api_key" in result.stderr and "POINTSMAN_TEST_UNSET_VAR" in result.stderr


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


# --- careless configs (a hostile review, 2026-12-06) --------------------------------------------------


def test_non_finite_numbers_and_booleans_for_numbers_are_named() -> None:
    # .inf once crashed start-up (drain_timeout) or hung every retried request (backoff); true read as 1.0.
    assert "server.drain_timeout: Input should be a finite number" in _error(
        {"backends": [_backend()], "server": {"drain_timeout": float("inf")}}
    )
    assert "retry.backoff_max: Input should be a finite number" in _error(
        {"backends": [_backend()], "retry": {"backoff_max": float("inf")}}
    )
    route = {"name": "auto", "cost_quality": {"strong": "m1", "weak": "m2", "threshold": True}}
    two = [_backend(models=[{"name": "m1"}, {"name": "m2"}])]
    message = _error({"backends": two, "routes": [route]})
    assert "routes.auto.cost_quality: threshold: expected a number, got true" in message
    route["cost_quality"]["threshold"] = float("nan")
    assert "routes.auto.cost_quality.threshold: Input should be a finite number" in _error(
        {"backends": two, "routes": [route]}
    )
    # A bool is still a bool where a bool belongs, and an int still a number.
    assert parse_config({"backends": [_backend(health={"enabled": False})], "server": {"drain_timeout": 3}}, env={})


def test_ttls_and_waits_beyond_any_use_are_refused() -> None:
    # A 1e300 s TTL made every Redis write fail (stickiness and the cache silently off).
    two = [_backend(models=[{"name": "m1"}, {"name": "m2"}])]
    route = {"name": "auto", "model": "m1", "cache": {"ttl": 1e300}}
    message = _error({"backends": two, "routes": [route]})
    assert "routes.auto.cache.ttl: Input should be less than or equal to 31536000" in message
    assert "shared_state.timeout" in _error({"backends": two, "shared_state": {"kind": "redis", "timeout": 1e9}})


def test_knob_that_could_never_calibrate_is_named() -> None:
    two = [_backend(models=[{"name": "m1"}, {"name": "m2"}])]
    route = {"name": "auto", "cost_quality": {"strong": "m1", "weak": "m2", "target_strong_share": 0.3, "window": 10}}
    message = _error({"backends": two, "routes": [route]})
    assert "min_samples (50) is larger than window (10)" in message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://", "names no host"),
        ("http://127.0.0.1:99999/v1", "is not a valid URL"),
        ("http://exa mple.com/v1", "contains white space"),
        ("http://admin:pw@127.0.0.1:8000/v1\x00", "contains a control character"),
        ("http://[::1/v1", "is not a valid URL"),
        ("http://127.0.0.1:8000/v1?x=1", "cannot carry a query"),
    ],
)
def test_a_base_url_no_request_could_reach_is_refused(url: str, problem: str) -> None:
    message = _error({"backends": [_backend(base_url=url)]})
    assert "backends.main.base_url" in message and problem in message
    assert "pw" not in message


def test_an_upper_case_scheme_is_a_url() -> None:
    config = parse_config({"backends": [_backend(base_url="HTTP://127.0.0.1:8000/v1/")]}, env={})
    assert config.backends[0].base_url == "http://127.0.0.1:8000/v1"


def test_config_errors_never_show_a_secret() -> None:
    env = {
        "UPSTREAM_URL": "htps://admin:Sup3rSecretPW@api.example.com/v1",
        "UPSTREAM_URLS": "http://admin:Sup3rSecretPW@h1/v1",
        "OPENAI_API_KEY": "sk-live-ABCDEF1234567890SECRET",
    }
    data = {
        "backends": [
            _backend(base_url="${UPSTREAM_URL}", timeouts="${OPENAI_API_KEY}"),
            {"name": "b", "replicas": "${UPSTREAM_URLS}", "models": ["x"]},
        ]
    }
    message = _error(data, env=env)
    assert "backends.main.base_url: 'htps://***@api.example.com/v1' is not an http(s) URL" in message
    assert "backends.main.timeouts: expected a mapping (key: value), got a text of 30 characters from an env" in message
    assert "backends.b.replicas: expected a list, got a text of" in message
    assert "Sup3rSecretPW" not in message and "ABCDEF1234567890" not in message
    # Written in the file, a wrong text is still quoted back (it is the operator's own typo).
    assert "got the text 'fast'" in _error({"backends": [_backend(timeouts="fast")]})


def test_store_settings_that_would_write_somewhere_else_are_named() -> None:
    message = _error({"backends": [_backend()], "store": {"kind": "sqlite", "dsn": "postgresql://db/x"}})
    assert "store.dsn is set but store.kind is sqlite" in message
    message = _error({"backends": [_backend()], "store": {"path": "sqlite:///var/lib/pointsman.db"}})
    assert "store.path is a file path, not a store URL" in message


def test_one_key_for_two_tenants_is_named() -> None:
    digest = hashlib.sha256(b"sk-shared").hexdigest()
    keys = [{"name": "team-a", "sha256": digest}, {"name": "team-b", "sha256": digest}]
    assert "is listed for 'team-a' and 'team-b'" in _error({"backends": [_backend()], "auth": {"api_keys": keys}})
    other = hashlib.sha256(b"sk-rotated").hexdigest()
    rotated = [
        {"name": "team-a", "sha256": digest, "limits": {"requests_per_minute": 60}},
        {"name": "team-a", "sha256": other, "limits": {"requests_per_minute": 600}},
    ]
    assert "the keys of 'team-a' have different limits" in _error(
        {"backends": [_backend()], "auth": {"api_keys": rotated}}
    )
    rotated[1]["limits"] = {"requests_per_minute": 60}  # a rotation: two keys, one tenant, one quota
    assert len(parse_config({"backends": [_backend()], "auth": {"api_keys": rotated}}, env={}).auth.api_keys) == 2


def test_a_key_written_twice_and_an_alias_bomb_are_refused(tmp_path: Path) -> None:
    twice = tmp_path / "twice.yaml"
    backends = "backends:\n  - {name: main, base_url: 'http://127.0.0.1:9/v1', models: [m1]}\n"
    twice.write_text(backends + "routes: []\nroutes: []\n")
    with pytest.raises(ConfigError, match=r"found the key 'routes' twice \(first on line 3\)"):
        load_config(twice, env={})
    bomb = tmp_path / "bomb.yaml"
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="expands to more than 2,000,000 values"):
        load_config(bomb, env={})
    assert time.monotonic() - started < 30  # the unguarded walk ran for minutes at full CPU
    merged = tmp_path / "merged.yaml"  # "<<: *defaults" is not a repeated key
    merged.write_text(
        "x-defaults: &d {health: {enabled: false}}\n"
        "backends:\n  - <<: *d\n    name: main\n    base_url: http://127.0.0.1:9/v1\n    models: [m1]\n"
    )
    with pytest.raises(ConfigError, match="x-defaults: unknown key"):
        load_config(merged, env={})
    tagged = tmp_path / "tagged.yaml"  # a !!map tag on a scalar: still "not valid YAML", not a traceback
    tagged.write_text("server: !!map foo\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tagged, env={})


def test_a_builtin_signal_setting_that_nothing_reads_is_refused() -> None:
    two = [_backend(models=[{"name": "m1"}, {"name": "m2"}])]
    route = {"name": "auto", "policy": "rules", "cost_quality": {"strong": "m1", "weak": "m2"},
             "signals": {"pii": {"kinds": ["email"]}}}
    assert "built-in signals take no settings here" in _error({"backends": two, "routes": [route]})


def test_a_rule_on_a_domain_no_classifier_reports_is_named() -> None:
    two = [_backend(models=[{"name": "m1"}, {"name": "m2"}])]
    rule = {"name": "c", "when": {"signal": "domain", "op": "eq", "value": "coding"}, "action": {"route": "m1"}}
    route = {"name": "auto", "policy": "rules", "cost_quality": {"strong": "m1", "weak": "m2"}, "rules": [rule]}
    assert "'coding' is not a value of 'domain' (did you mean 'code'?)" in _error({"backends": two, "routes": [route]})


def test_cli_store_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    for store in ({"kind": "sqlite", "path": str(tmp_path)},
                  {"kind": "postgres", "dsn": "postgresql://bob:Secr3t@127.0.0.1:9/nodb"}):
        bad = _write(tmp_path / "store.yaml", {"backends": [_backend(health={"enabled": False})], "store": store,
                                               "server": {"port": 9}})
        result = _cli("serve", "--config", str(bad))
        assert result.returncode == 2, result.stderr
        assert "store: cannot open the decision store" in result.stderr and "Traceback" not in result.stderr
        assert "Secr3t" not in result.stderr


def test_cli_local_model_name_taken_fails_in_check_config_too(tmp_path: Path) -> None:
    data = {"backends": [_backend(name="local")], "local_model": {"enabled": True}}
    bad = _write(tmp_path / "local.yaml", data)
    for command in (("check-config", str(bad)), ("serve", "--config", str(bad))):
        result = _cli(*command)
        assert result.returncode == 2, result.stderr
        assert "the name 'local' belongs to the embedded local model's backend" in result.stderr


def test_a_redis_url_without_a_host_is_refused() -> None:
    # redis-py reads redis:///x as localhost:6379 db 0: a typo would silently share another Redis.
    for url, problem in (("redis:///nohost", "names no host"), ("redis://h:99999/0", "is not a valid URL")):
        message = _error({"backends": [_backend()], "shared_state": {"kind": "redis", "url": url}})
        assert "shared_state.url" in message and problem in message
    assert parse_config({"backends": [_backend()], "shared_state": {"kind": "redis", "url": "unix:///tmp/r.sock"}},
                        env={}).shared_state.url == "unix:///tmp/r.sock"


def test_routes_and_backends_are_named_alike_by_shape_and_cross_reference_errors() -> None:
    # A shape error said routes.0..., a cross-reference error routes.auto...: one config, two names.
    backend = _backend(models=[{"name": "m1"}, {"name": "m2"}])
    message = _error({"backends": [backend], "routes": [
        {"name": "auto", "cost_quality": {"strong": "m1", "weak": "nope", "threshold": 0.5}},
        {"name": "other", "cost_quality": {"strong": "m1", "weak": "m2", "threshold": 2}},
    ]})
    assert "routes.other.cost_quality.threshold: Input should be less than or equal to 1" in message
    shape_error = _error({"backends": [backend], "routes": [
        {"name": "auto", "cost_quality": {"strong": "m1", "weak": "nope", "threshold": 0.5}}]})
    assert "routes.auto.cost_quality.weak: unknown model 'nope'" in shape_error
    # A name that could not say which item is meant keeps the index.
    twice = _error({"backends": [backend], "routes": [{"name": "r", "model": "m1"}, {"name": "r", "model": "m1",
                                                                                    "sticky": 7}]})
    assert "routes.1.sticky" in twice


def test_the_decision_log_queue_is_bounded_in_bytes_and_configurable() -> None:
    backends = [_backend()]
    assert parse_config({"backends": backends}).store.queue_bytes_limit == 256 * 1024 * 1024
    bounded = parse_config({"backends": backends, "store": {"queue_bytes_limit": 1 << 20}})
    assert bounded.store.queue_bytes_limit == 1 << 20
    assert "store.queue_bytes_limit" in _error({"backends": backends, "store": {"queue_bytes_limit": 0}})


def test_a_guard_rule_below_a_routing_rule_is_warned_about_naming_both(caplog: pytest.LogCaptureFixture) -> None:
    """Rules run from the highest priority down and a route rule ends them: a redact or block rule
    below it never sees the requests it routes (PII goes upstream). That may be meant, so it loads,
    with a warning that says which rule skips which."""
    tools = {"name": "tools-big", "priority": 60, "when": {"signal": "tools", "op": "truthy"},
             "action": {"route": "m1"}}
    pii = {"name": "redact-pii", "priority": 10, "when": {"signal": "pii", "op": "truthy"},
           "action": {"redact": ["email"]}}
    jail = {"name": "no-jailbreaks", "priority": 90, "when": {"signal": "jailbreak", "op": "ge", "value": 0.8},
            "action": {"block": "no"}}

    def load(rules: list[dict[str, Any]]) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="pointsman.config"):
            parse_config({"backends": [_backend()], "routes": [{"name": "auto", "model": "m1", "rules": rules}]},
                         env={})
        return [r.getMessage() for r in caplog.records if r.name == "pointsman.config"]

    assert load([tools, pii, jail]) == [
        "routes.auto.rules.1: redact rule 'redact-pii' (priority 10) runs after route rule 'tools-big' "
        "(priority 60): the requests that rule decides are not redacted; give 'redact-pii' a higher "
        "priority if it must apply to them"
    ]
    assert load([tools, {**pii, "priority": 70}, jail]) == []  # README's order: guards first


def test_drop_params_cannot_drop_what_makes_the_request() -> None:
    model = {"name": "o4-mini", "drop_params": ["temperature", "messages"]}
    message = _error({"backends": [_backend(models=[model])]})
    assert "messages cannot be dropped" in message and "backends.main.models" in message, message
    config = parse_config({"backends": [_backend(models=[{**model, "drop_params": ["temperature"]}])]}, env={})
    assert config.backends[0].models[0].drop_params == ("temperature",)
