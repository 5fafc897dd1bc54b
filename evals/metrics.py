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
- CPT(x) = the smallest strong-call share at which PGR reaches ``x`` (the paper's "minimum percentage of
  calls to the strong model required to achieve the desired PGR"): the first crossing of the curve,
  linear between its points, NaN when it never gets there (rules pin too many prompts weak). Where PGR
  rises along the curve this is RouteLLM's ``np.interp`` of share against quality; where it does not (a
  noisy curve on a few hundred prompts, a bootstrap resample, a pair whose weak model does better),
  ``np.interp`` needs increasing qualities and returns a share the curve does not pass through, and on a
  flat stretch at the target quality it returns the stretch's last share, not its first.
- Oracle: ``get_optimal_accuracy``: with a budget of k strong calls, send to the strong model the k
  prompts where it gains most (only those with a positive gain). Unlike RouteLLM's plot (nominal
  0, 10, ..., 100 % with k rounded down, which put it below a router on data where the strong model
  always wins), its curve is on a router's share grid (:func:`sweep_counts`), each point at k / n, so
  its APGR is at least that of any router whose scores are distinct.

Multi-model (RouterBench): a policy sweep gives (mean cost, mean quality) points; the helpers below read
quality at a given cost and cost at a given quality from the upper-left envelope of such points.

Report helpers (``pointsman eval``): the random router's band (random scores through the same sweep),
the cost-quality frontier (non-decreasing concave hull) and AIQ, RouterBench's average quality over a
cost range; calibration (reliability bins and ECE); paired bootstrap resampling (of rows, or of whole
prompts) with percentile intervals; inverse-propensity qualities for logged rows that only show the served
model's outcome.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CurvePoint:
    """One threshold of a pairwise router: share of strong calls in [0, 1], mean routed quality and,
    when per-request costs were given, mean routed cost (NaN otherwise)."""

    threshold: float
    strong_share: float
    quality: float
    cost: float = float("nan")


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


#: Below this mean quality gap PGR's denominator is too small for APGR/CPT to mean much, whatever the CI says.
SMALL_GAP = 0.02


@dataclass(frozen=True)
class QualityGap:
    """The strong model's mean quality minus the weak model's on some requests, with a 95% interval."""

    value: float
    lo: float
    hi: float

    @property
    def unresolved(self) -> bool:
        """True when the data cannot tell the two models apart: the interval reaches 0 (or there is none),
        or the gap is tiny."""
        return not (self.lo > 0 or self.hi < 0) or not abs(self.value) >= SMALL_GAP

    @property
    def inverted(self) -> bool:
        """True when the data tells the models apart the other way round: the *weak* model does better
        on average (PGR's denominator is negative, so PGR, APGR and CPT read upside down)."""
        return not self.unresolved and self.value < 0

    def warning(self) -> str | None:
        """One sentence for reports when :attr:`unresolved` or :attr:`inverted` (PGR divides by this
        gap), else ``None``."""
        if self.inverted:
            return (
                f"the weak model does better than the strong one on these requests (strong minus weak "
                f"{self.value:+.3f} [95% CI {self.lo:+.3f}, {self.hi:+.3f}]): PGR, APGR and CPT divide by that "
                "negative gap and read upside down (a router that sends the strong model the prompts it wins "
                "scores below zero); judge this pair by the quality the route reaches at each strong-call "
                "share, or name the pair the other way round"
            )
        if not self.unresolved:
            return None
        return (
            f"the two models' mean qualities are not told apart on these requests (strong minus weak "
            f"{self.value:+.3f} [95% CI {self.lo:+.3f}, {self.hi:+.3f}]): PGR, APGR and CPT divide by that gap, "
            "so they swing wildly and mean little here; judge this pair by the quality and cost a route gets "
            "(pointsman eval's knob row) or label more requests"
        )


