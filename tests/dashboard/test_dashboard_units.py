"""The dashboard's pieces without a server: who may read it, the latency percentiles from the store's
histogram, bucket sizes, the always-strong baseline, experiment status and what a decision shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth import hash_key
from gateway.config import AuthConfig, Config
from gateway.dashboard.auth import AdminRequiredError, DashboardAuth
from gateway.dashboard.summary import (
    Baseline,
    build_summary,
    choose_bucket,
    decision_summary,
    experiment_status,
    percentile,
)
from gateway.errors import AuthenticationError
from store import DecisionRecord, SQLiteDecisionStore
from store.traffic_sql import LATENCY_BOUNDS_MS

ADMIN, CLIENT = "sk-admin", "sk-client"


def auth(*, admins: bool, clients: bool) -> DashboardAuth:
    return DashboardAuth(AuthConfig.model_validate({
        "api_keys": [{"name": "app", "sha256": hash_key(CLIENT)}] if clients else [],
        "admin_keys": [{"name": "ops", "sha256": hash_key(ADMIN)}] if admins else [],
    }))


def test_no_key_configured_leaves_the_dashboard_open() -> None:
    open_ = auth(admins=False, clients=False)
    assert not open_.enabled
    assert open_.admin_for(None) is None and open_.admin_for("Bearer anything") is None


def test_admin_keys_are_required_once_any_key_is_configured() -> None:
    both = auth(admins=True, clients=True)
    assert both.admin_for(f"Bearer {ADMIN}") == "ops" and both.admin_for(f"bearer  {ADMIN} ") == "ops"
    for header in (None, "", f"Basic {ADMIN}", "Bearer wrong"):
        with pytest.raises(AuthenticationError):
            both.admin_for(header)
    with pytest.raises(AdminRequiredError) as refused:
        both.admin_for(f"Bearer {CLIENT}")
    assert refused.value.status == 403 and refused.value.to_dict()["error"]["code"] == "admin_key_required"
    # Client keys alone lock the dashboard: there is no admin key to open it with.
    clients_only = auth(admins=False, clients=True)
    assert clients_only.enabled
    with pytest.raises(AdminRequiredError):
        clients_only.admin_for(f"Bearer {CLIENT}")
    with pytest.raises(AuthenticationError):
        clients_only.admin_for(f"Bearer {ADMIN}")
    assert auth(admins=True, clients=False).admin_for(f"Bearer {ADMIN}") == "ops"


def test_percentiles_interpolate_within_the_histogram_bins() -> None:
    assert percentile({}, 0.5) is None
    i100 = LATENCY_BOUNDS_MS.index(100)  # the bin (50, 100]
    assert percentile({i100: 10}, 0.5) == pytest.approx(75.0)
    assert percentile({i100: 10}, 1.0) == pytest.approx(100.0)
    assert percentile({0: 90, i100: 10}, 0.95) == pytest.approx(75.0)
    assert percentile({len(LATENCY_BOUNDS_MS): 3}, 0.5) == LATENCY_BOUNDS_MS[-1]  # above every bound


def test_buckets_cut_a_window_into_at_most_60() -> None:
    assert [choose_bucket(w) for w in (60, 300, 900, 3600, 86400, 30 * 86400)] == [1, 5, 15, 60, 1800, 43200]


def config() -> Config:
    return Config.model_validate({
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "models": [
            {"name": "big", "input_cost_per_mtok": 10, "output_cost_per_mtok": 30},
            {"name": "huge", "input_cost_per_mtok": 20, "output_cost_per_mtok": 60},
            {"name": "small", "input_cost_per_mtok": 1, "output_cost_per_mtok": 2},
        ]}],
        "routes": [
            {"name": "auto", "policy": "rules", "cost_quality": {"strong": "big", "weak": "small"}},
            {"name": "fixed", "model": "small"},
        ],
    })


def test_the_baseline_prices_tokens_at_the_routes_strong_model() -> None:
    baseline = Baseline(config())
    assert baseline.model_for("auto") == "big" and baseline.model_for("fixed") == "huge"  # the dearest
    assert baseline.model_for(None) is None
    assert baseline.cost("auto", 0.001, 1000, 100) == pytest.approx((1000 * 10 + 100 * 30) / 1e6)
    assert baseline.cost("fixed", 0.001, 1000, 100) == pytest.approx((1000 * 20 + 100 * 60) / 1e6)
    assert baseline.cost(None, 0.001, 1000, 100) == 0.001  # a model asked for by name: its own cost


def test_experiment_status() -> None:
    assert experiment_status({"paused": True, "start": 0}, 10) == "paused"
    assert experiment_status({"start": 20}, 10) == "scheduled"
    assert experiment_status({"end": 10}, 10) == "ended"
    assert experiment_status({"start": 5, "end": 20}, 10) == "running"


def test_a_decision_shows_why_but_no_text() -> None:
    record = DecisionRecord(
        request_id="r1", created_at=1.0, endpoint="chat.completions", route="auto", requested_model="auto",
        signals={"difficulty": {"value": 0.71234567, "detail": {"head": "x"}}, "pii": {"value": ["email"]},
                 "quality": {"value": {"big": 0.9, "small": 0.4}}},
        decision={"policy": "rules", "candidates": ["big"], "details": {"score": 0.71, "threshold": 0.5,
                  "rules": ["redact-pii"]}, "cache": {"hit": False}},
        reason="difficulty 0.712 >= threshold 0.500 -> strong model big", model="big", status=502,
        outcome="error", error_type="upstream_error", error_message="upstream said: <the user's words>",
    )
    shown = decision_summary(record)
    assert shown["signals"] == {"difficulty": 0.7123, "pii": ["email"], "quality": {"big": 0.9, "small": 0.4}}
    assert shown["rules"] == ["redact-pii"] and shown["cache_hit"] is False and shown["score"] == 0.71
    assert "error_message" not in shown and "the user's words" not in str(shown)


async def test_build_summary_refuses_a_window_out_of_range_and_aligns_buckets(tmp_path: Path) -> None:
    store = SQLiteDecisionStore(str(tmp_path / "d.db"))
    await store.open()
    try:
        now = 1_700_000_123.4
        await store.write_batch([DecisionRecord(
            request_id="r1", created_at=now - 1, endpoint="chat.completions", route="auto", requested_model="auto",
            model="small", status=200, prompt_tokens=1000, completion_tokens=100, cost_usd=0.0012, latency_ms=40.0,
        )])
        for outside in (5, 59.9, 30 * 86400 + 1, float("inf"), float("nan")):  # no silent clamp
            with pytest.raises(ValueError, match="window"):
                await build_summary(store, config(), None, outside, now=now)
        data = await build_summary(store, config(), None, 60, now=now)
        assert data["window"] == 60.0 and isinstance(data["window"], float)
        assert data["bucket_seconds"] == 1 and len(data["series"]["t"]) == 60
        assert data["since"] % 1 == 0 and data["since"] <= now < data["since"] + 60
        assert data["totals"]["requests"] == 1 and data["series"]["requests"][-2] == 1
        assert data["totals"]["baseline_cost_usd"] == pytest.approx(0.013)
        assert data["router"] is None and data["experiments"] == [] and data["recent"][0]["request_id"] == "r1"
    finally:
        await store.close()
