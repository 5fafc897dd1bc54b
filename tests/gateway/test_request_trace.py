"""The decision record is built from the request's running state once, when the request is finished:
every field the record stores must come from the trace, or a new field would silently be lost."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gateway.trace import RequestTrace
from store.records import ConversationRecord, DecisionRecord, SubCallRecord

#: Record fields the trace does not carry: measured when the record is built, or never set for a
#: served request (a shadow arm's row is built by the experiment runtime).
MEASURED = {"latency_ms", "overhead_ms"}
NOT_SERVED = {"shadow_of"}


def _distinct_value(name: str, default: Any) -> Any:
    """A value for field ``name`` unlike its default (so a field left behind shows)."""
    if name == "conversation":
        return ConversationRecord(request_id="r", created_at=1.0, embedding=b"\x00" * 4)
    if name == "subcalls":
        return (SubCallRecord(request_id="r", index=0, workflow="w", step="s"),)
    if name == "stream" or name == "compared":
        return True
    if name in ("signals", "decision", "workflow"):
        return {name: 1}
    if name in ("status", "attempts", "prompt_tokens", "completion_tokens"):
        return 7 + len(name)
    if name in ("created_at", "propensity", "arm_propensity", "ttft_ms", "cost_usd"):
        return 0.25 + len(name)
    assert default is None or isinstance(default, str), name
    return f"value of {name}"


def test_the_record_carries_every_field_of_the_running_state() -> None:
    trace = RequestTrace(request_id="req-1", endpoint="chat.completions")
    expected: dict[str, Any] = {}
    for spec in dataclasses.fields(DecisionRecord):
        if spec.name in MEASURED | NOT_SERVED:
            continue
        default = getattr(trace, spec.name)  # AttributeError: a record field the trace does not carry
        value = _distinct_value(spec.name, default)
        assert value != default, spec.name
        setattr(trace, spec.name, value)
        expected[spec.name] = value
    trace.started = time.perf_counter() - 0.5
    trace.upstream_seconds = 0.4
    trace.headers_sent_at = trace.started + 0.45

    record = trace.record()

    assert {name: getattr(record, name) for name in expected} == expected
    assert record.shadow_of is None
    assert record.latency_ms is not None and record.latency_ms >= 500.0
    assert record.overhead_ms is not None and 40.0 <= record.overhead_ms <= 60.0  # headers at 450 ms, 400 upstream


def test_a_record_built_is_not_changed_by_what_the_request_does_after() -> None:
    trace = RequestTrace(request_id="req-2", endpoint="chat.completions", status=200)
    record = trace.record()
    trace.status, trace.outcome = 499, "client_disconnected"
    trace.attempts += 1
    assert (record.status, record.outcome, record.attempts) == (200, "ok", 0)