def quality_gap(strong_quality: np.ndarray, weak_quality: np.ndarray, level: float = 0.95) -> QualityGap:
    """Mean paired gap ``strong - weak`` over the rows where both are known, with a t-interval (NaN bounds
    below 2 rows)."""
    from scipy.stats import t

    diff = np.asarray(strong_quality, dtype=float) - np.asarray(weak_quality, dtype=float)
    diff = diff[np.isfinite(diff)]
    if len(diff) == 0:
        return QualityGap(float("nan"), float("nan"), float("nan"))
    mean = float(diff.mean())
    if len(diff) < 2:  # no spread to estimate an interval from
        return QualityGap(mean, float("nan"), float("nan"))
    half = float(t.ppf(0.5 + level / 2, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff)))
    return QualityGap(mean, mean - half, mean + half)


def _qcut_edges(scores: np.ndarray, num_results: int) -> np.ndarray:
    # pd.qcut(x, q) computes x.quantile(np.linspace(0, 1, q + 1)) with linear interpolation.
    return np.quantile(scores, np.linspace(0.0, 1.0, num_results + 1), method="linear")


def routing_curve(
    scores: Sequence[float] | np.ndarray,
    strong_quality: Sequence[float] | np.ndarray,
    weak_quality: Sequence[float] | np.ndarray,
    num_results: int = 10,
    *,
    pinned: Sequence[int] | np.ndarray | None = None,
    strong_cost: Sequence[float] | np.ndarray | None = None,
    weak_cost: Sequence[float] | np.ndarray | None = None,
) -> list[CurvePoint]:
    """RouteLLM's threshold sweep: one point per qcut edge of the scores.

    ``pinned`` (optional, per prompt: +1 strong, -1 weak, 0 scored) holds prompts whose model does not
    depend on the threshold (a policy rule routed them); the edges are then the quantiles of the other
    prompts' scores, and pinned prompts keep their model at every point. ``strong_cost``/``weak_cost``
    (per prompt) add each point's mean cost.
    """
    s = np.asarray(scores, dtype=float)
    qs, qw = np.asarray(strong_quality, dtype=float), np.asarray(weak_quality, dtype=float)
    pins = np.zeros(len(s), dtype=int) if pinned is None else np.asarray(pinned, dtype=int)
    free = pins == 0
    costs = None
    if strong_cost is not None and weak_cost is not None:
        costs = np.asarray(strong_cost, dtype=float), np.asarray(weak_cost, dtype=float)
    edges = _qcut_edges(s[free], num_results) if free.any() else np.array([np.inf])
    # One sort instead of a mask per threshold: with the free prompts' scores ascending, the prompts
    # at or above threshold t are a suffix, so each point is a suffix sum (">" for the last edge).
    n = len(s)
    order = np.argsort(s[free], kind="stable")
    fs = s[free][order]
    gain = (qs - qw)[free][order]
    suffix_gain = np.concatenate([np.cumsum(gain[::-1])[::-1], [0.0]])
    pinned_strong = pins > 0
    base_q = float(qw.sum() + (qs - qw)[pinned_strong].sum())
    if costs is not None:
        cgain = (costs[0] - costs[1])[free][order]
        suffix_cost = np.concatenate([np.cumsum(cgain[::-1])[::-1], [0.0]])
        base_c = float(costs[1].sum() + (costs[0] - costs[1])[pinned_strong].sum())
    points = []
    for i, t in enumerate(edges):
        first = int(np.searchsorted(fs, t, side="left" if i != len(edges) - 1 else "right"))
        strong_n = len(fs) - first + int(pinned_strong.sum())
        cost = (base_c + suffix_cost[first]) / n if costs is not None else float("nan")
        points.append(CurvePoint(float(t), strong_n / n, float((base_q + suffix_gain[first]) / n), float(cost)))
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
    """Average performance gap recovered (RouteLLM's ``apgr_metric``); NaN when the two models tie
    (``strong == weak``) or the curve spans no strong-call shares (every prompt pinned by a rule)."""
    x, _ = _sorted(curve)
    weak_auc = float(np.trapezoid(np.full(len(x), weak), x))
    strong_auc = float(np.trapezoid(np.full(len(x), strong), x))
    if strong_auc == weak_auc:
        return float("nan")
    return (auc(curve) - weak_auc) / (strong_auc - weak_auc)


