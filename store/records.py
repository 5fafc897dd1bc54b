"""The records the store keeps: decisions, the conversations behind them, and feedback on them.

The decision record is a user-facing contract (DESIGN.md "Decision record"): evals replay and join
feedback on it. Fields that hold structures (signals, decision) are JSON-encoded text in both SQLite
and PostgreSQL (jsonb there), so one schema serves the embedded default and many-replica deployments.

A field marked ``metadata={"column": False}`` is not a ``decisions`` column: it travels with the
record to the store, which writes it elsewhere (the conversation and a workflow's sub-calls go to
their own tables, in the same transaction as the decision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: Where a piece of feedback came from. ``implicit`` is recorded by the gateway itself (a re-ask,
#: a regeneration, a truncated answer, an upstream error); clients may send the other four.
FEEDBACK_SOURCES: tuple[str, ...] = ("user", "judge", "rule", "import", "implicit")


@dataclass(slots=True)
class ConversationRecord:
    """What a route keeps of a request's conversation for retraining: its embedding (with the
    encoder that made it) and, only when the route opts in, its text until ``expires_at``."""

    request_id: str
    created_at: float
    tenant: str | None = None
    encoder_id: str | None = None  # e.g. "static:<version>"; embeddings of different encoders never mix
    embedding: bytes | None = None  # float32 little-endian
    text: str | None = None  # JSON of the messages, only when the route opts in
    expires_at: float | None = None  # unix seconds after which ``text`` is deleted (retention)


@dataclass(slots=True)
class SubCallRecord:
    """One model call a workflow made for a request (``request_id`` is the parent request's id).

    ``index`` orders the sub-calls of one request (the order they started in); ``step`` names what
    the call was for (a cascade stage, ``sample``, a fusion ``candidate``, ``judge``, ``fuser``,
    ``verifier``, a graph step); ``model`` is the model that answered (a fallback, if one did);
    ``confidence`` is the cascade's confidence in the answer, when it was scored; ``outcome`` is
    ``ok``, ``error``, ``timeout``, ``cancelled`` or ``capped`` (not made: a cap was reached).
    """

    request_id: str
    index: int
    workflow: str
    step: str
    model: str | None = None
    backend: str | None = None
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    confidence: float | None = None
    outcome: str = "ok"
    error: str | None = None
    created_at: float = 0.0
    tenant: str | None = None


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
    router_version: str | None = None  # registry version of the router heads that decided
    # Probability the served choice had under the policy; None when the choice was not randomised.
    propensity: float | None = None
    # A workflow's tree: kind, name, steps, which step answered, escalated, caps hit, total cost.
    workflow: dict[str, Any] | None = None
    # The experiment the request was in (``experiment_arm`` names its arm), or None.
    experiment: str | None = None
    # A shadow arm's decision is its own row: ``request_id`` "<served id>:shadow:<arm>", and this
    # field holds the served request's id. None for every served request.
    shadow_of: str | None = None
    # Probability of ``experiment_arm`` when the request's key was assigned (adaptive allocation
    # changes it over time; the offline estimators weight by it).
    arm_propensity: float | None = None
    # The request was sampled for a counterfactual comparison (its cost and judge feedback then
    # include calls made for learning, not serving: A/B reports leave it out by default).
    compared: bool = False
    # The OpenTelemetry trace the request was served in (32 hex digits), when tracing is on.
    trace_id: str | None = None
    # Not a column: written to the conversations table with the decision, in one transaction.
    conversation: ConversationRecord | None = field(default=None, metadata={"column": False})
    # Not a column: a workflow's sub-calls, written to the subcalls table in the same transaction
    # (an immutable default: most records have none, and the request path allocates nothing for it).
    subcalls: Sequence[SubCallRecord] = field(default=(), metadata={"column": False})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class FeedbackRecord:
    """An outcome attached to a request: ``score`` in [0, 1] under ``metric``.

    One row per (request_id, metric, source, model): writing the same key again replaces the row.
    ``model`` is the model the feedback is about: the served one's name by default (rows written before
    that default, and feedback on a request no model answered, have "" for the served answer), or the
    other model of a comparison. ``label`` is what the client sent when it sent a label or thumbs.
    """

    request_id: str
    score: float
    metric: str = "quality"
    source: str = "user"
    model: str = ""
    label: str | None = None
    comment: str | None = None
    tenant: str | None = None
    created_at: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    #: When the request was issued (its decision's ``created_at``), for the tombstone of a tenant forgotten
    #: since; not stored. None: unknown (the store reads its decision's, else ``created_at``).
    issued_at: float | None = field(default=None, compare=False)


@dataclass(slots=True)
class ExperimentRow:
    """An experiment as the gateways registered it: its route and normalised spec (arms with their
    weights, which arm is control, which are shadows, the assignment key, start/end, paused)."""

    name: str
    route: str
    spec: dict[str, Any]
    updated_at: float


@dataclass(slots=True)
class ArmStop:
    """An experiment arm stopped by a guardrail (or an operator): its traffic goes to control on
    every replica from then on."""

    experiment: str
    arm: str
    reason: str
    detail: dict[str, Any]
    stopped_at: float
    replica: str | None = None


@dataclass(slots=True)
class ArmTotals:
    """One arm's served requests of an experiment, aggregated in the store (every replica's rows):
    what a guardrail tests. ``errors``: a 5xx status or a stream that broke after its 200 (a policy's
    block or an upstream 4xx is the request's answer, not a failure); cost sums over the
    ``cost_requests`` rows that have a cost."""

    arm: str
    requests: int = 0
    errors: int = 0
    cost_requests: int = 0
    cost_sum: float = 0.0
    cost_sq_sum: float = 0.0
    latency_requests: int = 0


@dataclass(slots=True)
class ArmOutcomes:
    """One arm's outcomes under one metric, aggregated in the store: ``outcomes`` served requests whose
    feedback gives an outcome (:meth:`store.outcomes.ServedFeedback.outcome` with the judge), and the sum
    of those outcomes clamped to [0, 1]. What adaptive allocation reads, with :class:`ArmTotals`'s costs."""

    arm: str
    outcomes: int = 0
    quality_sum: float = 0.0


@dataclass(slots=True)
class TrafficBucket:
    """Served requests of one (time bucket, route, model) in a :class:`TrafficWindow`: ``bucket`` is
    the index of its ``bucket_seconds``-wide slice from the window's start; ``route`` is None for a
    concrete model requested by name. ``errors``: a 5xx or a stream that broke after its 200;
    ``rejected``: a 4xx (a policy block, a bad request, a rate limit). Sums skip missing values
    (``latency_requests`` rows had a latency); ``cache_lookups`` rows looked the response cache up
    (``decision.cache.result`` hit or miss; a bypass is not a lookup), ``cache_hits`` of them hit."""

    bucket: int
    route: str | None
    model: str | None
    requests: int = 0
    errors: int = 0
    rejected: int = 0
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_requests: int = 0
    latency_sum_ms: float = 0.0
    cache_lookups: int = 0
    cache_hits: int = 0


@dataclass(slots=True)
class LatencyBin:
    """How many served requests of a time bucket had a latency in bin ``bin`` (an index into
    ``store.traffic_sql.LATENCY_BOUNDS_MS``; the last bin is everything above its last bound)."""

    bucket: int
    bin: int
    count: int


@dataclass(slots=True)
class TrafficWindow:
    """The decision log's served traffic since ``since``, aggregated in the store (every replica's
    rows) per ``bucket_seconds``: what the dashboard draws."""

    since: float
    bucket_seconds: float
    buckets: list[TrafficBucket] = field(default_factory=list)
    latency: list[LatencyBin] = field(default_factory=list)


@dataclass(slots=True)
class LoggedRequest:
    """A decision joined with its conversation (when kept) and every piece of feedback on it."""

    record: DecisionRecord
    conversation: ConversationRecord | None
    feedback: list[FeedbackRecord]


# Column order shared by every store implementation (fields marked column=False excluded).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(DecisionRecord) if f.metadata.get("column", True))
JSON_COLUMNS: frozenset[str] = frozenset({"signals", "decision", "workflow"})
