"""Usage, cost and the record of a workflow add up over its sub-calls: the response's usage, the
decision record's totals and tree, the sub-call rows, and the metrics."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.gatewayproc import GatewayProcess
from tests.workflows.conftest import CHEAP_CALL, MESSAGES, STRONG_CALL, key
from tests.workflows.helpers import extension, record, subcalls


def test_usage_and_cost_add_up_across_subcalls(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    raw = sdk.chat.completions.with_raw_response.create(model="cascade/escalate", messages=MESSAGES, user=key())
    completion = raw.parse()
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (22, 14)
    assert completion.usage.total_tokens == 36
    ext = extension(completion)
    assert ext["cost_usd"] == pytest.approx(CHEAP_CALL + STRONG_CALL) and ext["usage_complete"] is True
    assert [s["cost_usd"] for s in ext["steps"]] == [pytest.approx(CHEAP_CALL), pytest.approx(STRONG_CALL)]

    request_id = raw.headers["x-pointsman-request-id"]
    row = record(wf_gateway, request_id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (22, 14)
    assert row["cost_usd"] == pytest.approx(CHEAP_CALL + STRONG_CALL)
    assert row["model"] == "strong" and row["backend"] == "fake" and row["attempts"] == 2
    tree = row["workflow"]
    assert tree["kind"] == "cascade" and tree["name"] == "escalate" and tree["escalated"] is True
    assert tree["answered_by"] == {"position": 1, "step": "strong", "model": "strong", "index": 1}
    assert tree["cost_usd"] == pytest.approx(row["cost_usd"])

    rows = subcalls(wf_gateway, request_id)
    assert [(r["request_id"], r["idx"], r["workflow"], r["step"], r["model"], r["backend"], r["status"],
             r["prompt_tokens"], r["completion_tokens"], r["outcome"]) for r in rows] == [
        (request_id, 0, "escalate", "below", "below", "fake", 200, 11, 7, "ok"),
        (request_id, 1, "escalate", "strong", "strong", "fake", 200, 11, 7, "ok"),
    ]
    assert rows[0]["confidence"] == pytest.approx(0.6977, abs=1e-4) and rows[1]["confidence"] is None
    assert rows[0]["cost_usd"] + rows[1]["cost_usd"] == pytest.approx(row["cost_usd"])
    assert all(r["latency_ms"] > 0 for r in rows)


def test_metrics_count_steps_escalations_and_caps(sdk: OpenAI, wf_gateway: GatewayProcess) -> None:
    sdk.chat.completions.create(model="cascade/escalate", messages=MESSAGES, user=key())
    sdk.chat.completions.create(model="cascade/few-steps", messages=MESSAGES, user=key())
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{wf_gateway.url}/metrics").text)}

    def value(family: str, **labels: str) -> float:
        return sum(s.value for s in families[family].samples
                   if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("pointsman_workflow_steps", workflow="escalate", step="strong", model="strong", outcome="ok") >= 1
    assert value("pointsman_workflow_escalations", workflow="escalate", to_stage="strong") >= 1
    assert value("pointsman_workflow_caps_hit", workflow="few-steps", cap="max_steps") >= 1
    assert value("pointsman_workflow_runs", workflow="few-steps", outcome="capped") >= 1
    # A sub-call's tokens are counted under the model that made them, not the one that answered.
    assert value("pointsman_tokens", model="below", kind="completion") >= 7
