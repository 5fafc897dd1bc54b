"""Redis stopped mid-traffic (a private redis-server, never the shared one): every shared feature
behaves as ``shared_state.fail`` documents, answers within a bound (never a hang) and never a 500.

=========  ==================  ============================================================
feature    default             with Redis gone
=========  ==================  ============================================================
limits     open                served unmetered (``closed``: 503 ``shared_state_unavailable``)
budgets    closed              503 ``shared_state_unavailable`` + Retry-After, for keys with a
                               budget (``open``: served unmetered)
knob       open (always)       decided on the replica's own window
sessions   open (always)       decided without stickiness (``sticky: unavailable``)
=========  ==================  ============================================================
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth import hash_key
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.redisproc import PrivateRedis
from tests.shared_state.test_limits_gateway import KEYS, quota_config

BOUND_S = 2.0  # an answer with Redis gone takes at most this long (shared_state.timeout is 0.25 s)


def lost_config(upstream: FakeUpstream, url: str, fail: dict[str, str] | None = None) -> dict[str, Any]:
    config = quota_config(upstream, {"kind": "redis", "url": url, "key_prefix": "lost:", "knob_sync_interval": 0.2,
                                     **({"fail": fail} if fail else {})})
    config["backends"][0]["models"] += [
        {"name": "small-model", "upstream_name": "ok"}, {"name": "big-model", "upstream_name": "ok"},
    ]
    config["classifiers"] = {"encoder": "static"}
    config["routes"].append({
        "name": "smart", "policy": "rules",
        "cost_quality": {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                         "target_strong_share": 0.3, "min_samples": 3},
        "sticky": {"enabled": True, "ttl": 600},
    })
    return config


def _timed(gateway: GatewayProcess, key: str, model: str = "auto", **headers: str) -> tuple[Any, float]:
    sdk = openai.OpenAI(base_url=gateway.base_url, api_key=KEYS[key], max_retries=0, timeout=30)
    started = time.monotonic()
    try:
        reply: Any = sdk.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "Prove that sqrt(2) is irrational."}], max_tokens=16,
            extra_headers=headers)
    except openai.APIStatusError as exc:
        reply = exc
    return reply, time.monotonic() - started


@pytest.mark.timeout(180)
def test_each_feature_fails_as_documented_by_default(upstream: FakeUpstream, tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path).start()
    gateway = GatewayProcess(lost_config(upstream, server.url), tmp_path).start(timeout=60)
    try:
        session = {"x-pointsman-session-id": uuid.uuid4().hex}
        for key, model in (("rpm", "auto"), ("budget", "auto"), ("free", "smart")):
            reply, _ = _timed(gateway, key, model, **session)
            assert not isinstance(reply, openai.APIStatusError), reply
        server.stop()
        for _ in range(3):  # repeatedly: the first call after the loss and the fast-failing ones after it
            limited, took = _timed(gateway, "rpm")
            assert not isinstance(limited, openai.APIStatusError), limited  # limits: open
            assert took < BOUND_S
            budget, took = _timed(gateway, "budget")
            assert isinstance(budget, openai.APIStatusError) and budget.status_code == 503  # budgets: closed
            assert budget.body["code"] == "shared_state_unavailable"  # type: ignore[index]
            assert "API key 'budget'" in budget.message and "shared_state.fail.budgets" in budget.message
            assert budget.response.headers["retry-after"] == "1"
            assert took < BOUND_S
            smart, took = _timed(gateway, "free", "smart", **session)  # knob and sessions: open
            assert not isinstance(smart, openai.APIStatusError), smart
            assert took < BOUND_S
        record = gateway.decision(smart.headers["x-pointsman-request-id"])
        decision = json.loads(record["decision"])
        assert decision["details"]["sticky"] == "unavailable"
        assert decision["details"]["threshold_source"] in ("calibrated", "uncalibrated")
        assert all(r["status"] != 500 for r in gateway.decisions())
        # Redis back: the budget is metered again (within the fail-fast second).
        server.start()
        time.sleep(1.2)
        reply, _ = _timed(gateway, "budget")
        assert not isinstance(reply, openai.APIStatusError), reply
    finally:
        gateway.terminate()
        server.stop()


@pytest.mark.timeout(120)
def test_the_fail_modes_can_be_turned_round(upstream: FakeUpstream, tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path).start()
    config = lost_config(upstream, server.url, fail={"limits": "closed", "budgets": "open"})
    gateway = GatewayProcess(config, tmp_path).start(timeout=60)
    try:
        server.stop()
        limited, took = _timed(gateway, "rpm")
        assert isinstance(limited, openai.APIStatusError) and limited.status_code == 503
        assert "API key 'rpm'" in limited.message and took < BOUND_S
        budget, took = _timed(gateway, "budget")
        assert not isinstance(budget, openai.APIStatusError), budget
        assert took < BOUND_S
    finally:
        gateway.terminate()
        server.stop()


@pytest.mark.timeout(120)
def test_a_key_with_limits_and_a_budget_counts_both_features_unavailable(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    # One reservation asks Redis for the key's rate limit and its budget at once; with Redis gone both
    # features fall back (limits: open) or refuse (budgets: closed), and each is counted.
    server = PrivateRedis(tmp_path).start()
    config = lost_config(upstream, server.url)
    key = "sk-both-0123456789"
    config["auth"]["api_keys"].append({"name": "both", "sha256": hash_key(key), "limits": {"requests_per_minute": 60},
                                       "budgets": [{"period": "day", "usd": 10.0}]})
    gateway = GatewayProcess(config, tmp_path).start(timeout=60)
    try:
        server.stop()
        sdk = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=16)
        assert info.value.status_code == 503 and "API key 'both'" in info.value.message
        text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        counted = {s.labels["feature"]: s.value for family in text_string_to_metric_families(text)
                   for s in family.samples if s.name == "pointsman_shared_state_unavailable_total"}
        assert counted == {"limits": 1.0, "budgets": 1.0}
    finally:
        gateway.terminate()
        server.stop()
