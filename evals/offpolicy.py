"""Off-policy evaluation on logged traffic: how the replayed route would do on requests the gateway
logged, from the outcome of the model that answered alone.

**Logged rows.** A decision record names the model that answered (``model``) and, on a route that
explores (``explore: {epsilon}``), the probability the logging policy gave that model
(``propensity``; None when the choice was not randomised). :func:`outcomes_from_logs` turns
``store.LoggedRequest`` s into :class:`LoggedOutcome` rows. The served answer's outcome under the
metric M (default ``quality``) is, in this order:

1. *explicit* feedback: the mean score of the rows with metric M from the sources
   :data:`EXPLICIT_SOURCES` (``user``, ``rule``, ``import``; one row per source, so the sources weigh
   equally) whose ``model`` is empty or the served model;
2. else *implicit* feedback: :data:`IMPLICIT_SCORE` (0) when the gateway recorded any implicit signal
   on the answer (``source: implicit``; for M = ``quality`` any of its signals ``reask``,
   ``regenerate``, ``finish_length``, ``upstream_error``, each saying the answer did not do; for another
   M, implicit rows under M), because implicit feedback is only ever recorded as a failure;
3. else none: the request is skipped and counted. Judge comparisons (``source: judge``) never count
   here: they score both models against each other and feed the direct estimator (labelled rows).

**Estimators** (:func:`estimates`). The replayed route is a deterministic policy pi(x) in {strong,
weak}. A logged row with served model a, propensity p and outcome r weighs w = 1[a = pi(x)] / p:

- ``ips``: mean(w r), unbiased when p is the logging probability and the other model had p > 0;
- ``snips``: sum(w r) / sum(w), self-normalised: slightly biased, much lower variance;
- ``dr`` (doubly robust): mean(q(x, pi(x)) + w (r - q(x, a))) with q a per-model linear fit of the
  outcome on the replayed knob score, cross-fitted over :data:`DR_FOLDS` folds: unbiased like IPS,
  lower variance when q fits.

The same weights give always-strong and always-weak, the route's strong-call share and cost; the
logging policy's own mean is read, not estimated. ESS = (sum w)^2 / sum w^2. Intervals: percentile
bootstrap over the rows, paired across every number (:func:`compute_offpolicy`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evals.metrics import bootstrap, percentile_ci
from evals.replay import WORKFLOW_EXCLUDED
from store.outcomes import EXPLICIT_SOURCES, served_feedback

DR_FOLDS = 5
NO_PROPENSITY = "not randomised (no propensity)"
POLICIES = ("router", "always_strong", "always_weak")
ESTIMATORS = ("ips", "snips", "dr")


@dataclass
class LoggedOutcome:
    """One logged request with the outcome of the model that answered it."""

    messages: list[dict[str, Any]]  # empty when only the embedding was stored
    served_model: str
    propensity: float | None  # probability the logging policy gave ``served_model``; None: not randomised
    quality: float  # the served answer's outcome under the metric (see the module docstring)
    outcome_from: str  # "explicit" | "implicit"
    source: str
    request_id: str
    route: str | None = None
    cost_usd: float | None = None  # the served call's cost, as logged
    embedding: np.ndarray | None = None
    encoder_id: str | None = None
    domain: str | None = None

    @property
    def has_text(self) -> bool:
        """Whether the conversation itself is known (replay needs it)."""
        return bool(self.messages)

    def text(self) -> str:
        """The conversation's text as the serving encoder sees it (as ``LabelledRequest.text``): the same
        request logged as an outcome and as a labelled row has one key (folds, hold-out, training rows)."""
        from classifiers.conversation import conversation_text
        from evals.labelled import MAX_CHARS

        return conversation_text({"messages": self.messages}, max_chars=MAX_CHARS)


def served_outcome(served: str, feedback: Iterable[Any], metric: str = "quality") -> tuple[float, str] | None:
    """The served answer's outcome and where it came from (``explicit`` | ``implicit``), or None.

    :func:`store.outcomes.served_feedback` reads the rows; judge rows are left out here (see the module doc).
    """
    return served_feedback(feedback, served, metric).outcome(metric, use_judge=False)


def outcomes_from_logs(
    logged: Iterable[Any], *, metric: str = "quality", without_feedback: int = 0
) -> tuple[list[LoggedOutcome], dict[str, int]]:
    """``store.LoggedRequest`` s as logged single-outcome rows; returns the rows and what was skipped
    (``without_feedback``: decisions with no feedback at all, counted by the store and not read).

    The conversation is read as :func:`evals.labelled.requests_from_logs` reads it (the stored text,
    else the stored embedding with its encoder id).
    """
    from evals.labelled import _logged_messages, _signal_value

    rows: list[LoggedOutcome] = []
    skipped: dict[str, int] = defaultdict(int)
    if without_feedback:
        skipped[f"no {metric} feedback on the served answer"] += without_feedback
    for item in logged:
        record, conversation = item.record, item.conversation
        if not record.model:
            skipped["no served model"] += 1
            continue
        outcome = served_outcome(record.model, item.feedback, metric)
        if outcome is None:
            skipped[f"no {metric} feedback on the served answer"] += 1
            continue
        messages = _logged_messages(conversation.text) if conversation is not None and conversation.text else []
        embedding = None
        if conversation is not None and conversation.embedding:
            embedding = np.frombuffer(conversation.embedding, dtype="<f4").astype(np.float32)
        if not messages and embedding is None:
            skipped["neither text nor embedding stored"] += 1
            continue
        rows.append(
            LoggedOutcome(
                messages=messages,
                served_model=record.model,
                propensity=None if record.propensity is None else float(record.propensity),
                quality=outcome[0],
                outcome_from=outcome[1],
                source=f"logs:{record.route}" if record.route else "logs",
                request_id=record.request_id,
                route=record.route,
                cost_usd=None if record.cost_usd is None else float(record.cost_usd),
                embedding=embedding,
                encoder_id=None if conversation is None else conversation.encoder_id,
                domain=_signal_value(record.signals.get("domain")),
            )
        )
    return rows, dict(skipped)


def ips_exclusion(row: LoggedOutcome, strong: str, weak: str) -> str | None:
    """Why a logged row cannot enter the inverse-propensity estimates of the pair, or None."""
    p = row.propensity
    if p is None:
        return NO_PROPENSITY
    if not (math.isfinite(p) and 0.0 < p <= 1.0):
        return "invalid propensity (not in (0, 1])"
    if row.served_model not in (strong, weak):
        return "served a model outside the pair"
    if not row.has_text:
        return "no conversation text (only its embedding was stored)"
    return None


# ----------------------------------------------------------------------------- the table


@dataclass
class LoggedTable:
    """Row-aligned arrays over the logged rows the estimators use."""

    served_strong: np.ndarray  # the logging policy served the strong model
    propensity: np.ndarray  # of the served model
    reward: np.ndarray  # the served answer's outcome
    cost: np.ndarray  # of the served call, in the section's cost basis
    target_strong: np.ndarray  # the replayed route's decision at the configured knob
    scores: np.ndarray  # the replayed knob score (NaN where a rule decided): the DR outcome model's feature
    outcome_from: tuple[str, ...] = ()  # per row, "explicit" | "implicit" (counted in the report)

    def __len__(self) -> int:
        return len(self.reward)


def build_logged_table(
    rows: Sequence[LoggedOutcome],
    decisions: Sequence[Any],
    strong: str,
    weak: str,
    *,
    prices: tuple[float, float] = (0.0, 0.0),
) -> tuple[LoggedTable, dict[str, int], dict[str, str]]:
    """The rows the replayed route decided between the pair; returns (table, excluded reason -> count,
    cost basis). ``decisions`` are :class:`evals.replay.ReplayDecision` s aligned with ``rows``;
    ``prices`` the two models' configured prices (USD per million tokens), used when a row's cost
    was not logged."""
    excluded: dict[str, int] = {}
    kept: list[tuple[LoggedOutcome, Any]] = []
    for row, decision in zip(rows, decisions, strict=True):
        if decision.by == "blocked":
            reason: str | None = "blocked by a rule"
        elif decision.by == "error" or decision.model is None:
            reason = "no decision (policy error)"
        elif decision.by == "workflow":
            reason = WORKFLOW_EXCLUDED
        elif decision.model not in (strong, weak):
            reason = "routed to a model outside the pair"
        else:
            reason = None
        if reason is None:
            kept.append((row, decision))
        else:
            excluded[reason] = excluded.get(reason, 0) + 1
    served_strong = np.array([r.served_model == strong for r, _ in kept], dtype=bool)
    if kept and all(r.cost_usd is not None for r, _ in kept):
        cost = np.array([float(r.cost_usd or 0.0) for r, _ in kept])
        basis = {"kind": "logged", "unit": "USD per request", "text": "the served calls' logged costs"}
    elif any(p > 0 for p in prices):
        from policies.utility import rough_token_count

        tokens = np.array([rough_token_count({"messages": r.messages}) for r, _ in kept], dtype=float)
        cost = tokens * np.where(served_strong, prices[0], prices[1]) / 1e6
        basis = {
            "kind": "prices",
            "unit": "USD per request (estimated)",
            "text": "the configured prices times the request's estimated tokens (some served calls "
            "have no logged cost)",
        }
    else:
        cost = served_strong.astype(float)
        basis = {
            "kind": "share",
            "unit": "strong-call share",
            "text": "no logged costs and no prices in the config: cost is the strong-call share",
        }
    table = LoggedTable(
        served_strong=served_strong,
        propensity=np.array([float(r.propensity or 0.0) for r, _ in kept]),
        reward=np.array([r.quality for r, _ in kept], dtype=float),
        cost=np.asarray(cost, dtype=float),
        target_strong=np.array([d.model == strong for _, d in kept], dtype=bool),
        scores=np.array([d.score if d.by == "knob" and d.score is not None else np.nan for _, d in kept], dtype=float),
        outcome_from=tuple(r.outcome_from for r, _ in kept),
    )
    return table, excluded, basis


# ----------------------------------------------------------------------------- estimators


def outcome_model(t: LoggedTable, *, folds: int = DR_FOLDS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Cross-fitted predictions of the outcome of the strong and of the weak model on every row: per
    model, a least-squares line in the knob score over the other folds' rows served by that model
    (its mean where the score is unknown, or when too few rows), clipped to [0, 1]."""
    n = len(t)
    fold = np.random.default_rng(seed).permutation(n) % max(1, min(folds, n))
    qs, qw = np.zeros(n), np.zeros(n)
    for f in np.unique(fold):
        test, train = fold == f, fold != f
        fallback = float(t.reward[train].mean()) if train.any() else 0.5
        for out, arm in ((qs, t.served_strong), (qw, ~t.served_strong)):
            out[test] = _line(t.scores[train & arm], t.reward[train & arm], t.scores[test], fallback)
    return qs, qw


