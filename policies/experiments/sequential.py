"""Always-valid statistics for experiments: confidence sequences and the sample-ratio check.

A confidence sequence (CS) is a sequence of intervals that holds the true value at *every* sample
size at once with probability ``1 - alpha``. Reading it after every request and stopping as soon
as it excludes zero keeps the false-positive rate at ``alpha``; a fixed-sample t-test read that way
does not (peeking 50 times pushes a nominal 5% test past 25%).

Method: the *asymptotic confidence sequence* of Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas,
"Time-uniform central limit theory and asymptotic confidence sequences" (Annals of Statistics,
2024; arXiv:2103.06476), Theorem 2.2: the Gaussian-mixture boundary of Robbins with a plug-in
variance. For a mean over ``t`` observations with sample variance ``s²``::

    mean ± s · sqrt( 2(tρ² + 1) / (t²ρ²) · log( sqrt(tρ² + 1) / alpha ) )

which is the two-sided normal-mixture boundary (mixing distribution N(0, ρ²)), the same boundary
as the mixture sequential probability ratio test (mSPRT) of Johari, Koomen, Pekelis & Walsh,
"Always valid inference" (Operations Research, 2022). Writing ``V = s²/t`` for the variance of
the estimate and ``τ² = ρ²s²`` it reads ``± sqrt( V(V + τ²)/τ² · (2 log(1/alpha) + log((V + τ²)/V)) )``.

For a difference of two independent arms, ``V = s_T²/n_T + s_C²/n_C`` and the per-pair variance
is ``s² = s_T² + s_C²``, so the "intrinsic time" is ``t = s²/V`` (exactly ``n`` for balanced arms,
where this is the CS of the paired differences). ``ρ`` is the mixing parameter: it only decides at
which sample size the sequence is tightest (it stays valid for any ρ). :func:`rho_for_planned_n`
gives the ρ that minimises the width at a planned number of requests per arm (the paper's
Lambert-W closed form); the default plans for :data:`DEFAULT_PLANNED_N` per arm.

The guarantee is asymptotic (the plug-in variance must settle), so intervals below
:data:`MIN_SAMPLES` observations per arm are infinite rather than over-confident. Proportions use
the same boundary with a smoothed Bernoulli variance, so 0/n never yields a zero-width interval.

The sample-ratio check is Pearson's chi-square goodness-of-fit test of observed arm counts
against the configured weights (Fabijan et al., "Diagnosing Sample Ratio Mismatch in Online
Controlled Experiments", KDD 2019); the conventional threshold is ``p < 0.001``.

Everything here is pure arithmetic (numpy/scipy): no I/O, safe to import from the serving path.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

DEFAULT_ALPHA = 0.05
DEFAULT_PLANNED_N = 1000  # requests per arm the default ρ is tuned for
MIN_SAMPLES = 2  # per arm; fewer gives an infinite interval (no variance to plug in)

ArrayLike = Sequence[float] | np.ndarray


@dataclass(frozen=True)
class SequentialDiff:
    """An always-valid ``1 - alpha`` interval for ``treatment - control`` at the current sample size."""

    estimate: float
    lower: float
    upper: float
    n_treatment: int
    n_control: int
    alpha: float

    @property
    def significant(self) -> bool:
        """True when the interval excludes zero (``lower > 0`` or ``upper < 0``)."""
        return self.lower > 0 or self.upper < 0

    @property
    def half_width(self) -> float:
        """Half the interval's width (``inf`` while the interval is unbounded)."""
        return (self.upper - self.lower) / 2


@dataclass(frozen=True)
class SequentialPath:
    """A confidence sequence evaluated at many sample sizes (arrays of equal length)."""

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    n_treatment: np.ndarray
    n_control: np.ndarray
    alpha: float

    @property
    def significant(self) -> np.ndarray:
        """Boolean array: the interval excludes zero at that look."""
        return (self.lower > 0) | (self.upper < 0)

    def at(self, index: int) -> SequentialDiff:
        """The interval at one look as a :class:`SequentialDiff`."""
        return SequentialDiff(
            estimate=float(self.estimate[index]),
            lower=float(self.lower[index]),
            upper=float(self.upper[index]),
            n_treatment=int(self.n_treatment[index]),
            n_control=int(self.n_control[index]),
            alpha=self.alpha,
        )


@dataclass(frozen=True)
class SampleRatioCheck:
    """Observed arm counts against the configured weights; ``mismatch`` means assignment is broken."""

    counts: dict[str, int]
    expected_share: dict[str, float]
    p_value: float
    mismatch: bool


def rho_for_planned_n(planned_n: float, alpha: float = DEFAULT_ALPHA) -> float:
    """The mixing parameter ρ that makes the sequence tightest at ``planned_n`` observations (per arm).

    Closed form of Waudby-Smith et al. (2024): ``ρ² = (−W₋₁(−alpha² e^(alpha² − 1)) − 1) / t*``.
    """
    _check_alpha(alpha)
    if not planned_n > 0:
        raise ValueError(f"planned_n must be positive, got {planned_n}")
    w = special.lambertw(-(alpha**2) * math.exp(alpha**2 - 1), k=-1).real
    return math.sqrt((-w - 1) / planned_n)


