"""The numbers of a ``pointsman eval`` report: a replayed route against baselines on the same requests.

Input: a :class:`PairTable`, one row per evaluated request with the strong and weak models' quality
and cost, the route's knob score (or the model a rule pinned it to) and its decision at the configured
knob. Output: :func:`compute_report`'s JSON-ready dict, which :mod:`evals.report_render` turns into
Markdown and HTML and :mod:`evals.report_plots` into PNGs.

Baselines, computed in the same run on the same rows:

- **random**: uniform random scores in place of the knob's through the same threshold sweep, ``draws``
  times, the requests a rule pinned keeping their model as in the route's own curve: the mean curve and
  the 95% band of its APGR (what the route's knob must clear to be better than a coin; without the pins a
  rule that sends high-gain requests strong, or just some share strong, would count as ranking skill);
- **always-weak / always-strong**: the two ends (PGR 0 and 1);
- **oracle**: sends to the strong model exactly the requests where it gains most (needs both models'
  qualities: direct rows only);
- **kNN**: cosine k-nearest-neighbours over the requests' embeddings, scoring a request by its
  neighbours' mean quality gain (strong - weak), cross-fitted (k folds, every row of a prompt in one:
  each fold is scored by the others), so it is the "just remember similar requests" router trained on
  this very data; like random, it keeps the requests a rule pinned on their model.

Headline numbers carry a percentile bootstrap 95% CI (paired across routers: the ``router - kNN``
difference has its own interval). The bootstrap resamples prompts, not rows: the rows of one prompt
(logged traffic repeats prompts; a labelled file may judge one prompt several times) are not independent,
and resampling them one by one made the intervals too narrow. Every number here is ``direct``: read from
rows with both models' labelled quality. Logged rows that only show the served model's outcome are estimated
separately, by inverse propensity (:mod:`evals.offpolicy`); :func:`estimator_block` says which
estimator produced which part of the report.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evals.metrics import (
    CurvePoint,
    aiq,
    apgr,
    bootstrap,
    censored_percentile_ci,
    cpt,
    ece,
    group_codes,
    oracle_curve,
    percentile_ci,
    quality_gap,
    random_curves,
    reliability,
    routing_curve,
    upper_frontier,
)
from evals.replay import WORKFLOW_EXCLUDED, Replay, pair_arrays, pair_usable

NUM_RESULTS = 10  # RouteLLM's 10 quantile bins: 11 points per curve
BOOTSTRAP_METHOD = "percentile, prompts resampled (every row of a prompt together)"
ROUTERS = ("router", "knn", "oracle")


@dataclass
class PairTable:
    """Row-aligned arrays over the evaluated requests (see the module docstring)."""

    strong_q: np.ndarray  # quality of the strong model
    weak_q: np.ndarray
    strong_cost: np.ndarray  # per request, in the report's cost basis
    weak_cost: np.ndarray
    scores: np.ndarray  # the knob's score; NaN where a rule pinned the model
    pins: np.ndarray  # +1 strong whatever the threshold, -1 weak, 0 the knob decides
    knob_strong: np.ndarray  # the decision at the configured knob
    sources: np.ndarray
    domains: np.ndarray
    direct: np.ndarray  # True: both qualities labelled (all of build_table's rows); False rows only
    # estimate a quality and stay out of the oracle and the calibration
    embeddings: np.ndarray | None = None
    # What identifies each row's prompt (its conversation text, else its id): rows of one prompt are not
    # independent, so the bootstrap resamples prompts. None: every row its own prompt.
    prompts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.strong_q)

    def take(self, idx: np.ndarray, *, numbers_only: bool = False) -> PairTable:
        """The rows ``idx`` (a resample or a group). ``numbers_only``: leave out the groups and the
        embeddings (a bootstrap resample needs neither, and copying them dominates its cost)."""
        empty = np.empty(0, dtype=object)
        return PairTable(
            strong_q=self.strong_q[idx], weak_q=self.weak_q[idx], strong_cost=self.strong_cost[idx],
            weak_cost=self.weak_cost[idx], scores=self.scores[idx], pins=self.pins[idx],
            knob_strong=self.knob_strong[idx], direct=self.direct[idx],
            sources=empty if numbers_only else self.sources[idx], domains=empty if numbers_only else self.domains[idx],
            embeddings=None if numbers_only or self.embeddings is None else self.embeddings[idx],
            prompts=None if numbers_only or self.prompts is None else self.prompts[idx],
        )


# ----------------------------------------------------------------------------- building the table


def build_table(
    rows: Sequence[Any],
    replay: Replay,
    strong: str,
    weak: str,
    *,
    prices: tuple[float, float] = (0.0, 0.0),
    embeddings: np.ndarray | None = None,
) -> tuple[PairTable, dict[str, int], dict[str, str]]:
    """The rows a pairwise report can evaluate, with what was left out and the cost basis.

    ``rows`` are :class:`evals.labelled.LabelledRequest` s aligned with ``replay.decisions``; ``strong``
    and ``weak`` are the models' names in the data (their quality keys). A row is evaluated when the
    route decided it between the pair and both qualities are known (direct). ``prices`` are the two
    models' configured prices (USD per million tokens, input + output), used when the rows carry no
    costs.
    Returns (table, excluded reason -> count, cost basis ``{"kind", "text"}``).
    """
    scores, pins, knob_strong = pair_arrays(replay)
    usable = pair_usable(replay)
    excluded: dict[str, int] = {}
    keep: list[int] = []
    qs: list[float] = []
    qw: list[float] = []
    direct: list[bool] = []
    for i, (row, decision) in enumerate(zip(rows, replay.decisions, strict=True)):
        reason = None
        if decision.by == "blocked":
            reason = "blocked by a rule"
        elif decision.by == "error":
            reason = "no decision (policy error)"
        elif decision.by == "workflow":
            reason = WORKFLOW_EXCLUDED
        elif not usable[i]:
            reason = "routed to a model outside the pair"
        else:
            s, w = row.qualities.get(strong), row.qualities.get(weak)
            if s is not None and w is not None:
                qs.append(float(s))
                qw.append(float(w))
                direct.append(True)
            else:
                reason = f"no quality for both {strong} and {weak}"
        if reason is None:
            keep.append(i)
        else:
            excluded[reason] = excluded.get(reason, 0) + 1
    idx = np.array(keep, dtype=int)
    kept = [rows[i] for i in keep]
    if kept and all(strong in r.costs and weak in r.costs for r in kept):
        sc = np.array([r.costs[strong] for r in kept])
        wc = np.array([r.costs[weak] for r in kept])
        basis = {"kind": "labelled", "unit": "USD per request", "text": "the data's per-request costs"}
    elif any(p > 0 for p in prices):
        from policies.utility import rough_token_count

        tokens = np.array([rough_token_count({"messages": r.messages}) for r in kept], dtype=float)
        sc, wc = tokens * prices[0] / 1e6, tokens * prices[1] / 1e6
        missing = sum(not (strong in r.costs and weak in r.costs) for r in kept)
        why = ("the data has no per-request costs" if missing == len(kept) else
               f"{missing} of {len(kept)} requests have no cost for both models, so no request's own cost is used")
        basis = {"kind": "prices", "unit": "USD per request (estimated)",
                 "text": "the configured prices (input + output per million tokens) times the request's "
                         f"estimated tokens ({why})"}
    else:
        sc, wc = np.ones(len(kept)), np.zeros(len(kept))
        basis = {"kind": "share", "unit": "strong-call share",
                 "text": "no costs in the data and no prices in the config: cost is the strong-call share"}
    table = PairTable(
        strong_q=np.array(qs, dtype=float),
        weak_q=np.array(qw, dtype=float),
        strong_cost=np.asarray(sc, dtype=float),
        weak_cost=np.asarray(wc, dtype=float),
        scores=scores[idx] if len(idx) else np.array([]),
        pins=pins[idx] if len(idx) else np.array([], dtype=int),
        knob_strong=knob_strong[idx] if len(idx) else np.array([], dtype=bool),
        sources=np.array([r.source for r in kept], dtype=object),
        domains=np.array([r.domain or "unknown" for r in kept], dtype=object),
        direct=np.array(direct, dtype=bool),
        embeddings=None if embeddings is None or not len(idx) else np.asarray(embeddings)[idx],
        prompts=_prompt_keys(kept),
    )
    return table, excluded, basis


def _prompt_keys(rows: Sequence[Any]) -> np.ndarray:
    """Each row's prompt identity, the key folds and the hold-out use (text, else request id, else vector):
    logged traffic repeats prompts and a labelled file may judge one prompt several times."""
    from evals.retrain import row_key

    return np.array([row_key(r) for r in rows], dtype=object)


DIRECT_NUMBERS = ("routers", "knob", "calibration", "breakdown", "differences")


def estimator_block(
    direct_rows: int,
    offpolicy: Mapping[str, Any] | None,
    *,
    direct_missing: str = "",
) -> dict[str, Any]:
    """Which estimator produced which numbers of the report, with its row counts.

    ``direct_rows``: rows of the direct section (0: not computed, ``direct_missing`` says why).
    ``offpolicy``: the off-policy rows' counts and notes (:func:`evals.offpolicy.offpolicy_estimator`),
    or None when no ``logs:`` source was given.
    """
    names: list[str] = []
    if direct_rows:
        names.append("direct")
        direct: dict[str, Any] = {
            "rows": direct_rows,
            "numbers": list(DIRECT_NUMBERS),
            "text": "direct: every evaluated request has both models' labelled quality, so each routing choice's "
            "outcome is read, not estimated",
        }
    else:
        direct = {"rows": 0, "numbers": [], "text": f"not computed: {direct_missing or 'no labelled request'}"}
    block: dict[str, Any] = {"direct": direct}
    parts = [direct["text"] if direct_rows else f"direct section {direct['text']}"]
    if offpolicy is not None:
        block["offpolicy"] = dict(offpolicy)
        if offpolicy.get("rows"):
            names += [name for name in offpolicy.get("estimators", {}) if name != "logging"]
        parts.append(str(offpolicy.get("text", "")))
    block["name"] = "+".join(names) or "none"
    block["text"] = "; ".join(p for p in parts if p)
    return block


# ----------------------------------------------------------------------------- kNN baseline


def knn_scores(
    embeddings: np.ndarray,
    gain: np.ndarray,
    *,
    k: int | None = None,
    folds: int = 5,
    seed: int = 0,
    progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
    groups: np.ndarray | None = None,
) -> np.ndarray:
    """Cross-fitted kNN scores: each request's score is the mean ``gain`` of its ``k`` most cosine-similar
    requests in the other folds (``k`` default: sqrt of the training size, between 5 and 50).

    ``groups`` (per row, the prompt) keeps every row of a prompt in one fold: a copy of the request in
    another fold is its nearest neighbour and hands it its own label (repeated prompts lifted kNN's APGR
    by 0.05 or more). Every group distinct: the folds are the per-row ones."""
    x = np.asarray(embeddings, dtype=np.float32)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    n = len(x)
    out = np.zeros(n)
    codes, m = group_codes(groups, n)
    if m < 2:
        return out
    folds = max(2, min(folds, m))
    fold = np.random.default_rng(seed).permutation(m)[codes] % folds
    loop: Iterable[int] = range(folds)
    if progress is not None:
        loop = progress(loop)
    for f in loop:
        test, train = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        kk = k if k is not None else int(np.clip(round(math.sqrt(len(train))), 5, 50))
        kk = max(1, min(kk, len(train)))
        for start in range(0, len(test), 1024):  # bounded memory: 1024 x n similarities at a time
            rows = test[start:start + 1024]
            sim = x[rows] @ x[train].T
            top = np.argpartition(-sim, kk - 1, axis=1)[:, :kk]
            out[rows] = gain[train][top].mean(axis=1)
    return out


# ----------------------------------------------------------------------------- the numbers


def _pgr(q: float, strong: float, weak: float) -> float:
    return (q - weak) / (strong - weak) if strong != weak else float("nan")


def _curve_numbers(curve: Sequence[CurvePoint], t: PairTable, cost_min: float, cost_max: float) -> dict[str, float]:
    strong, weak = float(t.strong_q.mean()), float(t.weak_q.mean())
    gap = strong != weak and len(curve) > 1
    costs = [p.cost for p in curve] + [cost_min, cost_max]
    quals = [p.quality for p in curve] + [weak, strong]
    return {
        "apgr": apgr(curve, strong, weak) if gap else float("nan"),
        # inf, not NaN, when the curve never reaches the target: the bootstrap counts those resamples.
        "cpt50": cpt(curve, 0.5, strong, weak, never=math.inf) if gap else float("nan"),
        "cpt80": cpt(curve, 0.8, strong, weak, never=math.inf) if gap else float("nan"),
        # Any router can degenerate to always-weak or always-strong: both ends are on its frontier.
        "aiq": aiq(costs, quals, cost_min, cost_max),
    }


def _curves(t: PairTable, knn: np.ndarray | None) -> dict[str, list[CurvePoint]]:
    cost = {"strong_cost": t.strong_cost, "weak_cost": t.weak_cost}
    curves = {"router": routing_curve(t.scores, t.strong_q, t.weak_q, NUM_RESULTS, pinned=t.pins, **cost)}
    if knn is not None:
        # Under the route's rules, like the random band: a pinned request keeps its model whatever kNN scores
        # it, so the baseline ranks only what the route's knob ranks (free, kNN "beat" a route the rules bind).
        curves["knn"] = routing_curve(knn, t.strong_q, t.weak_q, NUM_RESULTS, pinned=t.pins, **cost)
    if t.direct.all():
        curves["oracle"] = oracle_curve(t.strong_q, t.weak_q, NUM_RESULTS, **cost)
    return curves


def headline(t: PairTable, knn: np.ndarray | None) -> dict[str, float]:
    """Every headline number on the rows of ``t`` (flat keys, so a bootstrap can resample them all)."""
    strong, weak = float(t.strong_q.mean()), float(t.weak_q.mean())
    cost_min, cost_max = float(t.weak_cost.mean()), float(t.strong_cost.mean())
    out: dict[str, float] = {
        "always_weak.quality": weak, "always_strong.quality": strong,
        "always_weak.cost": cost_min, "always_strong.cost": cost_max,
    }
    for name, curve in _curves(t, knn).items():
        for key, value in _curve_numbers(curve, t, cost_min, cost_max).items():
            out[f"{name}.{key}"] = value
        for i, p in enumerate(curve):
            out[f"{name}.pgr.{i}"] = _pgr(p.quality, strong, weak)
            out[f"{name}.share.{i}"] = p.strong_share
    sel = t.knob_strong
    knob_q = float(np.where(sel, t.strong_q, t.weak_q).mean())
    out.update({
        "knob.share": float(sel.mean()),
        "knob.quality": knob_q,
        "knob.pgr": _pgr(knob_q, strong, weak),
        "knob.cost": float(np.where(sel, t.strong_cost, t.weak_cost).mean()),
    })
    scored = np.isfinite(t.scores) & t.direct
    out["calibration.ece"] = (
        ece(t.scores[scored], (t.strong_q > t.weak_q)[scored]) if scored.any() else float("nan")
    )
    if knn is not None:
        out["router-knn.apgr"] = out["router.apgr"] - out["knn.apgr"]
        out["router-knn.aiq"] = out["router.aiq"] - out["knn.aiq"]
    return out


def _with_ci(value: float, draws: np.ndarray | None, level: float) -> dict[str, Any]:
    lo, hi = percentile_ci(draws, level) if draws is not None else (float("nan"), float("nan"))
    return {"value": value, "ci": [lo, hi]}


def _cpt_with_ci(value: float, draws: np.ndarray | None, level: float) -> dict[str, Any]:
    """A CPT (``inf``: the curve never reaches the target) with its interval and ``unreached``, the share of
    resamples whose curve never reaches it. ``reached`` says whether this data's curve does (None: CPT is
    undefined here). A bound the resamples put at "never" is NaN (null in JSON; :func:`censored_percentile_ci`)."""
    lo, hi, unreached = censored_percentile_ci(draws, level) if draws is not None else (math.nan,) * 3
    return {
        "value": value if math.isfinite(value) else math.nan,
        "reached": None if math.isnan(value) else math.isfinite(value),
        "ci": [lo if math.isfinite(lo) else math.nan, hi if math.isfinite(hi) else math.nan],
        "unreached": unreached,
    }


def _entry(key: str, value: float, draws: np.ndarray | None, level: float) -> dict[str, Any]:
    if key.endswith((".cpt50", ".cpt80")):
        return _cpt_with_ci(value, draws, level)
    return _with_ci(value, draws, level)


def _progress_factory(progress: bool) -> Callable[[str, int], Callable[[Iterable[int]], Iterable[int]] | None]:
    def make(desc: str, total: int) -> Callable[[Iterable[int]], Iterable[int]] | None:
        if not progress:
            return None
        from tqdm import tqdm

        return lambda it: tqdm(it, desc=desc, total=total, unit="it" if "kNN" in desc else "draw", leave=False)

    return make


def compute_report(
    table: PairTable,
    *,
    meta: Mapping[str, Any],
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    knn_k: int | None = None,
    min_group: int = 20,
    progress: bool = False,
) -> dict[str, Any]:
    """The report's numbers (JSON-ready: NaN stays float here; :func:`jsonable` turns it into null).

    ``meta`` is copied in (route, data, router version, pair, threshold, estimator and cost notes …).
    Groups (sources, domains) with fewer than ``min_group`` rows get no APGR (too few to rank).
    """
    bar = _progress_factory(progress)
    n = len(table)
    if n == 0:
        raise ValueError("no request to evaluate")
    knn = None
    if table.embeddings is not None and n >= 10:
        knn = knn_scores(table.embeddings, table.strong_q - table.weak_q, k=knn_k, seed=seed,
                         progress=bar("kNN baseline (cross-fitted)", 5), groups=table.prompts)
    point = headline(table, knn)
    boot = bootstrap(lambda idx: headline(table.take(idx, numbers_only=True), None if knn is None else knn[idx]),
                     n, draws, seed,
                     progress=bar("bootstrap", draws), groups=table.prompts)
    ci = {key: _entry(key, value, boot.get(key), level) for key, value in point.items()}

    rand_apgr, rand_share, rand_quality = random_curves(
        table.strong_q, table.weak_q, draws, seed + 1, pinned=table.pins, num_results=NUM_RESULTS,
        progress=bar("random baseline", draws), groups=table.prompts,
    )
    strong, weak = point["always_strong.quality"], point["always_weak.quality"]
    cost_min, cost_max = point["always_weak.cost"], point["always_strong.cost"]
    curves = _curves(table, knn)
    routers: dict[str, Any] = {}
    for name, curve in curves.items():
        entry: dict[str, Any] = {key: ci[f"{name}.{key}"] for key in ("apgr", "cpt50", "cpt80", "aiq")}
        entry["curve"] = [
            {"threshold": p.threshold, "share": p.strong_share, "quality": p.quality, "cost": p.cost,
             "pgr": _pgr(p.quality, strong, weak), "pgr_ci": ci[f"{name}.pgr.{i}"]["ci"]}
            for i, p in enumerate(curve)
        ]
        fx, fy = upper_frontier([p.cost for p in curve] + [cost_min, cost_max],
                                [p.quality for p in curve] + [weak, strong])
        entry["frontier"] = [{"cost": float(c), "quality": float(q)} for c, q in zip(fx, fy, strict=True)]
        routers[name] = entry
    rand_mean = rand_quality.mean(axis=0)
    rand_lo, rand_hi = np.percentile(rand_quality, [2.5, 97.5], axis=0)
    mean_curve = [CurvePoint(math.nan, float(x), float(q)) for x, q in zip(rand_share, rand_quality.mean(axis=0),
                                                                          strict=True)]
    # No CPT without a curve: every request pinned by a rule leaves one point, as for the route itself.
    gap = strong != weak and float(np.ptp(rand_share)) > 0
    # Every draw's APGR is NaN when the two models tie on average: no mean (nanmean would warn on stderr).
    rand_finite = rand_apgr[np.isfinite(rand_apgr)]
    routers["random"] = {
        "apgr": {"value": float(rand_finite.mean()) if len(rand_finite) else math.nan,
                 "ci": list(percentile_ci(rand_apgr, level))},
        "cpt50": {"value": cpt(mean_curve, 0.5, strong, weak) if gap else math.nan, "ci": [math.nan, math.nan]},
        "cpt80": {"value": cpt(mean_curve, 0.8, strong, weak) if gap else math.nan, "ci": [math.nan, math.nan]},
        # RouterBench's zero router: mixing always-weak and always-strong (the frontier of those two points;
        # flat at the weak model's quality when the weak model does better).
        "aiq": {"value": aiq([cost_min, cost_max], [weak, strong], cost_min, cost_max), "ci": [math.nan, math.nan]},
        "curve": [
            {"share": float(s), "quality": float(q), "pgr": _pgr(float(q), strong, weak),
             "pgr_band": [_pgr(float(lo), strong, weak), _pgr(float(hi), strong, weak)]}
            for s, q, lo, hi in zip(rand_share, rand_mean, rand_lo, rand_hi, strict=True)
        ],
    }
    routers["always_weak"] = {"quality": ci["always_weak.quality"], "cost": ci["always_weak.cost"], "share": 0.0}
    routers["always_strong"] = {"quality": ci["always_strong.quality"], "cost": ci["always_strong.cost"],
                                "share": 1.0}
    scored = np.isfinite(table.scores) & table.direct
    labels = (table.strong_q > table.weak_q)[scored]
    pair_gap = quality_gap(table.strong_q[table.direct], table.weak_q[table.direct], level)
    warnings = [w for w in (pair_gap.warning(),) if w]
    report: dict[str, Any] = {
        "format": 1,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **dict(meta),
        "rows": {
            **dict(meta.get("rows", {})),
            "evaluated": n,
            "direct": int(table.direct.sum()),
            "pinned_by_rules": int((table.pins != 0).sum()),
        },
        "knob": {
            **dict(meta.get("knob", {})),
            "strong_share": ci["knob.share"], "quality": ci["knob.quality"], "pgr": ci["knob.pgr"],
            "cost": ci["knob.cost"],
        },
        "routers": routers,
        "quality_gap": {"value": pair_gap.value, "ci": [pair_gap.lo, pair_gap.hi], "resolved": not pair_gap.unresolved,
                        "inverted": pair_gap.inverted,
                        "method": f"strong minus weak mean quality over the direct rows, {level:.0%} t-interval"},
        "warnings": warnings,
        "calibration": {
            "ece": ci["calibration.ece"],
            "rows": int(scored.sum()),
            "label": "the strong model's quality was above the weak model's",
            "bins": [b.__dict__ for b in reliability(table.scores[scored], labels)],
        },
        "breakdown": {
            "source": _breakdown(table, table.sources, knn, draws, seed, level, min_group),
            "domain": _breakdown(table, table.domains, knn, draws, seed, level, min_group),
        },
        "bootstrap": {"draws": draws, "seed": seed, "level": level, "method": BOOTSTRAP_METHOD,
                      "prompts": n if table.prompts is None else len(set(table.prompts.tolist()))},
        "baselines": {
            "random": f"uniform random scores (one per prompt) through the same threshold sweep, {draws} draws, "
                      f"requests a rule pinned keeping their model; the band is the central {level:.0%} of their "
                      "APGRs; AIQ: mixing always-weak and always-strong",
            "knn": "cosine kNN on the requests' embeddings, score = mean quality gain of the k nearest "
                   "requests, cross-fitted over 5 folds; requests a rule pinned keep their model"
                   if knn is not None else "not computed (no embeddings)",
            "oracle": "the strong model exactly where it gains most (needs both qualities)"
                      if "oracle" in curves else "not computed: some rows only have the served model's quality",
        },
    }
    # Paired differences, nested: {"router-knn": {"apgr": ..., "aiq": ...}}.
    diffs: dict[str, dict[str, Any]] = {}
    for key in ci:
        if key.startswith("router-"):
            name, metric = key.split(".", 1)
            diffs.setdefault(name, {})[metric] = ci[key]
    report["differences"] = diffs
    return report


def offpolicy_only_report(
    meta: Mapping[str, Any],
    *,
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """The frame of a report without a direct section (no labelled request): ``meta`` plus the fields
    every report has; the caller adds the ``offpolicy`` section."""
    return {
        "format": 1,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **dict(meta),
        "rows": {**dict(meta.get("rows", {})), "evaluated": 0, "direct": 0, "pinned_by_rules": 0},
        "bootstrap": {"draws": draws, "seed": seed, "level": level, "method": "percentile, rows resampled"},
    }


def _breakdown(
    table: PairTable, groups: np.ndarray, knn: np.ndarray | None, draws: int, seed: int, level: float,
    min_group: int,
) -> list[dict[str, Any]]:
    """Per group: size, the two models' mean quality, the knob's strong share and PGR, and the router's
    and kNN's APGR with a bootstrap CI (within the group's rows) where the group has ``min_group`` rows
    and a mean quality gap whose interval excludes zero."""
    out = []
    for group in sorted(set(groups.tolist())):
        idx = np.flatnonzero(groups == group)
        sub = table.take(idx)
        sub_knn = None if knn is None else knn[idx]
        strong, weak = float(sub.strong_q.mean()), float(sub.weak_q.mean())
        sel = sub.knob_strong
        knob_q = float(np.where(sel, sub.strong_q, sub.weak_q).mean())
        gap = quality_gap(sub.strong_q[sub.direct], sub.weak_q[sub.direct], level)
        row: dict[str, Any] = {
            "group": str(group), "n": len(idx), "strong_quality": strong, "weak_quality": weak,
            "knob_share": float(sel.mean()), "knob_pgr": _pgr(knob_q, strong, weak),
            "gap_resolved": not gap.unresolved, "gap_inverted": gap.inverted,
        }
        # A group whose two models the data cannot tell apart gets no APGR: it divides by that gap; nor
        # does one whose weak model does better (the gap is negative and APGR reads upside down).
        if len(idx) >= min_group and not gap.unresolved and not gap.inverted:

            def stat(i: np.ndarray, sub: PairTable = sub, sub_knn: np.ndarray | None = sub_knn) -> dict[str, float]:
                t = sub.take(i, numbers_only=True)
                s, w = float(t.strong_q.mean()), float(t.weak_q.mean())
                if s == w:
                    return {"router": math.nan, "knn": math.nan}
                r = apgr(routing_curve(t.scores, t.strong_q, t.weak_q, NUM_RESULTS, pinned=t.pins), s, w)
                k = math.nan if sub_knn is None else apgr(
                    routing_curve(sub_knn[i], t.strong_q, t.weak_q, NUM_RESULTS, pinned=t.pins), s, w)
                return {"router": r, "knn": k}

            full = stat(np.arange(len(idx)))
            boot = bootstrap(stat, len(idx), min(draws, max(200, draws // 5)), seed, groups=sub.prompts)
            row["apgr"] = _with_ci(full["router"], boot["router"], level)
            row["knn_apgr"] = _with_ci(full["knn"], boot["knn"], level)
        out.append(row)
    return out


def jsonable(value: Any, digits: int | None = None) -> Any:
    """``value`` with NaN and infinities as None and numpy scalars as Python numbers (strict JSON);
    floats rounded to ``digits`` decimals when given."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, digits) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v, digits) for v in value.tolist()]
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        if not math.isfinite(f):
            return None
        return f if digits is None else round(f, digits)
    return value


def report_dir(out: str | Path, files: Sequence[str] = ()) -> Path:
    """The directory a command writes its report into, created now: a path that cannot hold it
    (read-only, a file, ``/proc``) fails before minutes of work, not after. ``files``: the names the
    report will write inside it; one that exists as something other than a writable file (a directory
    called ``report.md``) fails now too. ``ValueError`` names the path."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out}: is a file; give a directory for the report")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create the report directory ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: the report directory is not writable")
    refuse_taken_names(path, files, f"--out {out}: ")
    return path


def refuse_taken_names(directory: Path, names: Iterable[str], prefix: str = "") -> None:
    """``ValueError`` (``prefix`` + the path) for the first of ``names`` in ``directory`` that exists as
    something other than a writable regular file: a name taken by a directory would only fail when
    written, after the work and with part of the report already replaced."""
    for name in names:
        target = directory / name
        if target.exists() and not target.is_file():
            raise ValueError(f"{prefix}{target} exists and is not a regular file (a directory?); remove it or "
                             "write the report elsewhere")
        if target.exists() and not os.access(target, os.W_OK):
            raise ValueError(f"{prefix}{target} is not writable")
