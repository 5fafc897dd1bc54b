"""Per-arm statistics, differences against control, the sample-ratio check and the verdicts.

:func:`analyze` turns an :class:`~evals.ab.data.ExperimentData` into the report dict every output
(JSON, Markdown, HTML, plots) is rendered from. Every interval is an always-valid confidence
sequence (:mod:`policies.experiments.sequential`), so the report may be read at any time, as often
as wanted. The verdict's quality difference is the last look of the same path the report plots over
time (:func:`difference_path`): what the plot shows at each look is what the verdict would have said.

With several treatment arms each comparison uses ``alpha / (number of treatment arms)``
(Bonferroni), so the chance that *any* arm is wrongly declared stays at ``alpha``.

Every mean is of a bounded quantity, and its interval is computed with those bounds
(:func:`policies.experiments.sequential.bounded_variance`): quality scores lie in [0, 1]; costs have
no bound known in advance, so the range the experiment's costs span (from 0) stands in. Scores or
costs that never varied therefore get an interval of positive width, never a zero-width "certainty".
Each arm's own quality and rates, whose bounds are known in advance, get the bounded-data sequence
(:func:`policies.experiments.sequential.bounded_mean_path`, a betting confidence sequence), which needs no
variance estimate and so stays right for rates near 0 or 1; costs (bounds read from the data) and
differences keep the asymptotic one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from evals.ab.data import QUALITY_SOURCES, SOURCE_LABELS, ExperimentData, ServedRows
from evals.ab.verdict import ArmVerdict, arm_verdict
from policies.experiments.sequential import (
    DEFAULT_PLANNED_N,
    Bounds,
    SampleRatioCheck,
    SequentialDiff,
    SequentialPath,
    bounded_variance,
    cumulative_stats,
    mean_difference_cs,
    mean_difference_path,
    mean_path,
    proportion_difference_cs,
    rho_for_planned_n,
    sample_ratio_check,
)

MAX_LOOKS = 200  # points of the over-time plots when no look interval is given
MIN_VARIANCE_SCORES = 30  # scores per arm before the "more requests" estimate trusts their variance
ADAPTIVE_SPREAD = 1e-6  # an arm whose recorded propensities differ more than this was allocated adaptively


@dataclass(frozen=True)
class Options:
    """How the report computes: significance, mixing parameter, smallest difference worth having."""

    alpha: float = 0.05
    planned_n: int = DEFAULT_PLANNED_N  # requests per arm the confidence sequences are tightest at
    min_effect: float = 0.02  # on the [0, 1] quality scale: smaller differences count as none
    quality_source: str = "auto"  # auto | explicit | judge | implicit
    srm_alpha: float = 0.001
    look_every: int | None = None  # served requests between looks of the over-time path

    @property
    def rho(self) -> float:
        """The mixing parameter of every confidence sequence (fixed before the data is seen)."""
        return rho_for_planned_n(self.planned_n, self.alpha)


def primary_source(rows: ServedRows, requested: str = "auto") -> str:
    """The quality source the verdict uses: the requested one, else the first with any score.

    Chosen from which *kinds* of feedback exist, never from their values, and explicit feedback
    first: the user's word outranks a judge's, which outranks behaviour.
    """
    if requested != "auto":
        if requested not in QUALITY_SOURCES:
            raise ValueError(f"unknown quality source {requested!r}; expected auto or one of {QUALITY_SOURCES}")
        return requested
    for source in QUALITY_SOURCES:
        q = rows.quality.get(source)
        if q is not None and np.isfinite(q).any():
            return source
    return "implicit"


def looks_for(n_rows: int, look_every: int | None) -> np.ndarray:
    """Row counts (1-based, time order) at which the path is evaluated; always ends at ``n_rows``."""
    if n_rows == 0:
        return np.array([], dtype=int)
    step = look_every or max(1, math.ceil(n_rows / MAX_LOOKS))
    looks = np.arange(step, n_rows + 1, step)
    if looks.size == 0 or looks[-1] != n_rows:
        looks = np.append(looks, n_rows)
    return looks


def quality_bounds(values: np.ndarray) -> Bounds:
    """The range quality scores lie in: [0, 1] (the feedback API's), widened to any score seen outside it."""
    x = values[np.isfinite(values)]
    return (min(0.0, float(x.min())), max(1.0, float(x.max()))) if x.size else (0.0, 1.0)


def cost_bounds(values: np.ndarray) -> Bounds | None:
    """The range costs lie in, as far as the experiment shows: from 0 (or a lower cost) to the largest seen.

    A cost has no bound known in advance; the observed range is the scale its smoothing needs (see
    :func:`~policies.experiments.sequential.bounded_variance`). None when no cost is known or every
    cost is 0: there is no scale to be uncertain over.
    """
    x = values[np.isfinite(values)]
    if not x.size:
        return None
    lower, upper = min(0.0, float(x.min())), float(x.max())
    return (lower, upper) if upper > lower else None


def _arm_cumulative(rows: ServedRows, arm: str, values: np.ndarray, looks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Running (n, mean, var) of ``values`` over ``arm``'s rows, read at ``looks``."""
    n, mean, var = cumulative_stats(np.where(rows.arm == arm, values, np.nan))
    return n[looks - 1], mean[looks - 1], var[looks - 1]


def difference_path(
    rows: ServedRows, treatment: str, control: str, source: str, looks: np.ndarray, *, alpha: float, rho: float
) -> SequentialPath:
    """The quality difference ``treatment - control`` and its confidence sequence at each look."""
    q = rows.quality[source]
    nt, mt, vt = _arm_cumulative(rows, treatment, q, looks)
    nc, mc, vc = _arm_cumulative(rows, control, q, looks)
    return mean_difference_path(nt, mt, vt, nc, mc, vc, alpha=alpha, rho=rho, bounds=quality_bounds(q))


def _interval(lower: float, upper: float) -> list[float]:
    return [float(lower), float(upper)]


def _diff_dict(d: SequentialDiff) -> dict[str, Any]:
    return {"estimate": d.estimate, "ci": _interval(d.lower, d.upper), "n_treatment": d.n_treatment,
            "n_control": d.n_control, "alpha": d.alpha, "significant": d.significant}


def _mean_entry(
    values: np.ndarray, requests: int, opts: Options, bounds: Bounds | None, *, clip: bool = True
) -> dict[str, Any]:
    x = values[np.isfinite(values)]
    n = int(x.size)
    mean = float(x.mean()) if n else math.nan
    var = float(x.var(ddof=1)) if n >= 2 else math.nan
    lo, hi = mean_path(np.array([n]), np.array([mean]), np.array([var]), alpha=opts.alpha, rho=opts.rho,
                       bounds=bounds, clip=clip)
    return {"n": n, "mean": mean, "sd": math.sqrt(var) if n >= 2 else math.nan, "ci": _interval(lo[0], hi[0]),
            "coverage": n / requests if requests else math.nan}


def _rate_entry(hits: int, n: int, opts: Options) -> dict[str, Any]:
    # A rate is the mean of 0/1 values: the bounded interval, which stays right near 0% and 100% (errors).
    var = (hits - hits * hits / n) / (n - 1) if n >= 2 else math.nan
    lo, hi = mean_path(np.array([n]), np.array([hits / n if n else math.nan]), np.array([var]),
                       alpha=opts.alpha, rho=opts.rho, bounds=(0.0, 1.0))
    return {"value": hits / n if n else math.nan, "count": hits, "n": n, "ci": _interval(lo[0], hi[0])}


def arm_stats(data: ExperimentData, arm: str, primary: str, opts: Options) -> dict[str, Any]:
    """One served arm's numbers: requests, errors, quality per source, cost, strong share, latency."""
    rows = data.served.select(data.served.arm == arm)
    n = len(rows)
    # Bounds from every arm's values: one scale for the experiment, so the arms' intervals compare.
    quality = {s: _mean_entry(rows.quality[s], n, opts, quality_bounds(data.served.quality[s]))
               for s in QUALITY_SOURCES}
    # The cost range is read from the data: it scales the smoothing but must not clip (a mean may exceed it).
    cost = _mean_entry(rows.cost, n, opts, cost_bounds(data.served.cost), clip=False)
    cost["total"] = float(np.nansum(rows.cost)) if n else 0.0
    latency = rows.latency[np.isfinite(rows.latency)]
    q_mean = quality[primary]["mean"]
    spec = next((a for a in data.arms if a.name == arm), None)
    stop = next((s for s in data.stops if s.arm == arm), None)
    return {
        "requests": n,
        "weight": spec.weight if spec else None,
        "control": arm == data.control,
        "kind": spec.kind if spec else None,
        "compared": int(rows.compared.sum()),
        "error_rate": _rate_entry(int(rows.error.sum()), n, opts),
        "quality": quality,
        "cost_per_request": cost,
        "cost_per_quality_point": cost["mean"] / q_mean if q_mean and math.isfinite(q_mean) else math.nan,
        "strong_share": _rate_entry(int(rows.strong.sum()), n, opts) if data.strong_model else None,
        "latency_ms": {
            "n": int(latency.size),
            "p50": float(np.percentile(latency, 50)) if latency.size else math.nan,
            "p99": float(np.percentile(latency, 99)) if latency.size else math.nan,
            "mean": float(latency.mean()) if latency.size else math.nan,
        },
        "stopped": None if stop is None else {"reason": stop.reason, "detail": stop.detail,
                                              "stopped_at": stop.stopped_at, "replica": stop.replica},
    }


def srm_check(data: ExperimentData, opts: Options) -> tuple[SampleRatioCheck | None, str]:
    """The sample-ratio check of served arms against their weights, or None and why it was skipped.

    Only requests before the first arm stop count: after a stop, the stopped arm's traffic goes to
    control on purpose. Adaptive allocation (propensities that move) has no fixed ratio to test.
    """
    arms = [a for a in data.arms if not a.shadow]
    weights = {a.name: a.weight for a in arms}
    if sum(weights.values()) <= 0:
        return None, "skipped: the experiment's spec gives no arm weights"
    allocation = data.spec.get("allocation")
    if isinstance(allocation, dict) and allocation.get("kind") not in (None, "fixed"):
        return None, f"skipped: adaptive allocation ({allocation.get('kind')}: arm probabilities change over time)"
    rows = data.served
    before = rows.created_at < min((s.stopped_at for s in data.stops), default=math.inf)
    # Only the rows the check counts: after a stop the control's logged propensity rises to its share
    # plus the stopped arm's (the rerouted keys) on purpose, which is not adaptive allocation.
    for arm in weights:
        p = rows.propensity[before & (rows.arm == arm) & np.isfinite(rows.propensity)]
        if p.size and float(p.max() - p.min()) > ADAPTIVE_SPREAD:
            return None, "skipped: adaptive allocation (arm probabilities change over time)"
    arm_values = rows.arm[before].tolist()
    what = "requests"
    if rows.unit is not None:
        # Randomisation is per key (a user, a session ...): count each key once, in the arm it was
        # assigned to. Counting requests would flag a few heavy users as a broken split. A request
        # that was its own unit (no key) counts once, as itself.
        first: dict[str, str] = {}
        for index, (arm, unit) in enumerate(zip(arm_values, rows.unit[before].tolist(), strict=True)):
            first.setdefault(unit if unit is not None else f"request:{index}", arm)
        if len(first) < len(arm_values):
            arm_values, what = list(first.values()), "assignment keys"
    counts = {a: arm_values.count(a) for a in dict.fromkeys([*weights, *arm_values])}
    note = f"{what} before the first arm stop" if data.stops else f"all served {what}"
    return sample_ratio_check(counts, weights, alpha=opts.srm_alpha), note


def shadow_summary(data: ExperimentData) -> dict[str, Any]:
    """Per shadow arm: how often its choice agreed with what was served, and its strong share."""
    sh, rows = data.shadows, data.served
    index = {rid: i for i, rid in enumerate(rows.request_id.tolist())}
    out: dict[str, Any] = {}
    for arm in dict.fromkeys(sh.arm.tolist()):
        mask = sh.arm == arm
        chosen = [m if m is not None else "(none: blocked)" for m in sh.model[mask].tolist()]
        served_i = [index.get(s) for s in sh.served_id[mask].tolist()]
        pairs = [(c, rows.model[i]) for c, i in zip(chosen, served_i, strict=True) if i is not None]
        strong = data.strong_model
        out[str(arm)] = {
            "decisions": len(chosen),
            "matched": len(pairs),
            "agreement": float(np.mean([c == s for c, s in pairs])) if pairs else math.nan,
            "strong_share": float(np.mean([c == strong for c in chosen])) if chosen and strong else math.nan,
            "served_strong_share": float(np.mean([s == strong for _, s in pairs])) if pairs and strong else math.nan,
            "chosen": _counts(chosen),
        }
    return out


def _counts(values: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def timeline(
    data: ExperimentData, primary: str, opts: Options, alpha_cmp: float
) -> tuple[dict[str, Any], dict[str, SequentialPath]]:
    """The over-time series (cumulative requests, quality with CS bands, difference paths)."""
    rows = data.served
    looks = looks_for(len(rows), opts.look_every)
    arms = data.served_arms
    out: dict[str, Any] = {"looks": looks, "created_at": rows.created_at[looks - 1] if looks.size else looks,
                           "source": primary, "requests": {}, "quality": {}, "differences": {}}
    q = rows.quality[primary]
    for arm in arms:
        counts = np.cumsum(rows.arm == arm)
        out["requests"][arm] = counts[looks - 1] if looks.size else looks
        n, mean, var = _arm_cumulative(rows, arm, q, looks) if looks.size else (looks, looks, looks)
        lo, hi = mean_path(n, mean, var, alpha=opts.alpha, rho=opts.rho, bounds=quality_bounds(q))
        out["quality"][arm] = {"n": n, "mean": mean, "lower": lo, "upper": hi}
    paths: dict[str, SequentialPath] = {}
    control = data.control
    for arm in arms:
        if arm == control or not looks.size:
            continue
        path = difference_path(rows, arm, control, primary, looks, alpha=alpha_cmp, rho=opts.rho)
        paths[arm] = path
        out["differences"][arm] = {"estimate": path.estimate, "lower": path.lower, "upper": path.upper,
                                   "significant": path.significant, "n_treatment": path.n_treatment,
                                   "n_control": path.n_control}
    return out, paths


def _proportion_diff(t: ServedRows, c: ServedRows, column: str, alpha: float) -> SequentialDiff:
    hits_t, hits_c = int(getattr(t, column).sum()), int(getattr(c, column).sum())
    return proportion_difference_cs(hits_t, len(t), hits_c, len(c), alpha=alpha)


def differences(
    data: ExperimentData, arm: str, primary: str, path: SequentialPath | None, opts: Options, alpha_cmp: float
) -> tuple[dict[str, Any], SequentialDiff, SequentialDiff]:
    """Every difference of ``arm`` against control: quality per source, cost, error rate, strong share."""
    rows = data.served
    t, c = rows.select(rows.arm == arm), rows.select(rows.arm == data.control)
    quality: dict[str, Any] = {}
    primary_diff = mean_difference_cs([], [], alpha=alpha_cmp, rho=opts.rho)
    for source in QUALITY_SOURCES:
        if source == primary and path is not None:
            d = path.at(-1)  # the verdict reads the path's last look: the plot and the verdict agree
        else:
            d = mean_difference_cs(t.quality[source], c.quality[source], alpha=alpha_cmp, rho=opts.rho,
                                   bounds=quality_bounds(rows.quality[source]))
        quality[source] = _diff_dict(d)
        if source == primary:
            primary_diff = d
    cost = mean_difference_cs(t.cost, c.cost, alpha=alpha_cmp, rho=opts.rho, bounds=cost_bounds(rows.cost),
                              clip=False)
    out = {
        "quality": quality,
        "cost_per_request": _diff_dict(cost),
        "error_rate": _diff_dict(_proportion_diff(t, c, "error", alpha_cmp)),
        "strong_share": _diff_dict(_proportion_diff(t, c, "strong", alpha_cmp)) if data.strong_model else None,
    }
    return out, primary_diff, cost


def verdict_for(
    data: ExperimentData, arm: str, primary: str, quality: SequentialDiff, cost: SequentialDiff,
    srm: SampleRatioCheck | None, opts: Options,
) -> ArmVerdict:
    """The verdict on one treatment arm (see :func:`evals.ab.verdict.arm_verdict`)."""
    rows = data.served
    q = rows.quality[primary]
    bounds = quality_bounds(q)
    per_arm = []
    for name in (arm, data.control):
        mask = rows.arm == name
        values = q[mask & np.isfinite(q)]
        # Fewer than MIN_VARIANCE_SCORES scores say little about the spread: the largest is assumed.
        # More are smoothed like the intervals' (scores that never varied still have some spread).
        var = (float(bounded_variance(values.size, values.mean(), values.var(ddof=1), bounds))
               if values.size >= MIN_VARIANCE_SCORES else math.nan)
        per_arm.append((var, values.size / max(int(mask.sum()), 1)))
    (var_t, cov_t), (var_c, cov_c) = per_arm
    # Costs of zero everywhere say nothing: leave cost out of the sentence rather than claim "no difference".
    known_cost = np.isfinite(rows.cost) & (rows.cost != 0)
    verdict = arm_verdict(
        arm, data.control, quality, cost if known_cost.any() else None, source=primary, min_effect=opts.min_effect,
        var_treatment=float(var_t), var_control=float(var_c), coverage=min(cov_t, cov_c), rho=opts.rho, srm=srm,
    )
    stop = next((s for s in data.stops if s.arm == arm), None)
    if stop is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stop.stopped_at))
        verdict = ArmVerdict(verdict.arm, verdict.control, verdict.kind,
                             f"{verdict.text} ({arm} was stopped at {when}: {stop.reason})", verdict.winner,
                             verdict.more_requests_per_arm, verdict.detectable_difference)
    return verdict


def analyze(data: ExperimentData, opts: Options | None = None) -> dict[str, Any]:
    """The full A/B report as a dict (numbers may be numpy arrays or non-finite; see ``jsonable``)."""
    opts = opts or Options()
    primary = primary_source(data.served, opts.quality_source)
    arms = data.served_arms
    control = data.control
    treatments = [a for a in arms if a != control]
    alpha_cmp = opts.alpha / max(len(treatments), 1)
    srm, srm_note = srm_check(data, opts)
    series, paths = timeline(data, primary, opts, alpha_cmp)
    diffs: dict[str, Any] = {}
    verdicts: dict[str, ArmVerdict] = {}
    for arm in treatments:
        diffs[arm], q_diff, cost = differences(data, arm, primary, paths.get(arm), opts, alpha_cmp)
        verdicts[arm] = verdict_for(data, arm, primary, q_diff, cost, srm, opts)
    if not treatments:
        summary = "not enough data yet: the experiment has no treatment arm with served requests"
    elif srm is not None and srm.mismatch:
        summary = next(iter(verdicts.values())).text
    else:
        summary = "; ".join(v.text for v in verdicts.values())
    caveats = []
    if srm_note.startswith("skipped: adaptive"):
        caveats.append("Arms were allocated adaptively: per-arm means are still reported, but a bandit's "
                       "allocation can bias them; treat differences as indicative.")
    caveats.append("Units are requests: requests of one assignment key (user, session) are not independent, "
                   "so with a few heavy keys the intervals are too narrow.")
    return {
        "experiment": data.name,
        "route": data.route,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "spec": data.spec,
        "control": control,
        "arms_order": arms,
        "strong_model": {"name": data.strong_model, "basis": data.strong_basis},
        "metric": data.metric,
        "include_compared": data.include_compared,
        "primary_source": primary,
        "sources": {s: SOURCE_LABELS[s] for s in QUALITY_SOURCES},
        "method": {
            "alpha": opts.alpha, "alpha_per_comparison": alpha_cmp, "rho": opts.rho, "planned_n": opts.planned_n,
            "min_effect": opts.min_effect, "srm_alpha": opts.srm_alpha,
            "text": "Always-valid (anytime-valid) confidence sequences. Each arm's quality and rates: a "
                    "bounded-data confidence sequence (a mixture of bets on the mean, the betting confidence "
                    "sequence of Waudby-Smith & Ramdas 2024), exact at every sample size, also near 0% and 100%; "
                    "differences between arms and costs: the asymptotic confidence sequence of Waudby-Smith, "
                    "Arbour et al. (2024), a normal-mixture boundary with plug-in variance. "
                    f"Tightest near {opts.planned_n} requests per arm.",
        },
        "rows": {"served": len(data.served), "shadow": len(data.shadows), "excluded": data.excluded},
        "arms": {arm: arm_stats(data, arm, primary, opts) for arm in arms},
        "differences": diffs,
        "srm": None if srm is None else {"counts": srm.counts, "expected_share": srm.expected_share,
                                         "p_value": srm.p_value, "mismatch": srm.mismatch, "note": srm_note},
        "srm_note": srm_note,
        "verdicts": {a: {"kind": v.kind, "text": v.text, "winner": v.winner,
                         "more_requests_per_arm": v.more_requests_per_arm,
                         "detectable_difference": v.detectable_difference} for a, v in verdicts.items()},
        "verdict": summary,
        "stops": [{"arm": s.arm, "reason": s.reason, "detail": s.detail, "stopped_at": s.stopped_at,
                   "replica": s.replica} for s in data.stops],
        "shadow": shadow_summary(data),
        "timeline": series,
        "caveats": caveats,
    }


__all__ = ["Options", "analyze", "arm_stats", "difference_path", "looks_for", "primary_source", "srm_check"]