def normal_mixture_margin(
    variance_of_estimate: np.ndarray | float,
    pair_variance: np.ndarray | float,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
) -> np.ndarray:
    """Half-width of the two-sided normal-mixture boundary, vectorised.

    ``variance_of_estimate`` is ``V`` (e.g. ``s_T²/n_T + s_C²/n_C``), ``pair_variance`` the variance
    of one unit (``s_T² + s_C²``); their ratio is the intrinsic time ``t``. ``V == 0`` gives 0,
    a non-finite input gives ``inf``.
    """
    _check_alpha(alpha)
    r2 = (rho if rho is not None else rho_for_planned_n(DEFAULT_PLANNED_N, alpha)) ** 2
    if not r2 > 0:
        raise ValueError(f"rho must be positive, got {rho}")
    v = np.asarray(variance_of_estimate, dtype=float)
    s2 = np.asarray(pair_variance, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t_r2 = (s2 / v) * r2  # tρ²
        margin = np.sqrt(v * (t_r2 + 1) / t_r2 * (2 * math.log(1 / alpha) + np.log1p(t_r2)))
    margin = np.where(v == 0, 0.0, margin)
    return np.where(np.isfinite(margin), margin, np.inf)


def mean_difference_path(
    n_treatment: ArrayLike,
    mean_treatment: ArrayLike,
    var_treatment: ArrayLike,
    n_control: ArrayLike,
    mean_control: ArrayLike,
    var_control: ArrayLike,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
) -> SequentialPath:
    """The CS for ``mean(treatment) - mean(control)`` from sufficient statistics, at many looks.

    Each argument is an array with one entry per look (counts, means and sample variances with
    ``ddof=1`` of the data seen so far); :func:`cumulative_stats` builds them from raw values.
    Looks with fewer than :data:`MIN_SAMPLES` per arm get an infinite interval.
    """
    nt = np.asarray(n_treatment, dtype=float)
    nc = np.asarray(n_control, dtype=float)
    vt = np.asarray(var_treatment, dtype=float)
    vc = np.asarray(var_control, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = np.asarray(mean_treatment, dtype=float) - np.asarray(mean_control, dtype=float)
        v = vt / nt + vc / nc
    margin = normal_mixture_margin(v, vt + vc, alpha=alpha, rho=rho)
    enough = (nt >= MIN_SAMPLES) & (nc >= MIN_SAMPLES) & np.isfinite(estimate) & np.isfinite(v)
    margin = np.where(enough, margin, np.inf)
    return SequentialPath(
        estimate=estimate,
        lower=np.where(enough, estimate - margin, -np.inf),
        upper=np.where(enough, estimate + margin, np.inf),
        n_treatment=nt.astype(int),
        n_control=nc.astype(int),
        alpha=alpha,
    )


def mean_path(
    n: ArrayLike,
    mean: ArrayLike,
    var: ArrayLike,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` of the one-sample CS for a mean at many looks (infinite below MIN_SAMPLES)."""
    nn = np.asarray(n, dtype=float)
    m = np.asarray(mean, dtype=float)
    v = np.asarray(var, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        margin = normal_mixture_margin(v / nn, v, alpha=alpha, rho=rho)
    enough = (nn >= MIN_SAMPLES) & np.isfinite(m) & np.isfinite(v)
    return np.where(enough, m - margin, -np.inf), np.where(enough, m + margin, np.inf)


def samples_to_detect(
    effect: float,
    var_treatment: float,
    var_control: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
    limit: int = 10**9,
) -> int:
    """Observations per arm at which the CS half-width shrinks to ``effect`` (balanced arms).

    A true difference of ``effect`` is then about as likely as not to be declared at that size;
    returns ``limit`` when even that many would not do (``effect`` ≤ 0 or no variance known).
    """
    s2 = var_treatment + var_control
    if not (effect > 0 and math.isfinite(s2)):
        return limit
    if s2 <= 0:
        return MIN_SAMPLES

    def margin(n: int) -> float:
        return float(normal_mixture_margin(s2 / n, s2, alpha=alpha, rho=rho))

    if margin(limit) > effect:
        return limit
    lo, hi = MIN_SAMPLES, MIN_SAMPLES
    while margin(hi) > effect:  # the margin decreases in n: double, then bisect
        lo, hi = hi, min(hi * 2, limit)
    while lo < hi:
        mid = (lo + hi) // 2
        if margin(mid) > effect:
            lo = mid + 1
        else:
            hi = mid
    return lo


def cumulative_stats(values: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Running ``(n, mean, variance)`` after each value (NaNs skipped; variance ``ddof=1``, nan below 2)."""
    x = np.asarray(values, dtype=float)
    present = np.isfinite(x)
    x0 = np.where(present, x, 0.0)
    n = np.cumsum(present)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.cumsum(x0) / n
        # Shifted sums keep the variance accurate when the values sit far from zero.
        shift = x[present][0] if present.any() else 0.0
        d = np.where(present, x - shift, 0.0)
        s1 = np.cumsum(d)
        s2 = np.cumsum(d * d)
        var = (s2 - s1 * s1 / n) / (n - 1)
    var = np.where(n >= 2, np.maximum(var, 0.0), np.nan)
    return n, mean, var


def mean_difference_cs(
    treatment: ArrayLike,
    control: ArrayLike,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
) -> SequentialDiff:
    """Always-valid ``1 - alpha`` CS for ``mean(treatment) - mean(control)`` (NaNs ignored).

    ``rho`` is the mixing parameter (see :func:`rho_for_planned_n`); fewer than
    :data:`MIN_SAMPLES` values in an arm gives an infinite interval, never an exception.
    """
    t = _finite(treatment)
    c = _finite(control)
    path = mean_difference_path(
        np.array([t.size]),
        np.array([t.mean() if t.size else np.nan]),
        np.array([t.var(ddof=1) if t.size >= 2 else np.nan]),
        np.array([c.size]),
        np.array([c.mean() if c.size else np.nan]),
        np.array([c.var(ddof=1) if c.size >= 2 else np.nan]),
        alpha=alpha,
        rho=rho,
    )
    return path.at(0)


def proportion_difference_path(
    successes_treatment: ArrayLike,
    n_treatment: ArrayLike,
    successes_control: ArrayLike,
    n_control: ArrayLike,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
) -> SequentialPath:
    """The CS for ``p_treatment - p_control`` at many looks (arrays of cumulative counts).

    The variance plugged in is that of the smoothed rate ``(s + 0.5)/(n + 1)``, so an arm with no
    successes (or only successes) still has a positive variance and a finite-width interval.
    """
    st = np.asarray(successes_treatment, dtype=float)
    nt = np.asarray(n_treatment, dtype=float)
    sc = np.asarray(successes_control, dtype=float)
    nc = np.asarray(n_control, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        pt_s = (st + 0.5) / (nt + 1)
        pc_s = (sc + 0.5) / (nc + 1)
        path = mean_difference_path(
            nt, st / nt, pt_s * (1 - pt_s), nc, sc / nc, pc_s * (1 - pc_s), alpha=alpha, rho=rho
        )
    # A difference of two rates lies in [-1, 1]: intersecting the interval with it keeps the coverage
    # and never reports a share change above 100 points.
    return dataclasses.replace(path, lower=np.clip(path.lower, -1.0, 1.0), upper=np.clip(path.upper, -1.0, 1.0))


def proportion_difference_cs(
    successes_treatment: int,
    n_treatment: int,
    successes_control: int,
    n_control: int,
    *,
    alpha: float = DEFAULT_ALPHA,
) -> SequentialDiff:
    """Always-valid ``1 - alpha`` CS for a difference of rates (e.g. error or strong-model share)."""
    for name, s, n in (("treatment", successes_treatment, n_treatment), ("control", successes_control, n_control)):
        if n < 0 or s < 0 or s > n:
            raise ValueError(f"{name}: successes must be in [0, n], got {s} of {n}")
    path = proportion_difference_path(
        np.array([successes_treatment]),
        np.array([n_treatment]),
        np.array([successes_control]),
        np.array([n_control]),
        alpha=alpha,
    )
    return path.at(0)


def sample_ratio_check(
    counts: Mapping[str, int],
    weights: Mapping[str, float],
    *,
    alpha: float = 0.001,
) -> SampleRatioCheck:
    """Chi-square test of arm counts against the weights; ``mismatch`` when ``p < alpha``.

    Arms are the union of both mappings. An arm that received requests but has no (or zero)
    weight is a mismatch by itself (p = 0). Fewer than two weighted arms or no requests: p = 1.
    """
    arms = sorted(set(counts) | set(weights))
    total_weight = sum(max(float(weights.get(a, 0.0)), 0.0) for a in arms)
    expected_share = {a: (max(float(weights.get(a, 0.0)), 0.0) / total_weight if total_weight else 0.0) for a in arms}
    observed = {a: int(counts.get(a, 0)) for a in arms}
    total = sum(observed.values())
    if total == 0 or total_weight == 0:
        return SampleRatioCheck(observed, expected_share, 1.0, False)
    if any(observed[a] > 0 and expected_share[a] == 0 for a in arms):
        return SampleRatioCheck(observed, expected_share, 0.0, True)
    weighted = [a for a in arms if expected_share[a] > 0]
    if len(weighted) < 2:
        return SampleRatioCheck(observed, expected_share, 1.0, False)
    obs = np.array([observed[a] for a in weighted], dtype=float)
    exp = np.array([expected_share[a] * total for a in weighted])
    p_value = float(stats.chisquare(obs, exp).pvalue)
    return SampleRatioCheck(observed, expected_share, p_value, p_value < alpha)


def _finite(values: ArrayLike) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
