"""Rate limits and spend budgets, black-box: a gateway subprocess (in-memory quotas), the openai SDK.

What a client sees: a 429 in OpenAI's shape (``rate_limit_exceeded`` / ``budget_exceeded``) naming the
key or model, with ``Retry-After``; ``x-ratelimit-*`` headers on answers. Reservations are settled with the
real usage (so a token limit admits what really fits), from the chunks of a stream without a usage
chunk, and released when the call fails.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.auth import hash_key
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

KEYS = {name: f"sk-{name}-0123456789" for name in ("rpm", "tpm", "budget", "free", "route-a", "route-b", "stream",
                                                   "burst", "tok-reset")}
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def quota_config(upstream: FakeUpstream, shared_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fake models priced high enough that one answer (11 prompt + 7 completion tokens) costs $0.025."""
    config: dict[str, Any] = {
        "auth": {"api_keys": [
            {"name": "rpm", "sha256": hash_key(KEYS["rpm"]), "limits": {"requests_per_minute": 2}},
            {"name": "tpm", "sha256": hash_key(KEYS["tpm"]), "limits": {"tokens_per_minute": 120}},
            {"name": "budget", "sha256": hash_key(KEYS["budget"]), "budgets": [{"period": "day", "usd": 0.1}]},
            {"name": "free", "sha256": hash_key(KEYS["free"])},
            {"name": "route-a", "sha256": hash_key(KEYS["route-a"])},
            {"name": "route-b", "sha256": hash_key(KEYS["route-b"])},
            {"name": "stream", "sha256": hash_key(KEYS["stream"]), "limits": {"tokens_per_minute": 200}},
            {"name": "burst", "sha256": hash_key(KEYS["burst"]), "limits": {"requests_per_minute": 3}},
            {"name": "tok-reset", "sha256": hash_key(KEYS["tok-reset"]), "limits": {"tokens_per_minute": 100}},
        ]},
        "limits": {"routes": {"limited": {"requests_per_minute": 3}}},
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "timeouts": {"connect": 1.0, "first_byte": 2.0, "total": 5.0, "idle": 1.0},
            "models": [
                {"name": "fake-ok", "upstream_name": "ok", "input_cost_per_mtok": 1000.0,
                 "output_cost_per_mtok": 2000.0},
                {"name": "fake-500", "upstream_name": "always-500", "input_cost_per_mtok": 1000.0,
                 "output_cost_per_mtok": 2000.0},
            ],
        }],
        "retry": {"attempts": 1},
        "routes": [{"name": "auto", "model": "fake-ok"}, {"name": "limited", "model": "fake-ok"}],
    }
    if shared_state is not None:
        config["shared_state"] = shared_state
    return config


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(quota_config(upstream), tmp_path_factory.mktemp("gw-quota")).start()
    yield proc
    proc.terminate()


def client(gateway: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=KEYS[key], max_retries=0, timeout=30)


def ask(gateway: GatewayProcess, key: str, model: str = "auto", **extra: Any) -> Any:
    return client(gateway, key).chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=16, **extra
    )


def test_a_key_over_its_request_rate_gets_429_naming_it_with_retry_after(gateway: GatewayProcess) -> None:
    first = ask(gateway, "rpm")
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert ask(gateway, "rpm").headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as info:
        ask(gateway, "rpm")
    error = info.value
    assert error.status_code == 429
    body = error.body
    assert isinstance(body, dict)
    assert body["code"] == "rate_limit_exceeded" and body["type"] == "rate_limit_error"
    assert "API key 'rpm'" in body["message"] and "2 requests per minute" in body["message"]
    assert 1 <= int(error.response.headers["retry-after"]) <= 30  # one request frees every 30 s
    record = gateway.decision(error.response.headers["x-pointsman-request-id"])
    assert record["status"] == 429 and record["error_type"] == "rate_limit_exceeded"
    assert record["tenant"] == "rpm"
    ask(gateway, "free")  # other keys are not limited


def _seconds(value: str) -> float:
    assert value.endswith("s"), value
    return float(value[:-1])


def test_the_429_reports_when_the_bucket_is_full_again_within_the_window(gateway: GatewayProcess) -> None:
    # Three a minute, four at once: the answers' resets are 20, 40, 60 s (one request holds 20 s of the
    # bucket); the refused one took nothing, so its reset is the bucket's (~60 s), not its own 20 s more.
    def one(_: int) -> httpx.Response:
        return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {KEYS['burst']}"},
                          json={"model": "auto", "messages": MESSAGES, "max_tokens": 16})

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(one, range(4)))
    assert sorted(r.status_code for r in replies) == [200, 200, 200, 429]
    served = sorted(_seconds(r.headers["x-ratelimit-reset-requests"]) for r in replies if r.status_code == 200)
    for got, want in zip(served, (20.0, 40.0, 60.0), strict=True):
        assert want - 5 < got <= want
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    reset = _seconds(refused.headers["x-ratelimit-reset-requests"])
    assert served[-1] - 5 < reset <= 60.0  # the bucket's TAT - now, never past the minute window
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert 15 <= int(refused.headers["retry-after"]) <= 20  # one request frees every 20 s


