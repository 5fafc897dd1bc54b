"""The data an A/B report reads: an experiment's served requests (columnar) and its shadow decisions.

Built from the store's rows (:func:`experiment_data`) or directly from arrays (simulations, tests).
One served request is one unit. Its columns:

* ``arm`` and ``created_at``;
* ``error``: a 5xx status or a stream that broke (``stream_error``). Requests the client walked away from
  (``client_disconnected``) are left out entirely: they say nothing about the arm;
* ``cost`` (USD, NaN when unknown) and ``latency`` (ms, NaN when unknown);
* ``strong``: the strong model answered (see :func:`strong_model`);
* ``quality[source]``: per source group, the mean score of that group's feedback on the *served*
  answer (no ``model``, or the model that answered: :mod:`store.outcomes`), NaN when there is none.
  The groups are :data:`QUALITY_SOURCES`; the implicit
  group scores 0 when any implicit signal (re-ask, regenerate, cut at the token limit, upstream
  error) fired on the request and 1 otherwise, so every served request has an implicit score;
* ``compared``: the request was sampled for a counterfactual comparison. Its cost and judge
  feedback include calls made for learning, so its quality and cost are NaN unless the report
  includes compared requests (``--include-compared``). A response-cache hit is left out of quality
  and cost the same way (it cost nothing, and its answer was made for another request).

Shadow decisions (``shadow_of`` set) are never served rows: they are what a shadow arm would have
chosen for a served request, kept apart in :class:`ShadowRows`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from store.outcomes import served_feedback
from store.records import ArmStop, DecisionRecord, FeedbackRecord, LoggedRequest

#: Quality source groups, in the order the primary one is chosen: explicit feedback first.
QUALITY_SOURCES: tuple[str, ...] = ("explicit", "judge", "implicit")
SOURCE_LABELS: dict[str, str] = {
    "explicit": "explicit feedback (user, rule, import)",
    "judge": "judge scores of the served answer",
    "implicit": "share of answers without a re-ask, regeneration, truncation or upstream error",
}


@dataclass(frozen=True)
class ArmSpec:
    """One arm as the experiment's spec declares it."""

    name: str
    weight: float = 0.0
    control: bool = False
    shadow: bool = False
    kind: str | None = None


@dataclass
class ServedRows:
    """Every served request of the experiment, oldest first, one array entry per request."""

    request_id: np.ndarray  # object (str)
    arm: np.ndarray  # object (str)
    created_at: np.ndarray  # float, unix seconds
    error: np.ndarray  # bool
    cost: np.ndarray  # float, NaN unknown
    latency: np.ndarray  # float, NaN unknown
    model: np.ndarray  # object (str | None)
    strong: np.ndarray  # bool
    compared: np.ndarray  # bool
    propensity: np.ndarray  # float, NaN unknown: the arm's probability when the key was assigned
    quality: dict[str, np.ndarray] = field(default_factory=dict)  # source group -> float, NaN none
    # The randomised unit of each request (a prefix of its assignment key's hash; None: the request
    # itself); None as a whole when unknown (rows built from plain arrays).
    unit: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.arm.size)

    def select(self, mask: np.ndarray) -> ServedRows:
        """The rows where ``mask`` is true (same order)."""
        return ServedRows(
            request_id=self.request_id[mask], arm=self.arm[mask], created_at=self.created_at[mask],
            error=self.error[mask], cost=self.cost[mask], latency=self.latency[mask], model=self.model[mask],
            strong=self.strong[mask], compared=self.compared[mask], propensity=self.propensity[mask],
            quality={k: v[mask] for k, v in self.quality.items()},
            unit=None if self.unit is None else self.unit[mask],
        )


@dataclass
class ShadowRows:
    """Shadow decisions: what ``arm`` would have chosen (``model``) for the served request ``served_id``."""

    arm: np.ndarray  # object (str)
    served_id: np.ndarray  # object (str)
    model: np.ndarray  # object (str | None)
    created_at: np.ndarray  # float

    def __len__(self) -> int:
        return int(self.arm.size)


@dataclass
class ExperimentData:
    """An experiment ready to analyse: its arms, served rows, shadow decisions and stops."""

    name: str
    route: str
    arms: list[ArmSpec]
    served: ServedRows
    shadows: ShadowRows
    spec: dict[str, Any] = field(default_factory=dict)
    stops: list[ArmStop] = field(default_factory=list)
    strong_model: str | None = None
    strong_basis: str = "unknown"  # "spec" | "priciest model seen" | "unknown"
    excluded: dict[str, int] = field(default_factory=dict)  # why -> rows left out
    include_compared: bool = False
    metric: str = "quality"

    @property
    def control(self) -> str:
        """The control arm: the spec's ``control`` (a name, or the arm flagged ``control``), else the
        first served arm."""
        named = self.spec.get("control")
        if isinstance(named, str) and any(a.name == named and not a.shadow for a in self.arms):
            return named
        for arm in self.arms:
            if arm.control and not arm.shadow:
                return arm.name
        served = [a.name for a in self.arms if not a.shadow]
        return served[0] if served else ""

    @property
    def served_arms(self) -> list[str]:
        """Served (non-shadow) arm names, control first, then as the spec lists them."""
        names = [a.name for a in self.arms if not a.shadow]
        control = self.control
        return [control, *[n for n in names if n != control]] if control in names else names


