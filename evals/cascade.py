"""Offline evaluation of cascades: cost accounting, quality-vs-cost curves and cost-at-quality with CIs.

A routed pair has a weak (cheap) and a strong model; every prompt's outcome with either model is known
(0/1 quality per model) and so is the cost of one call to either (:class:`PairTable`). Policies:

- **Pre-answer routing** (:func:`router_curve`): a score computed from the prompt alone sends a prompt to
  the strong model (score >= threshold) or to the weak one. One call per prompt.
- **Cascade** (:func:`cascade_curve`): the weak model answers every prompt; an escalation score of that
  answer (e.g. 1 - answer confidence) sends it on to the strong model when >= threshold, whose answer is
  then served. Cost counts *every* call: the weak call always, the strong call when escalated.
- **Combined** (``cascade_curve(..., direct=mask)``): prompts in ``direct`` (e.g. the ones a pre-answer
  router calls clearly hard) go straight to the strong model (one strong call, no weak call); the rest are
  cascaded.
- **Random mix** (:func:`mix_curve`): always-weak and always-strong mixed at random; its expected
  (cost, quality) points lie on the segment between the two.

A curve holds one operating point per distinct threshold. :func:`cost_at_quality` reads the least mean
cost reaching a quality target from a curve's upper envelope, interpolating linearly between neighbouring
points (mixing two thresholds at random reaches every point on that segment; ``evals.metrics``).
:func:`bootstrap_costs` resamples prompts (paired across policies) for percentile intervals.

Costs: :class:`Prices` per million input / output tokens; :func:`estimate_tokens` counts tokens as
characters / 4 when no tokenizer of the priced model is at hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from evals.metrics import cost_at_quality as _envelope_cost_at_quality
from evals.metrics import percentile_ci

CHARS_PER_TOKEN = 4.0


def estimate_tokens(text: str) -> float:
    """Tokens of ``text`` estimated as characters / 4 (English prose with OpenAI-style BPE tokenizers)."""
    return len(text) / CHARS_PER_TOKEN


@dataclass(frozen=True)
class Prices:
    """USD per million input (prompt) and output (completion) tokens of one model."""

    input_per_mtok: float
    output_per_mtok: float

    def call_cost(
        self, prompt_tokens: Sequence[float] | np.ndarray | float, output_tokens: Sequence[float] | np.ndarray | float
    ) -> np.ndarray:
        """USD of calls with these token counts (element-wise)."""
        p = np.asarray(prompt_tokens, dtype=float)
        o = np.asarray(output_tokens, dtype=float)
        return np.asarray((p * self.input_per_mtok + o * self.output_per_mtok) / 1e6, dtype=float)


GPT4_1106_PRICES = Prices(10.0, 30.0)
MIXTRAL_8X7B_PRICES = Prices(0.6, 0.6)


@dataclass(frozen=True)
class PairTable:
    """Per prompt: each model's quality (0/1 or a score) and the cost of one call to it (row-aligned)."""

    strong_quality: np.ndarray
    weak_quality: np.ndarray
    strong_cost: np.ndarray
    weak_cost: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.strong_quality)
        for name in ("weak_quality", "strong_cost", "weak_cost"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows; strong_quality has {n}")

    def __len__(self) -> int:
        return len(self.strong_quality)

    def take(self, idx: np.ndarray) -> PairTable:
        """The rows ``idx`` (indices, repeats allowed, or a boolean mask)."""
        return PairTable(self.strong_quality[idx], self.weak_quality[idx], self.strong_cost[idx], self.weak_cost[idx])

    @property
    def strong_mean_quality(self) -> float:
        """Mean quality of always-strong."""
        return float(np.mean(self.strong_quality))

    @property
    def strong_mean_cost(self) -> float:
        """Mean cost of always-strong (the unit of relative costs)."""
        return float(np.mean(self.strong_cost))


@dataclass(frozen=True)
class Outcome:
    """Mean served quality and mean cost per prompt of one set of decisions, with the shares of calls made."""

    quality: float
    cost: float
    weak_calls: float  # share of prompts with a weak call
    strong_calls: float  # share of prompts with a strong call


def outcome(
    table: PairTable, *, weak_called: np.ndarray, strong_called: np.ndarray, served_strong: np.ndarray
) -> Outcome:
    """Quality and cost of per-prompt decisions: which calls were made and whose answer was served.

    Every call made is paid for, whether or not its answer is served (a cascade's escalated prompts
    pay the weak call too).

    Raises:
        ValueError: a served answer whose call was not made.
    """
    weak = np.asarray(weak_called, dtype=bool)
    strong = np.asarray(strong_called, dtype=bool)
    served = np.asarray(served_strong, dtype=bool)
    if (served & ~strong).any() or (~served & ~weak).any():
        raise ValueError("every served answer needs its call: served_strong without strong_called or weak unserved")
    quality = np.where(served, table.strong_quality, table.weak_quality)
    cost = weak * table.weak_cost + strong * table.strong_cost
    return Outcome(float(quality.mean()), float(cost.mean()), float(weak.mean()), float(strong.mean()))


@dataclass(frozen=True)
class Curve:
    """Operating points of one policy family, one per threshold (arrays aligned; sorted by ``strong_calls``).

    ``threshold[i]``: prompts scoring >= it took the policy's "strong" branch (``inf``: none did).
    """

    threshold: np.ndarray
    quality: np.ndarray
    cost: np.ndarray
    strong_calls: np.ndarray
    weak_calls: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def relative_cost(self, strong_cost: float) -> np.ndarray:
        """Costs as a share of always-strong's mean cost."""
        return self.cost / strong_cost


def _suffix_curve(
    scores: np.ndarray,
    base_quality: float,
    base_cost: float,
    d_quality: np.ndarray,
    d_cost: np.ndarray,
    fixed_strong: int,
    n: int,
    weak_calls: Callable[[np.ndarray], np.ndarray],
) -> Curve:
    """Points where the prompts scoring >= t switch branch: one per distinct score, plus 'none switched'."""
    order = np.argsort(-scores, kind="stable")
    s = scores[order]
    cq = np.concatenate([[0.0], np.cumsum(d_quality[order])])
    cc = np.concatenate([[0.0], np.cumsum(d_cost[order])])
    # k prompts switched, at the end of each tie group only (a threshold cannot split equal scores).
    ends = np.concatenate([[0], np.flatnonzero(np.diff(s) != 0) + 1, [len(s)]]) if len(s) else np.array([0])
    ends = np.unique(ends)
    thresholds = np.array([np.inf] + [float(s[k - 1]) for k in ends[1:]])
    k = ends.astype(float)
    return Curve(
        threshold=thresholds,
        quality=(base_quality + cq[ends]) / n,
        cost=(base_cost + cc[ends]) / n,
        strong_calls=(fixed_strong + k) / n,
        weak_calls=weak_calls(k) / n,
    )


def router_curve(table: PairTable, scores: np.ndarray) -> Curve:
    """Pre-answer routing: score >= threshold -> the strong model only, else the weak model only."""
    s = np.asarray(scores, dtype=float)
    n = len(table)
    return _suffix_curve(
        s,
        float(table.weak_quality.sum()),
        float(table.weak_cost.sum()),
        table.strong_quality - table.weak_quality,
        table.strong_cost - table.weak_cost,
        0,
        n,
        lambda k: n - k,
    )


def cascade_curve(table: PairTable, escalation: np.ndarray, direct: np.ndarray | None = None) -> Curve:
    """Cascade: the weak model answers every prompt not in ``direct``; escalation >= threshold adds a strong
    call whose answer is served. Prompts in ``direct`` (boolean mask) get one strong call and no weak call."""
    e = np.asarray(escalation, dtype=float)
    n = len(table)
    d = np.zeros(n, dtype=bool) if direct is None else np.asarray(direct, dtype=bool)
    free = ~d
    base_q = float(table.weak_quality[free].sum() + table.strong_quality[d].sum())
    base_c = float(table.weak_cost[free].sum() + table.strong_cost[d].sum())
    n_free = int(free.sum())
    return _suffix_curve(
        e[free],
        base_q,
        base_c,
        (table.strong_quality - table.weak_quality)[free],
        table.strong_cost[free],
        int(d.sum()),
        n,
        lambda _k: np.full(len(_k), float(n_free)),
    )


def mix_curve(table: PairTable) -> Curve:
    """Always-weak and always-strong: the random mix's expected points are the segment between them."""
    qs, qw = float(table.strong_quality.mean()), float(table.weak_quality.mean())
    cs, cw = float(table.strong_cost.mean()), float(table.weak_cost.mean())
    return Curve(
        threshold=np.array([np.inf, -np.inf]),
        quality=np.array([qw, qs]),
        cost=np.array([cw, cs]),
        strong_calls=np.array([0.0, 1.0]),
        weak_calls=np.array([1.0, 0.0]),
    )


def cost_at_quality(curve: Curve, target: float) -> float:
    """Least mean cost at which the curve reaches ``target`` quality (NaN when it never does)."""
    return _envelope_cost_at_quality(curve.cost.tolist(), curve.quality.tolist(), target)


def relative_cost_at(curve: Curve, table: PairTable, share_of_strong_quality: float) -> float:
    """Cost (as a share of always-strong's) to reach ``share`` x always-strong's mean quality."""
    return cost_at_quality(curve, share_of_strong_quality * table.strong_mean_quality) / table.strong_mean_cost


def direct_mask(router_scores: np.ndarray, threshold: float) -> np.ndarray:
    """Prompts a pre-answer router calls clearly hard: score strictly above ``threshold`` (``inf``: none)."""
    return np.asarray(router_scores, dtype=float) > threshold


@dataclass(frozen=True)
class PolicySpec:
    """A policy family evaluated on the same prompts: ``kind`` "route" (pre-answer scores), "cascade"
    (escalation scores, optional ``direct`` mask) or "mix" (the random mix; no scores)."""

    name: str
    kind: str
    scores: np.ndarray | None = None
    direct: np.ndarray | None = None

    def curve(self, table: PairTable, idx: np.ndarray | None = None) -> Curve:
        """The policy's curve on ``table`` (already subset to ``idx``) with its per-prompt inputs subset alike."""
        pick: Callable[[np.ndarray | None], np.ndarray | None] = lambda a: a if a is None or idx is None else a[idx]  # noqa: E731
        scores, direct = pick(self.scores), pick(self.direct)
        if self.kind == "mix":
            return mix_curve(table)
        if scores is None:
            raise ValueError(f"policy {self.name!r} of kind {self.kind!r} needs scores")
        if self.kind == "route":
            return router_curve(table, scores)
        if self.kind == "cascade":
            return cascade_curve(table, scores, direct)
        raise ValueError(f"unknown policy kind {self.kind!r}")


def bootstrap_costs(
    table: PairTable,
    policies: Sequence[PolicySpec],
    targets: Sequence[float],
    draws: int = 1000,
    seed: int = 0,
    progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
) -> dict[str, dict[float, np.ndarray]]:
    """Relative cost to reach each target share of strong quality, over ``draws`` resamples of the prompts.

    Paired: draw ``d`` uses the same prompts for every policy, so differences between policies have valid
    intervals too. The target and the cost unit are recomputed on each resample. NaN where a policy
    never reaches a target on a resample.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, dict[float, list[float]]] = {p.name: {t: [] for t in targets} for p in policies}
    loop: Iterable[int] = range(draws) if progress is None else progress(range(draws))
    n = len(table)
    for _ in loop:
        idx = rng.integers(0, n, n)
        sub = table.take(idx)
        for p in policies:
            c = p.curve(sub, idx)
            for t in targets:
                out[p.name][t].append(relative_cost_at(c, sub, t))
    return {name: {t: np.array(v) for t, v in per.items()} for name, per in out.items()}


def summarize_costs(
    table: PairTable,
    policies: Sequence[PolicySpec],
    boot: Mapping[str, Mapping[float, np.ndarray]],
    targets: Sequence[float],
) -> dict[str, dict[str, dict[str, float | list[float]]]]:
    """Point estimate (all prompts) and bootstrap 95% interval of each policy's relative cost per target."""
    out: dict[str, dict[str, dict[str, float | list[float]]]] = {}
    for p in policies:
        c = p.curve(table)
        per: dict[str, dict[str, float | list[float]]] = {}
        for t in targets:
            lo, hi = percentile_ci(boot[p.name][t])
            values = boot[p.name][t]
            per[f"{t:g}"] = {
                "relative_cost": relative_cost_at(c, table, t),
                "ci95": [lo, hi],
                "unreached_share": float(np.mean(~np.isfinite(values))) if len(values) else float("nan"),
            }
        out[p.name] = per
    return out


def choose_direct_share(
    table: PairTable,
    router_scores: np.ndarray,
    escalation: np.ndarray,
    shares: Sequence[float],
    target: float,
) -> tuple[float, dict[float, float]]:
    """The share of prompts a combined policy sends straight to the strong model (the top of ``router_scores``),
    chosen as the one with the least relative cost to reach ``target`` x strong quality on these rows.

    Meant for *training* rows with out-of-fold scores (never the rows the policy is then measured on).
    Returns the chosen share and every share's relative cost (NaN when the target is not reached).
    """
    costs: dict[float, float] = {}
    for share in shares:
        threshold = share_threshold(router_scores, share)
        curve = cascade_curve(table, escalation, direct_mask(router_scores, threshold))
        costs[share] = relative_cost_at(curve, table, target)
    finite = {k: v for k, v in costs.items() if np.isfinite(v)}
    best = min(finite, key=lambda k: (finite[k], k)) if finite else 0.0
    return best, costs


def share_threshold(scores: np.ndarray, share: float) -> float:
    """The score above which a ``share`` of ``scores`` lies (``inf`` for share 0): the (1 - share) quantile."""
    if share <= 0:
        return float("inf")
    return float(np.quantile(np.asarray(scores, dtype=float), 1.0 - share))


def fit_escalation_stack(features: np.ndarray, table: PairTable, alpha: float = 1.0) -> np.ndarray:
    """Ridge weights (last entry the intercept) predicting a cascade's per-prompt gain from escalating,
    strong quality - weak quality, from a few per-prompt scores (e.g. logit of answer confidence and a
    pre-answer router's score). Standardisation is the caller's business; fit on out-of-fold scores."""
    x = np.column_stack([np.asarray(features, dtype=float), np.ones(len(table))])
    y = table.strong_quality - table.weak_quality
    penalty = alpha * np.eye(x.shape[1])
    penalty[-1, -1] = 0.0
    return np.asarray(np.linalg.solve(x.T @ x + penalty, x.T @ y), dtype=float)


def apply_escalation_stack(features: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Escalation scores (predicted gain) of :func:`fit_escalation_stack`'s weights."""
    x = np.column_stack([np.asarray(features, dtype=float), np.ones(len(features))])
    return np.asarray(x @ weights, dtype=float)


__all__ = [
    "CHARS_PER_TOKEN",
    "GPT4_1106_PRICES",
    "MIXTRAL_8X7B_PRICES",
    "Curve",
    "Outcome",
    "PairTable",
    "PolicySpec",
    "Prices",
    "apply_escalation_stack",
    "bootstrap_costs",
    "cascade_curve",
    "choose_direct_share",
    "cost_at_quality",
    "direct_mask",
    "estimate_tokens",
    "fit_escalation_stack",
    "mix_curve",
    "outcome",
    "relative_cost_at",
    "router_curve",
    "share_threshold",
    "summarize_costs",
]