def test_a_token_429_reports_what_is_left_and_a_reset_within_the_window(gateway: GatewayProcess) -> None:
    # 100 tokens a minute: the first request reserves all 100 (~prompt + 90 > 100), settles at its real
    # usage (18); the second needs all 100 again and is refused while 82 are left.
    tokens = client(gateway, "tok-reset").chat.completions
    tokens.create(model="auto", messages=MESSAGES, max_tokens=90)  # settled in the background: 100 or 18 held
    with pytest.raises(openai.RateLimitError) as info:
        tokens.create(model="auto", messages=MESSAGES, max_tokens=90)
    headers = info.value.response.headers
    reset, left = _seconds(headers["x-ratelimit-reset-tokens"]), int(headers["x-ratelimit-remaining-tokens"])
    assert 0 < reset <= 60.0 and headers["x-ratelimit-limit-tokens"] == "100"
    assert 0 <= left < 100 and left == pytest.approx(100 - reset / 0.6, abs=1)  # one token is 0.6 s of bucket


def test_a_route_limit_is_shared_by_every_key(gateway: GatewayProcess) -> None:
    ask(gateway, "route-a", "limited")
    ask(gateway, "route-b", "limited")
    ask(gateway, "route-a", "limited")
    with pytest.raises(openai.RateLimitError) as info:
        ask(gateway, "route-b", "limited")
    assert "model 'limited'" in str(info.value)
    ask(gateway, "route-b", "auto")  # the other route is not


def test_a_token_limit_is_settled_with_the_real_usage(gateway: GatewayProcess) -> None:
    # Reserved: ~prompt (body bytes / 4) + max_tokens 60 = about 80 of 120; used: 11 + 7 = 18. Three fit
    # (18 + 18 + 80 <= 120); without settlement the second would not.
    for _ in range(3):
        reply = client(gateway, "tpm").chat.completions.with_raw_response.create(
            model="auto", messages=MESSAGES, max_tokens=60)
        assert reply.headers["x-ratelimit-limit-tokens"] == "120"
    with pytest.raises(openai.RateLimitError, match="tokens per minute"):
        client(gateway, "tpm").chat.completions.create(model="auto", messages=MESSAGES, max_tokens=110)


def test_a_failed_call_releases_its_reservation(gateway: GatewayProcess) -> None:
    for _ in range(4):  # each reserves ~80 of 200 tokens and gives them back (kept: the third would not fit)
        with pytest.raises(openai.InternalServerError):
            client(gateway, "stream").chat.completions.create(model="fake-500", messages=MESSAGES, max_tokens=60)


def test_a_stream_without_usage_is_settled_from_its_chunks(gateway: GatewayProcess) -> None:
    # Each reserves ~80 of 200 tokens and settles at ~prompt + 6 chunks of text (~25): four fit; without
    # settlement the third would not.
    for _ in range(4):
        stream = client(gateway, "stream").chat.completions.create(
            model="auto", messages=MESSAGES, max_tokens=60, stream=True)
        chunks = list(stream)
        assert all(chunk.usage is None for chunk in chunks)


def test_a_budget_refuses_once_spent_with_retry_after_until_the_period_ends(gateway: GatewayProcess) -> None:
    served = 0
    with pytest.raises(openai.RateLimitError) as info:
        for _ in range(10):  # $0.025 each, ~$0.06 reserved before each: 2-3 fit in $0.10
            ask(gateway, "budget")
            served += 1
    assert 2 <= served <= 4
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "budget_exceeded" and body["type"] == "insufficient_quota"
    assert "API key 'budget'" in body["message"] and "$0.1 per day" in body["message"]
    now = dt.datetime.now(dt.UTC)
    midnight = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    retry = int(info.value.response.headers["retry-after"])
    assert abs(retry - (midnight - now).total_seconds()) < 5
    record = gateway.decision(info.value.response.headers["x-pointsman-request-id"])
    assert record["error_type"] == "budget_exceeded"
    spent = sum(r["cost_usd"] or 0 for r in gateway.decisions() if r["tenant"] == "budget")
    assert spent <= 0.1


def test_metrics_count_refusals(gateway: GatewayProcess) -> None:
    text = httpx.get(f"{gateway.url}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("pointsman_quota_refused_total{")]
    assert any('reason="rate_limit_requests"' in line for line in lines), json.dumps(lines)


def test_limits_of_unknown_routes_are_refused_naming_the_key(upstream: FakeUpstream) -> None:
    from gateway.config import parse_config
    from gateway.errors import ConfigError

    config = quota_config(upstream)
    config["limits"] = {"routes": {"nope": {"requests_per_minute": 1}}}
    with pytest.raises(ConfigError, match=r"limits\.routes\.nope"):
        parse_config(config, env={})
    config = quota_config(upstream)
    config["auth"]["api_keys"][0]["budgets"] = [{"period": "week", "usd": 1}]
    with pytest.raises(ConfigError, match=r"auth\.api_keys\.0\.budgets"):
        parse_config(config, env={})