def arms_from_spec(spec: Mapping[str, Any]) -> list[ArmSpec]:
    """The arms a registered spec declares (``spec["arms"]``: name, weight, control, shadow, kind)."""
    arms = []
    for raw in spec.get("arms") or []:
        if not isinstance(raw, Mapping) or not raw.get("name"):
            continue
        arms.append(ArmSpec(
            name=str(raw["name"]), weight=float(raw.get("weight") or 0.0), control=bool(raw.get("control")),
            shadow=bool(raw.get("shadow")), kind=None if raw.get("kind") is None else str(raw["kind"]),
        ))
    return arms


def served_quality(
    feedback: Iterable[FeedbackRecord], metric: str, served_model: str | None = None
) -> dict[str, float]:
    """Per source group, the quality of the served answer one request's feedback says (see module doc).

    Rows about the served answer are those with no ``model`` or ``served_model`` (:mod:`store.outcomes`).
    """
    read = served_feedback(feedback, served_model, metric)
    out = {group: value for group, value in (("explicit", read.explicit), ("judge", read.judge)) if value is not None}
    out["implicit"] = 0.0 if read.implicit_failure else 1.0
    return out


def cache_hit(record: DecisionRecord) -> bool:
    """The response cache answered the request (``decision.cache.hit``): no model was called."""
    cache = record.decision.get("cache")
    return isinstance(cache, dict) and cache.get("hit") is True


def unit_of(record: DecisionRecord) -> str | None:
    """The randomised unit the gateway recorded for the request (``decision.experiment.unit``: a
    prefix of its assignment key's hash), or None when each request was its own unit."""
    experiment = record.decision.get("experiment")
    unit = experiment.get("unit") if isinstance(experiment, dict) else None
    return unit if isinstance(unit, str) and unit else None


def is_error(record: DecisionRecord) -> bool:
    """A failure the client saw: a 5xx status or a stream that broke after its 200 (the guardrails'
    definition, ``store.ArmTotals``). A policy's block or an upstream 4xx is the request's answer, not
    a failure of the arm's serving; disconnects are not rows."""
    return record.status >= 500 or record.outcome == "stream_error"


def shadow_choice(record: DecisionRecord) -> str | None:
    """The model a shadow decision chose: its ``model``, else the plan's first candidate."""
    if record.model:
        return record.model
    candidates = record.decision.get("candidates") if isinstance(record.decision, Mapping) else None
    if isinstance(candidates, Sequence) and candidates and not isinstance(candidates, str):
        first = candidates[0]
        return str(first.get("model") if isinstance(first, Mapping) else first)
    chosen = record.decision.get("model") if isinstance(record.decision, Mapping) else None
    return None if chosen is None else str(chosen)


def strong_model(spec: Mapping[str, Any], records: Sequence[DecisionRecord]) -> tuple[str | None, str]:
    """The strong model and where it came from: the spec's ``strong``, else the priciest model seen.

    Priciest: the highest mean cost per token over rows with a cost and tokens (per request when no
    row has tokens); a model with no known cost never counts as the priciest.
    """
    if spec.get("strong"):
        return str(spec["strong"]), "spec"
    per_token: dict[str, list[float]] = {}
    per_request: dict[str, list[float]] = {}
    for r in records:
        if not r.model or r.cost_usd is None:
            continue
        per_request.setdefault(r.model, []).append(r.cost_usd)
        tokens = (r.prompt_tokens or 0) + (r.completion_tokens or 0)
        if tokens > 0:
            per_token.setdefault(r.model, []).append(r.cost_usd / tokens)
    prices = per_token or per_request
    priced = {m: float(np.mean(v)) for m, v in prices.items()}
    if not priced or max(priced.values()) <= 0:
        return None, "unknown"
    return max(priced, key=lambda m: priced[m]), "priciest model seen"


