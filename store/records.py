"""The decision record: one row per request the gateway answered (or refused).

This is a user-facing contract (DESIGN.md "Decision record"): evals replay and join feedback on it.
Fields that hold structures (signals, decision) are JSON-encoded text in both SQLite and PostgreSQL
(jsonb there), so one schema serves the embedded default and many-replica deployments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class DecisionRecord:
    """What was asked, what was decided and why, and how it went."""

    request_id: str
    created_at: float  # unix seconds when the request arrived
    endpoint: str  # "chat.completions", "completions", "embeddings"
    route: str | None  # virtual route name, or None when a concrete model was requested
    requested_model: str | None
    tenant: str | None = None
    stream: bool = False
    signals: dict[str, Any] = field(default_factory=dict)
    decision: dict[str, Any] = field(default_factory=dict)  # the plan: candidates, policy, ...
    reason: str = ""
    model: str | None = None  # the model that answered (or was last tried)
    backend: str | None = None
    replica: str | None = None
    status: int = 0  # HTTP status the client saw (200 even when a stream later failed)
    outcome: str = "ok"  # ok | error | client_disconnected | stream_error
    error_type: str | None = None
    error_message: str | None = None
    attempts: int = 0  # upstream requests made, retries and fallbacks included
    latency_ms: float | None = None
    ttft_ms: float | None = None
    overhead_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    experiment_arm: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Column order shared by every store implementation.
COLUMNS: tuple[str, ...] = tuple(DecisionRecord.__dataclass_fields__)
JSON_COLUMNS: frozenset[str] = frozenset({"signals", "decision"})