def cpt(
    curve: Sequence[CurvePoint], pgr_target: float, strong: float, weak: float, *, never: float = float("nan")
) -> float:
    """The smallest strong-call share (0-1) at which the curve's PGR reaches ``pgr_target``, linear between
    its points; ``never`` (default NaN) when it never does, NaN when ``strong == weak`` (PGR is undefined).
    ``never=math.inf`` tells the two apart (a bootstrap counts the resamples that never reach the target).

    Equal to RouteLLM's ``pct_call_metric`` (``np.interp`` of share against quality) wherever quality
    increases along the curve; unlike it, right where it does not (see the module docstring)."""
    if strong == weak or not np.isfinite(strong - weak):
        return float("nan")
    x, y = _sorted(curve)
    if len(x) == 0:
        return float("nan")
    p = (y - weak) / (strong - weak)
    # A point whose PGR is the target up to rounding (0.7999999999999999) reaches it.
    reached = np.flatnonzero(p >= pgr_target - 1e-9 * max(1.0, abs(pgr_target)))
    if len(reached) == 0:
        return never
    i = int(reached[0])
    if i == 0 or p[i] <= pgr_target:
        return float(x[i])
    # p[i - 1] < target < p[i]: the crossing lies on the segment between the two points.
    return float(x[i - 1] + (pgr_target - p[i - 1]) / (p[i] - p[i - 1]) * (x[i] - x[i - 1]))


def oracle_quality(strong_quality: np.ndarray, weak_quality: np.ndarray, strong_share: float) -> float:
    """Best mean quality reachable with ``strong_share`` of calls on the strong model (``get_optimal_accuracy``)."""
    qs, qw = np.asarray(strong_quality, dtype=float), np.asarray(weak_quality, dtype=float)
    gain = np.sort(qs - qw)[::-1]
    k = min(int(np.floor(len(gain) * strong_share + 1e-9)), int((gain > 0).sum()))
    return float((qw.sum() + gain[:k].sum()) / len(qw))