def experiment_data(
    name: str,
    route: str,
    spec: Mapping[str, Any],
    requests: Sequence[LoggedRequest],
    stops: Sequence[ArmStop] = (),
    *,
    include_compared: bool = False,
    metric: str = "quality",
) -> ExperimentData:
    """Columns of an experiment's logged requests (the store's ``experiment_requests`` rows)."""
    served: list[LoggedRequest] = []
    shadows: list[DecisionRecord] = []
    excluded: dict[str, int] = {}
    for item in requests:
        r = item.record
        if r.shadow_of:
            shadows.append(r)
        elif r.outcome == "client_disconnected":
            excluded["client disconnected"] = excluded.get("client disconnected", 0) + 1
        elif not r.experiment_arm:
            excluded["no arm recorded"] = excluded.get("no arm recorded", 0) + 1
        else:
            served.append(item)
    strong, basis = strong_model(spec, [i.record for i in served])
    qualities = [served_quality(i.feedback, metric, i.record.model) for i in served]
    compared = np.array([i.record.compared for i in served], dtype=bool)
    # A cache hit cost nothing and its answer was chosen for another request: like a compared request
    # it would bias cost and quality, so both are left out by default (the request still counts).
    cached = np.array([cache_hit(i.record) for i in served], dtype=bool)
    hide = (compared | cached) & (not include_compared)

    def column(values: Iterable[Any], dtype: Any) -> np.ndarray:
        return np.array(list(values), dtype=dtype)

    quality = {}
    for group in QUALITY_SOURCES:
        q = column((qs.get(group, np.nan) for qs in qualities), float)
        quality[group] = np.where(hide, np.nan, q)
    cost = column((np.nan if i.record.cost_usd is None else i.record.cost_usd for i in served), float)
    rows = ServedRows(
        request_id=column((i.record.request_id for i in served), object),
        arm=column((i.record.experiment_arm for i in served), object),
        created_at=column((i.record.created_at for i in served), float),
        error=column((is_error(i.record) for i in served), bool),
        cost=np.where(hide, np.nan, cost),
        latency=column((np.nan if i.record.latency_ms is None else i.record.latency_ms for i in served), float),
        model=column((i.record.model for i in served), object),
        strong=column((strong is not None and i.record.model == strong for i in served), bool),
        compared=compared,
        propensity=column(
            (np.nan if i.record.arm_propensity is None else i.record.arm_propensity for i in served), float
        ),
        quality=quality,
        unit=column((unit_of(i.record) for i in served), object),
    )
    shadow_rows = ShadowRows(
        arm=column((r.experiment_arm or "?" for r in shadows), object),
        served_id=column((r.shadow_of for r in shadows), object),
        model=column((shadow_choice(r) for r in shadows), object),
        created_at=column((r.created_at for r in shadows), float),
    )
    arms = arms_from_spec(spec)
    known = {a.name for a in arms}
    # Arms seen in the data but missing from the spec (renamed, or spec not registered) still report.
    for arm in dict.fromkeys(rows.arm.tolist()):
        if arm not in known:
            arms.append(ArmSpec(name=str(arm)))
            known.add(arm)
    for arm in dict.fromkeys(shadow_rows.arm.tolist()):
        if arm not in known:
            arms.append(ArmSpec(name=str(arm), shadow=True))
            known.add(arm)
    return ExperimentData(
        name=name, route=route, arms=arms, served=rows, shadows=shadow_rows, spec=dict(spec), stops=list(stops),
        strong_model=strong, strong_basis=basis, excluded=excluded, include_compared=include_compared,
        metric=metric,
    )


def empty_shadows() -> ShadowRows:
    """No shadow decisions."""
    return ShadowRows(np.array([], dtype=object), np.array([], dtype=object), np.array([], dtype=object),
                      np.array([], dtype=float))


def served_rows(
    arm: Sequence[str] | np.ndarray,
    quality: Mapping[str, Sequence[float] | np.ndarray],
    *,
    created_at: Sequence[float] | np.ndarray | None = None,
    error: Sequence[bool] | np.ndarray | None = None,
    cost: Sequence[float] | np.ndarray | None = None,
    latency: Sequence[float] | np.ndarray | None = None,
    model: Sequence[str | None] | np.ndarray | None = None,
    strong: str | None = None,
) -> ServedRows:
    """Served rows from plain arrays (simulations, tests); missing columns are unknown / no error.

    ``quality`` maps source groups to per-request scores (NaN: no score); a missing group is all NaN.
    """
    arms = np.asarray(arm, dtype=object)
    n = arms.size
    nan = np.full(n, np.nan)
    models = np.asarray(model if model is not None else [None] * n, dtype=object)
    return ServedRows(
        request_id=np.array([f"r{i}" for i in range(n)], dtype=object),
        arm=arms,
        created_at=np.asarray(created_at if created_at is not None else np.arange(n), dtype=float),
        error=np.asarray(error if error is not None else np.zeros(n, dtype=bool), dtype=bool),
        cost=np.asarray(cost, dtype=float) if cost is not None else nan.copy(),
        latency=np.asarray(latency, dtype=float) if latency is not None else nan.copy(),
        model=models,
        strong=np.array([strong is not None and m == strong for m in models.tolist()], dtype=bool),
        compared=np.zeros(n, dtype=bool),
        propensity=nan.copy(),
        quality={g: np.asarray(quality[g], dtype=float) if g in quality else nan.copy() for g in QUALITY_SOURCES},
    )