def _line(x: np.ndarray, y: np.ndarray, at: np.ndarray, fallback: float) -> np.ndarray:
    """``y`` on ``x`` by least squares, predicted ``at`` (the mean of ``y`` where ``at`` or the fit is missing)."""
    mean = float(y.mean()) if len(y) else fallback
    known = np.isfinite(x)
    out = np.full(len(at), mean)
    if known.sum() >= 3 and np.ptp(x[known]) > 0:
        slope, intercept = np.polyfit(x[known], y[known], 1)
        finite = np.isfinite(at)
        out[finite] = intercept + slope * at[finite]
    return np.asarray(np.clip(out, 0.0, 1.0))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def estimates(t: LoggedTable, q_strong: np.ndarray, q_weak: np.ndarray) -> dict[str, float]:
    """Every off-policy number on the rows of ``t`` (flat keys, so a bootstrap resamples them all);
    ``q_strong`` / ``q_weak`` are :func:`outcome_model`'s predictions on the same rows."""
    n = len(t)
    r, a = t.reward, t.served_strong
    q_served = np.where(a, q_strong, q_weak)
    out: dict[str, float] = {}
    for name, target in (
        ("router", t.target_strong),
        ("always_strong", np.ones(n, dtype=bool)),
        ("always_weak", np.zeros(n, dtype=bool)),
    ):
        w = (a == target) / t.propensity
        sw = float(w.sum())
        out[f"{name}.ips"] = float((w * r).mean())
        out[f"{name}.snips"] = _ratio(float((w * r).sum()), sw)
        out[f"{name}.dr"] = float((np.where(target, q_strong, q_weak) + w * (r - q_served)).mean())
        out[f"{name}.weight_mean"] = float(w.mean())
        out[f"{name}.ess"] = _ratio(sw * sw, float((w * w).sum()))
        out[f"{name}.matched"] = float((w > 0).sum())
        # Rows where the policy's choice had probability 0 under logging: IPS cannot see them.
        out[f"{name}.unsupported"] = float(((a != target) & (t.propensity >= 1.0)).sum())
        if name == "router":
            sw_strong = w * target
            out["router.share.replayed"] = float(target.mean())
            out["router.share.ips"] = float(sw_strong.mean())
            out["router.share.snips"] = _ratio(float(sw_strong.sum()), sw)
            out["router.cost.ips"] = float((w * t.cost).mean())
            out["router.cost.snips"] = _ratio(float((w * t.cost).sum()), sw)
    out["logging.quality"] = float(r.mean())
    out["logging.share"] = float(a.mean())
    out["logging.cost"] = float(t.cost.mean())
    for est in ESTIMATORS:
        route, strong, weak = (out[f"{p}.{est}"] for p in POLICIES)
        out[f"router.pgr.{est}"] = (route - weak) / (strong - weak) if strong != weak else float("nan")
        out[f"router-logging.{est}"] = route - out["logging.quality"]
    return out


