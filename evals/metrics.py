"""Routing quality metrics.

Pairwise (strong vs weak), exactly as RouteLLM defines them in ``routellm/evals/evaluate.py`` and
``routellm/evals/benchmarks.py`` (github.com/lm-sys/RouteLLM, commit 0b64fdaf):

- A router gives each prompt a score (its estimate that the strong model is needed / wins). The
  thresholds are the ``num_results``-quantile bin edges of the scores (``pd.qcut(scores, 10,
  retbins=True)``: 11 edges at quantiles 0, 0.1, ..., 1 with linear interpolation). For every edge but
  the last a prompt goes to the strong model when ``score >= threshold``; for the last edge when
  ``score > threshold`` (so the curve reaches 0 % strong calls).
- Each threshold yields a point (strong-call share, mean quality of the routed answers).
- PGR(q) = (q - weak) / (strong - weak), with weak/strong the quality of always-weak/always-strong.
- APGR = (AUC - weak_auc) / (strong_auc - weak_auc), AUC by the trapezoid rule of quality over the
  strong-call share in [0, 1] (points sorted by share), weak_auc/strong_auc the same integral of the
  constant weak/strong quality over the same points.
- CPT(x) = the strong-call share at which quality reaches ``weak + x * (strong - weak)``, by linear
  interpolation of share against quality (``np.interp``, as RouteLLM; it needs quality to increase along
  the curve, which holds for any router that is not worse than random by a wide margin).
- Oracle: ``get_optimal_accuracy``: with a budget of k strong calls, send to the strong model the k
  prompts where it gains most (only those with a positive gain).

Multi-model (RouterBench): a policy sweep gives (mean cost, mean quality) points; the helpers below read
quality at a given cost and cost at a given quality from the upper-left envelope of such points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CurvePoint:
    """One threshold of a pairwise router: share of strong calls in [0, 1] and mean routed quality."""

    threshold: float
    strong_share: float
    quality: float


@dataclass(frozen=True)
class PairMetrics:
    """Summary of a pairwise router on one data set."""

    apgr: float
    cpt50: float  # strong-call share (0-1) needed for PGR 0.5
    cpt80: float
    auc: float
    curve: tuple[CurvePoint, ...]


def pgr(quality: float, strong: float, weak: float) -> float:
    """Performance gap recovered."""
    return (quality - weak) / (strong - weak)


def _qcut_edges(scores: np.ndarray, num_results: int) -> np.ndarray:
    # pd.qcut(x, q) computes x.quantile(np.linspace(0, 1, q + 1)) with linear interpolation.
    return np.quantile(scores, np.linspace(0.0, 1.0, num_results + 1), method="linear")


def routing_curve(
    scores: Sequence[float] | np.ndarray,
    strong_quality: Sequence[float] | np.ndarray,
    weak_quality: Sequence[float] | np.ndarray,
    num_results: int = 10,
) -> list[CurvePoint]:
    """RouteLLM's threshold sweep: one point per qcut edge of the scores."""
    s = np.asarray(scores, dtype=float)
    qs, qw = np.asarray(strong_quality, dtype=float), np.asarray(weak_quality, dtype=float)
    edges = _qcut_edges(s, num_results)
    points = []
    for i, t in enumerate(edges):
        sel = s >= t if i != len(edges) - 1 else s > t
        points.append(CurvePoint(float(t), float(sel.mean()), float(np.where(sel, qs, qw).mean())))
    return points


def _sorted(curve: Sequence[CurvePoint]) -> tuple[np.ndarray, np.ndarray]:
    # Stable sort by share, as ``DataFrame.sort_values(by="strong_percentage")`` on the threshold order.
    pts = sorted(enumerate(curve), key=lambda ip: (ip[1].strong_share, ip[0]))
    return np.array([p.strong_share for _, p in pts]), np.array([p.quality for _, p in pts])


def auc(curve: Sequence[CurvePoint]) -> float:
    """Trapezoid area of quality over strong-call share."""
    x, y = _sorted(curve)
    return float(np.trapezoid(y, x))


