"""A shadow arm's backend call keeps the promises of its arm, through a real gateway process, the
response cache and the fake upstream, driven with the openai SDK: its ``budget_usd_per_hour`` holds
whatever the served request was, also when the response cache answered it (no model called, so the
served record has 0 tokens and costs nothing); and the PII its own policy redacts never leaves the
gateway, even when the served arm's policy does not redact it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from tests.experiments.conftest import MESSAGES, backend, key, shadow_script, start, upstream_calls
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

MODELS = {"ctl": "ok", "unpaid": shadow_script("unpaid-after-a-hit"), "careful": shadow_script("careful")}
REDACT = {"name": "redact-pii", "priority": 90, "when": {"signal": "pii", "op": "truthy"},
          "action": {"redact": ["email"]}}


def config(upstream: FakeUpstream) -> dict[str, Any]:
    return {
        "backends": [backend(upstream, MODELS)],
        "retry": {"attempts": 1},
        "routes": [{"name": "cached", "model": "ctl", "cache": {"mode": "exact"}},
                   {"name": "plain", "policy": "rules", "model": "ctl"}],
        "experiments": [
            {"name": "hits", "route": "cached",
             "arms": [{"name": "control", "control": True},
                      {"name": "broke", "shadow": True, "model": "unpaid", "call_backend": True,
                       "budget_usd_per_hour": 0.0}]},
            {"name": "pii", "route": "plain",
             "arms": [{"name": "control", "control": True},
                      {"name": "redacting", "shadow": True, "call_backend": True, "budget_usd_per_hour": 1.0,
                       "policy": {"model": "careful", "rules": [REDACT]}}]},
        ],
    }


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = start(config(upstream), tmp_path_factory.mktemp("shadow-budget"))
    yield proc
    proc.terminate()


def test_a_zero_budget_shadow_never_calls_its_backend_even_after_a_cache_hit(
    gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)
    user = key()
    served = []
    for _ in range(2):  # the same request twice: the second is answered by the response cache
        raw = sdk.chat.completions.with_raw_response.create(model="cached", messages=MESSAGES, user=user)
        assert raw.headers["x-pointsman-arm"] == "hits/control"
        served.append(raw)
    assert served[1].headers["x-pointsman-cache"] == "hit"
    hit = gateway.decision(served[1].headers["x-pointsman-request-id"])
    assert (hit["backend"], hit["prompt_tokens"], hit["cost_usd"]) == ("cache", 0, 0.0)
    for raw in served:
        shadow = gateway.decision(f"{raw.headers['x-pointsman-request-id']}:shadow:broke")
        # The shadow decided (its model is recorded) but a budget of $0 an hour allows no call.
        assert (shadow["model"], shadow["error_type"], shadow["cost_usd"]) == ("unpaid", "skipped_budget", None)
    assert upstream_calls(upstream, MODELS["unpaid"]) == 0


def test_a_shadow_arm_that_redacts_sends_its_model_the_redacted_body(
    gateway: GatewayProcess, upstream: FakeUpstream
) -> None:
    sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)
    user = key()
    raw = sdk.chat.completions.with_raw_response.create(
        model="plain", user=user, messages=[{"role": "user", "content": "Write to jane.roe@acme-corp.com today."}]
    )
    request_id = raw.headers["x-pointsman-request-id"]
    assert raw.headers["x-pointsman-arm"] == "pii/control"
    shadow = gateway.decision(f"{request_id}:shadow:redacting")
    assert (shadow["model"], shadow["status"], shadow["error_type"]) == ("careful", 200, None)
    assert json.loads(shadow["decision"])["redact"] == ["email"]  # the shadow's own plan asks for the redaction
    sent = [b for b in upstream.state.bodies if b.get("user") == user and b.get("model") == MODELS["careful"]]
    assert len(sent) == 1
    assert "jane.roe@acme-corp.com" not in json.dumps(sent[0]) and "[EMAIL]" in sent[0]["messages"][0]["content"]
