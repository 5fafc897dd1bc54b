"""``/dashboard`` and its JSON API through a real gateway process: the admin key is required when keys
are configured (401 without one or with an unknown one, 403 with a client key), the page holds no data
and ships its own script and stylesheet, and the numbers match the traffic sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.dashboard.traffic import ADMIN_KEY, CLIENT_KEY, SECRET, Sent, answer_cost, drive, start
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = start(upstream, tmp_path_factory.mktemp("dashboard-api"))
    yield proc
    proc.terminate()


@pytest.fixture(scope="module")
def sent(gateway: GatewayProcess) -> Sent:
    return drive(gateway, cached=6)


def summary(gateway: GatewayProcess, key: str | None = ADMIN_KEY, **params: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{gateway.url}/dashboard/api/summary", params=params, headers=headers, timeout=10)


@pytest.mark.parametrize(("key", "status", "code"), [
    (None, 401, "invalid_api_key"),
    ("sk-wrong", 401, "invalid_api_key"),
    (CLIENT_KEY, 403, "admin_key_required"),
])
def test_the_api_needs_the_admin_key(gateway: GatewayProcess, key: str | None, status: int, code: str) -> None:
    reply = summary(gateway, key)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "param", "code"}
    assert SECRET not in reply.text
    # Basic auth or a key in the URL is not a way in.
    assert httpx.get(f"{gateway.url}/dashboard/api/summary", params={"key": ADMIN_KEY}).status_code == 401
    assert httpx.get(f"{gateway.url}/dashboard/api/summary", auth=("ops", ADMIN_KEY)).status_code == 401


def test_the_page_holds_no_data_and_ships_its_assets(gateway: GatewayProcess) -> None:
    page = httpx.get(f"{gateway.url}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/dashboard/static/dashboard.js" in page.text and "http" not in page.text.replace("http://www.w3.org", "")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        asset = httpx.get(f"{gateway.url}/dashboard/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind) and len(asset.content) > 1000
        assert "https://" not in asset.text  # nothing from another origin
    missing = httpx.get(f"{gateway.url}/dashboard/static/..%2Fauth.py")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("bad", "code"), [
    ("soon", "invalid_type"), ("nan", "invalid_type"), ("", "invalid_type"), ("1_000", "invalid_type"),
    ("６０", "invalid_type"),  # float() reads other scripts' digits; the API takes plain decimals only
    ("-5", "decimal_below_min_value"), ("0", "decimal_below_min_value"), ("0.0001", "decimal_below_min_value"),
    ("59", "decimal_below_min_value"), ("59.999", "decimal_below_min_value"),
    ("2592000.5", "decimal_above_max_value"), ("2592001", "decimal_above_max_value"),
    ("1e300", "decimal_above_max_value"), ("1e999", "decimal_above_max_value"), ("inf", "invalid_type"),
])
def test_a_window_outside_60_s_to_30_days_is_a_400_naming_it_and_the_range(
    gateway: GatewayProcess, bad: str, code: str,
) -> None:
    reply = summary(gateway, window=bad)  # was: answered for a clamped window (59 -> 60, 1e300 -> 30 days)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "window", code)
    assert "'window'" in error["message"] and "from 60 (1 minute) to 2592000 (30 days)" in error["message"]


@pytest.mark.parametrize(("window", "expected"), [("60", 60.0), ("60.0", 60.0), ("90.5", 90.5), ("2592000", 2592000.0),
                                                  ("6e1", 60.0)])
def test_the_window_comes_back_as_asked_and_always_a_float(gateway: GatewayProcess, window: str,
                                                           expected: float) -> None:
    reply = summary(gateway, window=window)
    assert reply.status_code == 200
    value = reply.json()["window"]
    assert type(value) is float and value == expected
    assert '"window":' + repr(expected) in reply.text.replace(" ", "")  # 60.0 on the wire, never 60


def test_a_window_given_twice_is_a_400_not_whichever_wins(gateway: GatewayProcess) -> None:
    reply = summary(gateway, window=["60", "3600"])  # was: answered for 3600 s, the last one
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == ("window", "invalid_value") and "2 times" in error["message"]


def test_the_numbers_match_the_traffic_sent(gateway: GatewayProcess, sent: Sent) -> None:
    reply = summary(gateway, window=900)
    assert reply.status_code == 200 and reply.headers["cache-control"] == "no-store"
    data = reply.json()
    assert SECRET not in reply.text  # no prompt text, anywhere
    totals = data["totals"]
    assert totals["requests"] == sent.requests == 27
    assert totals["errors"] == 2 and totals["rejected"] == 1
    assert totals["error_rate"] == pytest.approx(2 / 27)
    assert totals["cost_usd"] == pytest.approx(sent.cost)
    assert totals["baseline_cost_usd"] == pytest.approx(sent.baseline)
    assert totals["baseline_cost_usd"] == pytest.approx((12 + 6 + 2) * answer_cost("strong"))  # cache hits: 0 tokens
    assert totals["savings_share"] == pytest.approx(1 - sent.cost / sent.baseline)
    assert totals["prompt_tokens"] == 11 * 20 and totals["completion_tokens"] == 7 * 20  # cache hits: no tokens
    assert totals["latency_p50_ms"] is not None and 0 < totals["latency_p50_ms"] <= totals["latency_p95_ms"]
    assert sent.cache == {"miss": 2, "hit": 4}
    assert (totals["cache_lookups"], totals["cache_hits"]) == (6, 4)
    assert totals["cache_hit_rate"] == pytest.approx(4 / 6)
    routes = {r["route"]: r for r in data["routes"]}
    assert {name: r["models"] for name, r in routes.items()} == sent.by_route
    assert routes["auto"]["baseline_model"] == "strong" and routes["split"]["baseline_model"] == "strong"
    assert routes["(direct)"]["baseline_model"] is None and routes["flaky"]["errors"] == 2
    assert routes["auto"]["cost_usd"] == pytest.approx(3 * answer_cost("strong") + 9 * answer_cost("weak"))
    # The series add up to the totals; the window is cut into at most 60 buckets ending after now.
    series = data["series"]
    assert len(series["t"]) == len(series["requests"]) <= 60 and data["bucket_seconds"] == 15
    assert sum(series["requests"]) == 27 and sum(series["errors"]) == 2
    assert {m: sum(v) for m, v in series["models"].items()} == {
        "strong": 3, "weak": 9 + 6, "broken": 2, "picky": 1, **{m: n for m, n in sent.by_route["split"].items()},
    }
    # The six lookups (miss, miss, then four hits) land in one bucket, or in two when a 15 s boundary falls
    # between them: the per-bucket rates are those of the sequence cut at one point.
    lookups = [False, False, True, True, True, True]
    cuts = [[sum(part) / len(part) for part in (lookups[:k], lookups[k:]) if part] for k in range(6)]
    assert [r for r in series["cache_hit_rate"] if r is not None] in cuts
    assert sum(series["baseline_cost_usd"]) == pytest.approx(sent.baseline)
    assert data["since"] <= data["now"] < data["since"] + len(series["t"]) * data["bucket_seconds"]


def test_live_state_experiments_router_and_recent_decisions(gateway: GatewayProcess, sent: Sent) -> None:
    data = summary(gateway).json()
    assert data["router"]["version"].startswith("bundled-") and data["router"]["reload_failures"] == 0
    (experiment,) = data["experiments"]
    assert experiment["name"] == "ab-alt" and experiment["route"] == "split" and experiment["status"] == "running"
    arms = {a["name"]: a for a in experiment["arms"]}
    assert arms["control"]["control"] and arms["control"]["weight"] == 0.5
    assert {name: arm["requests"] for name, arm in arms.items() if arm["requests"]} == sent.arms
    assert all(arm["stopped"] is None for arm in arms.values())
    recent = data["recent"]
    assert len(recent) == 25 and [r["request_id"] for r in recent] == sent.ids[::-1][:25]  # newest first
    assert [r["cache_hit"] for r in recent if r["route"] == "faq"] == [True] * 4 + [False] * 2
    hard = next(r for r in recent if r["model"] == "strong")
    assert hard["route"] == "auto" and hard["policy"] == "rules" and hard["threshold"] == 0.0
    assert hard["threshold_source"] == "override" and "-> strong model strong" in hard["reason"]
    assert isinstance(hard["signals"]["difficulty"], float) and hard["router_version"] == data["router"]["version"]
    failed = next(r for r in recent if r["route"] == "flaky")
    assert failed["status"] == 502 and failed["outcome"] == "error"
    assert {r["arm"] for r in recent if r["route"] == "split"} == set(sent.arms)


def test_the_admin_key_is_not_a_client_key(gateway: GatewayProcess, sent: Sent) -> None:
    reply = httpx.post(f"{gateway.base_url}/chat/completions", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                       json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 401  # (last in this module: it adds a 401 to the traffic counted above)