def apgr(curve: Sequence[CurvePoint], strong: float, weak: float) -> float:
    """Average performance gap recovered (RouteLLM's ``apgr_metric``)."""
    x, _ = _sorted(curve)
    weak_auc = float(np.trapezoid(np.full(len(x), weak), x))
    strong_auc = float(np.trapezoid(np.full(len(x), strong), x))
    return (auc(curve) - weak_auc) / (strong_auc - weak_auc)


def cpt(curve: Sequence[CurvePoint], pgr_target: float, strong: float, weak: float) -> float:
    """Strong-call share (0-1) needed to reach PGR ``pgr_target`` (RouteLLM's ``pct_call_metric``)."""
    x, y = _sorted(curve)
    return float(np.interp(pgr_target * (strong - weak) + weak, y, x))


def oracle_quality(strong_quality: np.ndarray, weak_quality: np.ndarray, strong_share: float) -> float:
    """Best mean quality reachable with ``strong_share`` of calls on the strong model (``get_optimal_accuracy``)."""
    qs, qw = np.asarray(strong_quality, dtype=float), np.asarray(weak_quality, dtype=float)
    gain = np.sort(qs - qw)[::-1]
    k = min(int(np.floor(len(gain) * strong_share + 1e-9)), int((gain > 0).sum()))
    return float((qw.sum() + gain[:k].sum()) / len(qw))


def oracle_curve(strong_quality: np.ndarray, weak_quality: np.ndarray, steps: int = 10) -> list[CurvePoint]:
    """The oracle at shares 0, 1/steps, ..., 1 (RouteLLM plots it at 0, 10, ..., 100 %)."""
    return [
        CurvePoint(float("nan"), i / steps, oracle_quality(strong_quality, weak_quality, i / steps))
        for i in range(steps + 1)
    ]


def summarize(curve: Sequence[CurvePoint], strong: float, weak: float) -> PairMetrics:
    """APGR, CPT(50%), CPT(80%) and AUC of one curve."""
    return PairMetrics(
        apgr=apgr(curve, strong, weak),
        cpt50=cpt(curve, 0.5, strong, weak),
        cpt80=cpt(curve, 0.8, strong, weak),
        auc=auc(curve),
        curve=tuple(curve),
    )


def evaluate_scores(
    scores: np.ndarray, strong_quality: np.ndarray, weak_quality: np.ndarray, num_results: int = 10
) -> PairMetrics:
    """Score a router's per-prompt scores on one data set."""
    strong, weak = float(np.mean(strong_quality)), float(np.mean(weak_quality))
    return summarize(routing_curve(scores, strong_quality, weak_quality, num_results), strong, weak)


# ---------------------------------------------------------------- multi-model frontier


def upper_envelope(costs: Sequence[float], qualities: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The non-dominated (cost ascending, quality strictly ascending) points of a set of policies."""
    order = np.lexsort((-np.asarray(qualities, dtype=float), np.asarray(costs, dtype=float)))
    xs: list[float] = []
    ys: list[float] = []
    for i in order:
        c, q = float(costs[i]), float(qualities[i])
        if not ys or q > ys[-1]:
            xs.append(c)
            ys.append(q)
    return np.array(xs), np.array(ys)


def quality_at_cost(costs: Sequence[float], qualities: Sequence[float], budget: float) -> float:
    """Best quality the policy family reaches at mean cost <= ``budget`` (linear between envelope points,
    i.e. mixing two neighbouring operating points); NaN when even the cheapest point costs more."""
    x, y = upper_envelope(costs, qualities)
    if len(x) == 0 or budget < x[0]:
        return float("nan")
    return float(np.interp(budget, x, y))


def cost_at_quality(costs: Sequence[float], qualities: Sequence[float], target: float) -> float:
    """Least mean cost at which the policy family reaches ``target`` quality; NaN when it never does."""
    x, y = upper_envelope(costs, qualities)
    if len(y) == 0 or target > y[-1]:
        return float("nan")
    if target <= y[0]:
        return float(x[0])
    return float(np.interp(target, y, x))