def _entry(point: Mapping[str, float], boot: Mapping[str, np.ndarray], key: str, level: float) -> dict[str, Any]:
    lo, hi = percentile_ci(boot[key], level) if key in boot else (float("nan"), float("nan"))
    return {"value": point[key], "ci": [lo, hi]}


def compute_offpolicy(
    t: LoggedTable,
    *,
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """The off-policy numbers with bootstrap intervals, JSON-ready (NaN stays float)."""
    if len(t) == 0:
        raise ValueError("no logged row to estimate from")
    q_strong, q_weak = outcome_model(t, seed=seed)
    point = estimates(t, q_strong, q_weak)

    def stat(idx: np.ndarray) -> dict[str, float]:
        sub = LoggedTable(
            served_strong=t.served_strong[idx],
            propensity=t.propensity[idx],
            reward=t.reward[idx],
            cost=t.cost[idx],
            target_strong=t.target_strong[idx],
            scores=t.scores[idx],
        )
        return estimates(sub, q_strong[idx], q_weak[idx])

    boot = bootstrap(stat, len(t), draws, seed + 2)

    def ci(key: str) -> dict[str, Any]:
        return _entry(point, boot, key, level)

    policies: dict[str, Any] = {}
    for name in POLICIES:
        entry: dict[str, Any] = {
            "quality": {est: ci(f"{name}.{est}") for est in ESTIMATORS},
            "weight_mean": ci(f"{name}.weight_mean"),
            "ess": point[f"{name}.ess"],
            "matched": int(point[f"{name}.matched"]),
            "unsupported": int(point[f"{name}.unsupported"]),
        }
        if name == "router":
            entry["strong_share"] = {k: ci(f"router.share.{k}") for k in ("replayed", "ips", "snips")}
            entry["cost"] = {k: ci(f"router.cost.{k}") for k in ("ips", "snips")}
            entry["pgr"] = {est: ci(f"router.pgr.{est}") for est in ESTIMATORS}
        policies[name] = entry
    policies["logging"] = {
        "quality": ci("logging.quality"),
        "strong_share": ci("logging.share"),
        "cost": ci("logging.cost"),
    }
    return {
        "policies": policies,
        "differences": {"router-logging": {est: ci(f"router-logging.{est}") for est in ESTIMATORS}},
        "propensity": {
            "min": float(t.propensity.min()),
            "max": float(t.propensity.max()),
            "mean": float(t.propensity.mean()),
        },
        "bootstrap": {"draws": draws, "seed": seed + 2, "level": level, "method": "percentile, rows resampled"},
    }


ESTIMATOR_TEXT = {
    "ips": "inverse propensity: the mean over logged rows of 1[served = the route's choice] / propensity x "
    "outcome; unbiased when the propensities are the logging probabilities",
    "snips": "self-normalised inverse propensity: the same weighted outcomes divided by the sum of the weights "
    "instead of the row count; slightly biased, lower variance (the default to read)",
    "dr": "doubly robust: a per-model linear fit of the outcome on the replayed knob score (cross-fitted, "
    f"{DR_FOLDS} folds) plus the inverse-propensity correction of its residuals",
    "logging": "the logging policy's own mean outcome on the same rows: observed, not estimated",
}


def outcome_text(metric: str) -> str:
    """Which feedback counts as a logged row's outcome, in one sentence."""
    implicit = "any implicit signal" if metric == "quality" else f"implicit feedback under {metric}"
    return (
        f"the served answer's {metric}: the mean of its explicit feedback ({', '.join(EXPLICIT_SOURCES)}), "
        f"else 0 when the gateway recorded {implicit} on it; judge comparisons feed the direct estimator"
    )


def caveats(excluded: Mapping[str, int]) -> str:
    """What the estimates cover, plainly."""
    text = (
        "The estimates describe requests the logging policy randomised and that received an outcome; "
        "rule-forced and unexplored requests are not represented, and where whether feedback is given "
        "depends on the answer, the numbers describe the requests with feedback."
    )
    if excluded.get(NO_PROPENSITY):
        text += (
            f" {excluded[NO_PROPENSITY]} logged requests were not randomised (no propensity) and cannot be "
            "weighted: turn on explore.epsilon for the route to log propensities."
        )
    return text


def offpolicy_estimator(
    *,
    used: int,
    logged: int,
    excluded: Mapping[str, int],
    metric: str,
    missing: str = "",
) -> dict[str, Any]:
    """The off-policy part of the report's ``estimator`` block: which estimators, on how many rows.

    ``used``: rows the estimates read; ``logged``: logged requests read from the ``logs:`` sources;
    ``excluded``: why the others were left out; ``missing``: why nothing was estimated (``used`` 0).
    """
    without = int(excluded.get(NO_PROPENSITY, 0))
    block: dict[str, Any] = {
        "rows": used,
        "rows_logged": logged,
        "rows_without_propensity": without,
        "excluded": dict(excluded),
        "outcome": outcome_text(metric),
    }
    if used:
        block["numbers"] = ["offpolicy"]
        block["estimators"] = dict(ESTIMATOR_TEXT)
        block["text"] = f"off-policy section: IPS, SNIPS and DR on {used} logged requests with a propensity" + (
            f"; {without} logged requests had no propensity (not randomised) and cannot be weighted" if without else ""
        )
    else:
        block["numbers"] = []
        block["text"] = f"off-policy section not computed: {missing or 'no usable logged request'}"
    return block


def offpolicy_section(
    t: LoggedTable,
    *,
    pair: tuple[str, str],
    metric: str,
    logged: int,
    excluded: Mapping[str, int],
    basis: Mapping[str, str],
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """The report's ``offpolicy`` section: :func:`compute_offpolicy` with its rows and notes."""
    outcome_from = {kind: t.outcome_from.count(kind) for kind in sorted(set(t.outcome_from))}
    return {
        "pair": {"strong": pair[0], "weak": pair[1]},
        "metric": metric,
        "outcome": outcome_text(metric),
        "rows": {
            "logged": logged,
            "used": len(t),
            "without_propensity": int(excluded.get(NO_PROPENSITY, 0)),
            "excluded": dict(excluded),
            "outcome_from": dict(outcome_from),
        },
        "cost_basis": dict(basis),
        "estimators": dict(ESTIMATOR_TEXT),
        "caveats": caveats(excluded),
        **compute_offpolicy(t, draws=draws, seed=seed, level=level),
    }