def sweep_counts(n: int, num_results: int = 10) -> list[int]:
    """How many of ``n`` prompts go strong at each point of :func:`routing_curve`'s sweep when every score
    is distinct: at the ``i/num_results`` quantile edge (linear interpolation: sorted index
    ``i/num_results * (n - 1)``) the prompts at or above it, ``n - ceil(index)``; none at the last edge.

    The oracle is plotted at these counts, on the same share grid as a router's curve: at each point it
    has at least the quality of any router making that many strong calls, so its APGR is at least
    theirs. Integer arithmetic: the sweep's own float quantiles can land one prompt either side of an
    exact index (0.7000000000000001 * 1000), depending on the scores' scale.
    """
    if n <= 0:
        return [0] * (num_results + 1)
    return [n + (-i * (n - 1) // num_results) for i in range(num_results)] + [0]


def oracle_curve(
    strong_quality: np.ndarray,
    weak_quality: np.ndarray,
    steps: int = 10,
    *,
    strong_cost: np.ndarray | None = None,
    weak_cost: np.ndarray | None = None,
) -> list[CurvePoint]:
    """The oracle on the share grid of :func:`routing_curve` with ``steps`` bins (:func:`sweep_counts`):
    about 100, 90, ..., 0 % strong calls, each share the exact number of strong calls over ``n``.

    With a budget of k strong calls the oracle sends the k prompts where the strong model gains most,
    leaving out those where it gains nothing (``get_optimal_accuracy``). Each point is plotted at the
    share it was computed for (RouteLLM plots the nominal 0, 10, ..., 100 % but rounds the number of
    strong calls down, which put the oracle below a router on data where the strong model always wins).
    With per-prompt costs, each point's cost is that of the oracle's assignment."""
    qs, qw = np.asarray(strong_quality, dtype=float), np.asarray(weak_quality, dtype=float)
    n = len(qs)
    gain = qs - qw
    order = np.argsort(-gain, kind="stable")  # best gains first (oracle_assignment's order)
    useful = int((gain > 0).sum())
    cum_gain = np.concatenate([[0.0], np.cumsum(gain[order])])
    cum_cost = None
    if strong_cost is not None and weak_cost is not None:
        sc, wc = np.asarray(strong_cost, dtype=float), np.asarray(weak_cost, dtype=float)
        cum_cost = np.concatenate([[0.0], np.cumsum((sc - wc)[order])]) + wc.sum()
    points = []
    for budget in sweep_counts(n, steps):
        k = min(budget, useful)
        share = budget / n if n else 0.0
        quality = float((qw.sum() + cum_gain[k]) / n) if n else float("nan")
        cost = float(cum_cost[k] / n) if cum_cost is not None and n else float("nan")
        points.append(CurvePoint(float("nan"), share, quality, cost))
    return points


def oracle_assignment(strong_quality: np.ndarray, weak_quality: np.ndarray, strong_share: float) -> np.ndarray:
    """Which prompts the oracle sends strong with a budget of ``strong_share`` strong calls (a boolean mask)."""
    gain = np.asarray(strong_quality, dtype=float) - np.asarray(weak_quality, dtype=float)
    order = np.argsort(-gain, kind="stable")
    k = min(int(np.floor(len(gain) * strong_share + 1e-9)), int((gain > 0).sum()))
    sel = np.zeros(len(gain), dtype=bool)
    sel[order[:k]] = True
    return sel


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


# ---------------------------------------------------------------- pairwise report helpers


def random_curves(
    strong_quality: np.ndarray,
    weak_quality: np.ndarray,
    draws: int = 1000,
    seed: int = 0,
    *,
    pinned: np.ndarray | None = None,
    num_results: int = 10,
    progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
    groups: Sequence[object] | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random router on this data: ``draws`` routers with uniform random scores, through the same
    threshold sweep. Returns (APGR per draw, strong share per point, quality per draw and point).

    Its APGR is 0.5 in expectation (without ``pinned``); the spread of the draws is the band a real router
    must clear. ``pinned`` (as :func:`routing_curve`'s) keeps the prompts a rule routed on their model, as in
    the route's own curve; with every prompt pinned the APGRs are NaN. ``groups`` (per row, the prompt): one
    score per prompt, as any router scores a prompt the same every time it comes (a score per row let the
    copies of a repeated prompt split and the band was too narrow); every group distinct draws as without.
    """
    qs, qw = np.asarray(strong_quality, dtype=float), np.asarray(weak_quality, dtype=float)
    strong, weak = float(qs.mean()), float(qw.mean())
    codes, m = group_codes(groups, len(qs))
    rng = np.random.default_rng(seed)
    apgrs = np.empty(draws)
    qualities = np.empty((draws, num_results + 1))
    shares = np.zeros(num_results + 1)
    loop: Iterable[int] = range(draws) if progress is None else progress(range(draws))
    for d in loop:
        curve = routing_curve(rng.random(m)[codes], qs, qw, num_results, pinned=pinned)
        # Every prompt pinned: one point (no threshold moves anything), so no APGR.
        spread = max(p.strong_share for p in curve) > min(p.strong_share for p in curve)
        apgrs[d] = apgr(curve, strong, weak) if strong != weak and spread else float("nan")
        qualities[d] = [p.quality for p in curve]  # one point broadcasts to every column
        shares += np.array([p.strong_share for p in curve]) / draws
    return apgrs, shares, qualities


def upper_frontier(costs: Sequence[float], qualities: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The non-decreasing concave hull of (cost, quality) operating points (RouterBench's frontier).

    Mixing two operating points at random reaches any point on the segment between them, so the
    achievable frontier is the upper concave hull; past its best point more cost buys nothing, so it
    stays flat (non-decreasing).
    """
    c, q = np.asarray(costs, dtype=float), np.asarray(qualities, dtype=float)
    ok = np.isfinite(c) & np.isfinite(q)
    pts = sorted(set(zip(c[ok].tolist(), q[ok].tolist(), strict=True)))
    hull: list[tuple[float, float]] = []
    for p in pts:
        # Monotone chain, upper part: drop the last point while it lies on or below the new chord.
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        if hull and hull[-1][0] == p[0]:
            hull[-1] = (p[0], max(p[1], hull[-1][1]))
        else:
            hull.append(p)
    xs = np.array([h[0] for h in hull])
    ys = np.maximum.accumulate(np.array([h[1] for h in hull])) if hull else np.array([])
    return xs, ys


def aiq(costs: Sequence[float], qualities: Sequence[float], cost_min: float, cost_max: float) -> float:
    """Average improvement in quality (RouterBench): the mean of the frontier's quality over the cost
    range [cost_min, cost_max] (area under :func:`upper_frontier` divided by the range's width).

    Below the frontier's cheapest point the quality is that point's quality only if it costs no more
    than ``cost_min``; callers include the always-weak and always-strong points so the frontier spans
    the range. NaN when the range is empty.
    """
    if not cost_max > cost_min:
        return float("nan")
    x, y = upper_frontier(costs, qualities)
    if len(x) == 0:
        return float("nan")
    grid = np.unique(np.clip(np.concatenate([x, [cost_min, cost_max]]), cost_min, cost_max))
    values = np.interp(grid, x, y, left=np.nan, right=float(y[-1]))
    if np.isnan(values).any():
        return float("nan")
    return float(np.trapezoid(values, grid) / (cost_max - cost_min))


@dataclass(frozen=True)
class ReliabilityBin:
    """One bin of a reliability diagram: predictions in [lo, hi)."""

    lo: float
    hi: float
    count: int
    mean_predicted: float  # NaN for an empty bin
    observed: float  # share of positives; NaN for an empty bin


def reliability(probabilities: np.ndarray, outcomes: np.ndarray, bins: int = 10) -> list[ReliabilityBin]:
    """Equal-width bins over [0, 1] (the last one closed) with the mean prediction and the observed rate."""
    p, y = np.asarray(probabilities, dtype=float), np.asarray(outcomes, dtype=float)
    index = np.clip((p * bins).astype(int), 0, bins - 1)
    out = []
    for b in range(bins):
        m = index == b
        n = int(m.sum())
        out.append(ReliabilityBin(
            b / bins, (b + 1) / bins, n,
            float(p[m].mean()) if n else float("nan"), float(y[m].mean()) if n else float("nan"),
        ))
    return out


def ece(probabilities: np.ndarray, outcomes: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: the count-weighted mean |mean prediction - observed rate| over bins."""
    table = reliability(probabilities, outcomes, bins)
    n = sum(b.count for b in table)
    if n == 0:
        return float("nan")
    return float(sum(b.count * abs(b.mean_predicted - b.observed) for b in table if b.count) / n)


def bootstrap(
    stat: Callable[[np.ndarray], Mapping[str, float]],
    n: int,
    draws: int = 1000,
    seed: int = 0,
    progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
    *,
    groups: Sequence[object] | np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """``stat`` on ``draws`` resamples (with replacement) of the ``n`` rows' indices.

    ``groups`` (per row, e.g. the prompt) makes it a cluster bootstrap: each draw picks as many groups as
    there are, with replacement, and takes every row of each, so rows that are not independent (one prompt
    logged many times, several judgments of one prompt) move together and the interval is not too narrow.
    With every group distinct it draws exactly the rows a plain row bootstrap draws.

    Returns every key's values over the draws (paired: draw ``d`` of every key used the same rows, so
    differences between keys have valid intervals too). ``progress`` may wrap the draw loop (tqdm).
    """
    rng = np.random.default_rng(seed)
    resample = _row_resampler(n) if groups is None else _group_resampler(groups, n)
    values: dict[str, list[float]] = {}
    loop: Iterable[int] = range(draws)
    if progress is not None:
        loop = progress(loop)
    for _ in loop:
        for key, value in stat(resample(rng)).items():
            values.setdefault(key, []).append(float(value))
    return {key: np.array(v) for key, v in values.items()}


def resample_counts(
    n: int, draws: int, seed: int = 0, *, groups: Sequence[object] | np.ndarray | None = None
) -> Iterable[np.ndarray]:
    """How many times each of the ``n`` rows is in each of :func:`bootstrap`'s resamples (the same draws
    for the same ``seed`` and ``groups``), for statistics that read a resample as row weights."""
    rng = np.random.default_rng(seed)
    resample = _row_resampler(n) if groups is None else _group_resampler(groups, n)
    for _ in range(draws):
        yield np.bincount(resample(rng), minlength=n)


class ResampledApgr:
    """APGR of many resamples of one router's scores, the scores sorted once.

    ``apgr(counts)`` equals ``evaluate_scores(scores[idx], strong[idx], weak[idx]).apgr`` for a resample
    ``idx`` that holds row ``i`` ``counts[i]`` times (up to the order floating-point sums are added in),
    and NaN where :func:`evals.retrain.safe_apgr` is NaN (fewer than two rows, the models tie on
    average). Sorting each resample's scores was most of a bootstrap's time: at 500,000 rows ~120 ms
    a draw, against a few ms here (weighted suffix sums over the presorted rows, the qcut edges read off
    the cumulative counts).
    """

    def __init__(
        self, scores: np.ndarray, strong_quality: np.ndarray, weak_quality: np.ndarray, num_results: int = 10
    ) -> None:
        s = np.asarray(scores, dtype=float)
        self._order = np.argsort(s, kind="stable")
        self._scores = s[self._order]
        self._strong = np.asarray(strong_quality, dtype=float)[self._order]
        self._weak = np.asarray(weak_quality, dtype=float)[self._order]
        self._gain = self._strong - self._weak
        self._probs = np.linspace(0.0, 1.0, num_results + 1)

    def apgr(self, counts: np.ndarray) -> float:
        """APGR of the resample holding row ``i`` (in the scores' original order) ``counts[i]`` times."""
        c = np.asarray(counts)[self._order]
        cum = np.cumsum(c)
        m = int(cum[-1]) if len(cum) else 0
        if m < 2:
            return float("nan")
        w = c.astype(float)
        weak_sum = float(w @ self._weak)
        strong, weak = float(w @ self._strong) / m, weak_sum / m
        if abs(strong - weak) < 1e-12:
            return float("nan")
        edges = self._edges(cum, m)
        # Only the suffixes at the edges are needed: each is the total minus a prefix (one cumsum, no
        # reversed copies), which differs from a suffix sum only in the last bits.
        prefix_gain = np.cumsum(w * self._gain)
        total_gain = float(prefix_gain[-1])
        points = []
        for i, t in enumerate(edges):
            # As routing_curve: at or above the threshold goes strong (above, for the last edge).
            first = int(np.searchsorted(self._scores, t, side="left" if i != len(edges) - 1 else "right"))
            before_gain = float(prefix_gain[first - 1]) if first else 0.0
            before_count = int(cum[first - 1]) if first else 0
            points.append(CurvePoint(float(t), (m - before_count) / m,
                                     (weak_sum + total_gain - before_gain) / m, float("nan")))
        return apgr(points, strong, weak)

    def _edges(self, cum: np.ndarray, m: int) -> np.ndarray:
        # np.quantile(expanded, probs, method="linear") without expanding: element k of the expanded
        # sorted scores is the sorted row whose cumulative count first exceeds k.
        virtual = self._probs * (m - 1)
        lower = np.clip(np.floor(virtual), 0, m - 1)
        upper = np.clip(lower + 1, 0, m - 1)
        # Integer keys: float ones would make searchsorted convert the whole int array each call.
        a = self._scores[np.searchsorted(cum, lower.astype(cum.dtype), side="right")]
        b = self._scores[np.searchsorted(cum, upper.astype(cum.dtype), side="right")]
        t = virtual - lower
        out = a + (b - a) * t  # numpy's _lerp, both halves, so the edges are the same floats
        return np.where(t >= 0.5, b - (b - a) * (1 - t), out)


def _row_resampler(n: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.integers(0, n, n)


def group_codes(groups: Sequence[object] | np.ndarray | None, n: int) -> tuple[np.ndarray, int]:
    """Each row's group number (numbered by first appearance, so every row its own group numbers them
    0, 1, ...) and the number of groups; no ``groups``: every row its own. ``ValueError`` when there are
    not ``n`` labels."""
    if groups is None:
        return np.arange(n), n
    labels = np.asarray(groups, dtype=object)
    if len(labels) != n:
        raise ValueError(f"groups has {len(labels)} labels for {n} rows")
    first: dict[object, int] = {}
    codes = np.array([first.setdefault(label, len(first)) for label in labels.tolist()], dtype=np.int64)
    return codes, len(first)


def _group_resampler(groups: Sequence[object] | np.ndarray, n: int) -> Callable[[np.random.Generator], np.ndarray]:
    """Draws of whole groups as row indices. Groups are numbered by first appearance, so with every row
    its own group, group ``g`` is row ``g`` and the draws are the row bootstrap's."""
    codes, m = group_codes(groups, n)
    order = np.argsort(codes, kind="stable")  # rows of group 0, then group 1, ...
    sizes = np.bincount(codes, minlength=m)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])

    def draw(rng: np.random.Generator) -> np.ndarray:
        picked = rng.integers(0, m, m)
        lengths = sizes[picked]
        # Row j of the draw is the (j - offset)-th row of its group: offsets restart at each picked group.
        offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
        return order[np.repeat(starts[picked], lengths) + np.arange(int(lengths.sum())) - offsets]

    return draw


def percentile_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap values (NaN draws ignored)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(v, [tail, 100 - tail])
    return float(lo), float(hi)


def censored_percentile_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """The central ``level`` percentile interval of bootstrap values where ``+inf`` means "never" (a CPT
    whose curve never reaches its target in that resample) and NaN "undefined" (left out), with the share
    of the defined values that are "never".

    "Never" ranks above every value (it would take more than all the calls), so a bound that falls among the
    "never" draws is ``inf``: the upper bound is finite only when at most ``(1 - level) / 2`` of the
    resamples never reach the target, the lower one when fewer than ``1 - (1 - level) / 2`` do. Without any
    "never" this is :func:`percentile_ci`. Dropping them instead reported an interval over the resamples that
    happened to reach the target, hiding that many did not. All NaN: ``(nan, nan, nan)``.
    """
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    never = np.isposinf(v)
    share = float(never.mean())
    if share == 0.0:
        return (*percentile_ci(v, level), 0.0)
    top = float(v[~never].max()) if (~never).any() else 0.0
    # A stand-in above every value: a percentile landing on it, or between it and the top value, is "never".
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(np.where(never, top + 1.0, v), [tail, 100 - tail])
    return (float(lo) if lo <= top else math.inf), (float(hi) if hi <= top else math.inf), share


def ips_qualities(
    served_strong: np.ndarray, reward: np.ndarray, propensity: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-propensity versions of (strong quality, weak quality) for logged rows that only show
    the served model's outcome.

    The served model's column gets ``reward / propensity`` and the other column 0, so the mean of
    ``where(policy_says_strong, qs, qw)`` over the rows is the IPS estimate of the policy's mean
    quality (unbiased when every propensity is the logging policy's true probability and > 0).
    """
    served = np.asarray(served_strong, dtype=bool)
    value = np.asarray(reward, dtype=float) / np.asarray(propensity, dtype=float)
    return np.where(served, value, 0.0), np.where(served, 0.0, value)
