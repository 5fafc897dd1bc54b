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
where this is the CS of the paired differences). With unequal arms ``V`` is never taken below the pooled
variance's (:func:`pooled_floor`): the small arm's plug-in variance is too small early on, exactly when
its mean is off. ``ρ`` is the mixing parameter: it only decides at
which sample size the sequence is tightest (it stays valid for any ρ). :func:`rho_for_planned_n`
gives the ρ that minimises the width at a planned number of requests per arm (the paper's
Lambert-W closed form); the default plans for :data:`DEFAULT_PLANNED_N` per arm.

The guarantee is asymptotic (the plug-in variance must settle), so intervals below
:data:`MIN_SAMPLES` observations per arm are infinite rather than over-confident. Proportions use
the same boundary with a smoothed Bernoulli variance, so 0/n never yields a zero-width interval.

Means of a *bounded* metric (scores in [0, 1], or costs within the range an experiment saw) get the
same protection when their ``bounds`` are given (:func:`bounded_variance`): the plug-in variance is
that of the sample plus one pseudo-observation split evenly between the two bounds (a half at each:
the distribution of largest variance on the range, a weak prior worth one observation). For 0/1 data
this is exactly the proportions' ``(s + 0.5)/(n + 1)`` smoothing. Scores that did not vary in ``n``
observations then have a variance of order ``(upper - lower)²/n`` instead of 0, so the interval has a
positive width at every finite ``n`` and still shrinks as ``n`` grows (about as ``√log(n)/n`` then,
faster than the ``1/√n`` of varied scores). The smoothed variance is never below the sample variance
and tends to it as ``n`` grows, so the plug-in estimate stays consistent and the asymptotic
guarantee keeps its form; bounds known in advance also clip the interval to what they allow.

A single arm's mean with bounds known in advance (quality in [0, 1], an error rate) gets a
non-asymptotic sequence instead (:func:`bounded_mean_path`): empirical-Bernstein and Bernoulli bets
mixed over their size, which need the bounds but no variance estimate, so they keep their promise for
rates near 0 or 1, where the plug-in variance of the first few observations is about 0.

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
# Two means whose difference is within this fraction of their size are equal: the rest is the
# rounding of summing n floats (about n x 1e-16 relative), not data (-$6.8e-21 between equal costs).
ROUNDING = 1e-9

ArrayLike = Sequence[float] | np.ndarray
Bounds = tuple[float, float]


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
    bounds: Bounds | None = None,
    clip: bool = True,
) -> SequentialPath:
    """The CS for ``mean(treatment) - mean(control)`` from sufficient statistics, at many looks.

    Each argument is an array with one entry per look (counts, means and sample variances with
    ``ddof=1`` of the data seen so far); :func:`cumulative_stats` builds them from raw values.
    Looks with fewer than :data:`MIN_SAMPLES` per arm get an infinite interval. ``bounds``, the
    range every observation lies in, smooths each arm's variance (:func:`bounded_variance`: no
    zero-width interval from values that did not vary) and, with ``clip``, the interval is clipped to
    ``±(upper - lower)``; without it the sample variances are plugged in as they are. Pass
    ``clip=False`` when the bounds were read from the data rather than known in advance (a cost's
    observed range): they then only set the smoothing's scale, and the true mean may lie outside.
    """
    nt = np.asarray(n_treatment, dtype=float)
    nc = np.asarray(n_control, dtype=float)
    mt = np.asarray(mean_treatment, dtype=float)
    mc = np.asarray(mean_control, dtype=float)
    vt = np.asarray(var_treatment, dtype=float)
    vc = np.asarray(var_control, dtype=float)
    if bounds is not None:
        vt = bounded_variance(nt, mt, vt, bounds)
        vc = bounded_variance(nc, mc, vc, bounds)
    vt, vc = pooled_floor(nt, vt, nc, vc)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = mt - mc
        v = vt / nt + vc / nc
    # Equal means that differ only by float rounding are equal (else "-$6.8e-21 per request" is shown).
    estimate = np.where(np.abs(estimate) <= ROUNDING * np.maximum(np.abs(mt), np.abs(mc)), 0.0, estimate)
    margin = normal_mixture_margin(v, vt + vc, alpha=alpha, rho=rho)
    enough = (nt >= MIN_SAMPLES) & (nc >= MIN_SAMPLES) & np.isfinite(estimate) & np.isfinite(v)
    margin = np.where(enough, margin, np.inf)
    lower, upper = estimate - margin, estimate + margin
    if bounds is not None and clip:
        # A difference of two means in [a, b] lies in [-(b - a), b - a]: intersecting keeps the coverage.
        span = _span(bounds)
        lower, upper = np.maximum(lower, -span), np.minimum(upper, span)
    return SequentialPath(
        estimate=estimate,
        lower=np.where(enough, lower, -np.inf),
        upper=np.where(enough, upper, np.inf),
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
    bounds: Bounds | None = None,
    clip: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` of the one-sample CS for a mean at many looks (infinite below MIN_SAMPLES).

    With ``bounds`` known in advance (``clip``: every observation, past and future, lies in them) the
    interval is :func:`bounded_mean_path`'s, valid at every sample size for any distribution on the
    range. Without bounds, or with bounds read from the data (``clip=False``: a cost's observed range,
    which the true mean may exceed), it is the asymptotic normal-mixture CS, its variance smoothed as
    :func:`bounded_variance` does when ``bounds`` are given.
    """
    if bounds is not None and clip:
        return bounded_mean_path(n, mean, var, bounds, alpha=alpha, rho=rho)
    nn = np.asarray(n, dtype=float)
    m = np.asarray(mean, dtype=float)
    v = np.asarray(var, dtype=float)
    if bounds is not None:
        v = bounded_variance(nn, m, v, bounds)
    with np.errstate(divide="ignore", invalid="ignore"):
        margin = normal_mixture_margin(v / nn, v, alpha=alpha, rho=rho)
    enough = (nn >= MIN_SAMPLES) & np.isfinite(m) & np.isfinite(v)
    lower, upper = m - margin, m + margin
    return np.where(enough, lower, -np.inf), np.where(enough, upper, np.inf)


def bounded_mean_path(
    n: ArrayLike,
    mean: ArrayLike,
    var: ArrayLike,
    bounds: Bounds,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` of a non-asymptotic CS for the mean of observations within ``bounds``, at many looks.

    The asymptotic CS plugs in the sample variance, which is about 0 exactly when an early mean sits
    on a bound (20 thumbs down in a row at a true rate of 2%): read after every request, its per-arm
    interval missed a rate of 0.02 or 0.98 in 12-16% of experiments at alpha 5%. This one needs no
    variance estimate to be right, only the bounds (the empirical-Bernstein supermartingale of Howard,
    Ramdas, McAuliffe & Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
    Annals of Statistics 2021, Theorem 4, with the candidate mean as its predictor). On the unit range,
    for a candidate mean ``μ`` and ``λ`` in ``[0, 1)``::

        exp( λ Σ(x_i - μ) - ψ(λ) Σ(x_i - μ)² ),   ψ(λ) = -log(1 - λ) - λ

    is a nonnegative supermartingale whenever the observations have mean ``μ`` (each factor is at most
    ``1 + λ(x_i - μ)``: Fan, Grama & Liu, Stochastic Processes and their Applications 2015), and so is
    its mirror with ``μ - x_i``. Both depend on the data only through ``n``, the mean and the variance
    (``Σ(x_i - μ)² = (n - 1)s² + n(mean - μ)²``), so the path costs the same at 100 or 10⁶ requests.
    Each is mixed over a grid of ``λ`` (:func:`_lambda_mixture`: the normal mixture's ρ for a few
    standard deviations); by Ville's inequality a candidate at which either mixture reaches ``2/alpha``
    is ruled out with error at most ``alpha`` over all looks at once, and the interval is the candidates
    left. ``var`` is the ``ddof=1`` sample variance of the values seen (a larger one only widens it).
    """
    _check_alpha(alpha)
    nn = np.asarray(n, dtype=float)
    low, width = float(min(bounds)), _span(bounds)
    m = np.asarray(mean, dtype=float)
    v = np.asarray(var, dtype=float)
    nn, m, v = np.broadcast_arrays(nn, m, v)
    enough = (nn >= MIN_SAMPLES) & np.isfinite(m) & np.isfinite(v)
    if not (width > 0 and math.isfinite(width)):
        # No range to be uncertain over: every observation, so the mean, is the one value allowed.
        point = np.full(m.shape, low)
        return np.where(enough, point, -np.inf), np.where(enough, point, np.inf)
    mix = _mixture(rho if rho is not None else rho_for_planned_n(DEFAULT_PLANNED_N, alpha))
    # On the unit range; a mean a rounding error outside it sits on the bound.
    unit = np.clip((np.where(enough, m, low) - low) / width, 0.0, 1.0).ravel()
    t = np.where(enough, nn, MIN_SAMPLES).ravel()
    spread = (t - 1) * np.maximum(np.where(enough, v, 0.0), 0.0).ravel() / width**2  # Σ(x_i - mean)²
    threshold = math.log(2 / alpha)
    lower, upper = np.empty_like(unit), np.empty_like(unit)
    for start in range(0, unit.size, _CHUNK):
        part = slice(start, start + _CHUNK)
        # The lower end is the upper end of the mirrored data (1 - x has mean 1 - m and the same spread).
        upper[part] = unit[part] + _ruled_out_above(unit[part], t[part], spread[part], mix, threshold)
        lower[part] = unit[part] - _ruled_out_above(1 - unit[part], t[part], spread[part], mix, threshold)
    shape = m.shape
    lower = np.clip(low + lower.reshape(shape) * width, low, low + width)
    upper = np.clip(low + upper.reshape(shape) * width, low, low + width)
    return np.where(enough, lower, -np.inf), np.where(enough, upper, np.inf)


_CHUNK = 1 << 12  # looks per block of bounded_mean_path: arrays of CHUNK x grid floats stay in cache (larger
# blocks spent as long again in the kernel, mapping fresh memory for each temporary)
_EB_LAMBDA_MAX = 0.5  # every empirical-Bernstein term then grows with the distance, over the whole range
_BERNOULLI_LAMBDA_MAX = 8.0  # a bet of nearly all the wealth on the mean being below the candidate
_EB_LAMBDA_MIN = 1e-3  # the best λ at 10⁷ observations of the widest spread
_BERNOULLI_LAMBDA_MIN = 1e-2  # smaller bets are the empirical-Bernstein terms' (a rate's spread is known by then)
_LAMBDA_RATIO = 1.4  # a geometric grid: the interval's width changed < 1% from a 1.15 grid's
# Standard deviations (as fractions of the range) each family is tuned for, with their weights. The
# empirical-Bernstein terms serve spread-out data, widest first (a rate near 50%), then narrower
# scores whose best λ is larger; the Bernoulli terms serve data bunched at a bound (a rate near 0 or 1),
# whose best λ is larger still (0 of 20 rules out a rate of 0.2 only with λ of a few).
_EB_SPREADS = ((0.5, 0.6), (0.25, 0.25), (0.125, 0.15))
_BERNOULLI_SPREADS = ((0.25, 0.4), (0.06, 0.3), (0.02, 0.3))
_EB_SHARE = 0.5  # of the prior on the empirical-Bernstein family; the rest on the Bernoulli one
_SOLVER_STEPS = 4  # Illinois steps inside the bracket: within ~0.3% of the exact boundary


@dataclass(frozen=True)
class _Mixture:
    """The λ grids (unit range) and log prior weights of the two families of :func:`bounded_mean_path`."""

    eb_lambda: np.ndarray
    eb_log_w: np.ndarray
    eb_psi: np.ndarray  # ψ(λ) = -log(1 - λ) - λ
    b_log_w: np.ndarray
    b_log_keep: np.ndarray  # log(1 - q) = -λ: what a Bernoulli bet keeps of the wealth on an observation of 1
    b_q: np.ndarray  # q = 1 - e^(-λ)

    @property
    def size(self) -> int:
        """How many terms the mixture has."""
        return int(self.eb_lambda.size + self.b_q.size)


def _half_normal_grid(
    rho: float, bottom: float, top: float, spreads: tuple[tuple[float, float], ...], share: float
) -> tuple[np.ndarray, np.ndarray]:
    """A geometric λ grid from ``bottom`` to ``top`` and log weights: each spread's half-normal binned onto it,
    scaled to ``share``.

    For a spread ``σ`` the normal mixture of :func:`normal_mixture_margin` mixes ``λσ`` over a normal of
    standard deviation ``ρ``; the mass below ``bottom`` goes to the first point, beyond ``top`` to the last.
    """
    steps = math.ceil(math.log(top / bottom) / math.log(_LAMBDA_RATIO))
    lam = top / _LAMBDA_RATIO ** np.arange(steps, -1, -1, dtype=float)
    edges = np.r_[0.0, np.sqrt(lam[:-1] * lam[1:]), np.inf]
    weights = share * np.asarray(sum(w * np.diff(stats.halfnorm.cdf(edges, scale=rho / sd)) for sd, w in spreads))
    keep = weights > 0
    return lam[keep], np.log(weights[keep])


def _mixture(rho: float) -> _Mixture:
    """The prior of :func:`bounded_mean_path` for mixing parameter ``rho``: weights summing to 1.

    Any weights summing to at most 1 keep the guarantee; these only decide where the sequence is tight.
    """
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho}")
    eb, eb_w = _half_normal_grid(rho, _EB_LAMBDA_MIN, _EB_LAMBDA_MAX, _EB_SPREADS, _EB_SHARE)
    b, b_w = _half_normal_grid(rho, _BERNOULLI_LAMBDA_MIN, _BERNOULLI_LAMBDA_MAX, _BERNOULLI_SPREADS, 1 - _EB_SHARE)
    return _Mixture(eb, eb_w, -np.log1p(-eb) - eb, b_w, -b, -np.expm1(-b))


def _log_wealth(d: np.ndarray, m: np.ndarray, t: np.ndarray, spread: np.ndarray, mix: _Mixture,
                threshold: float) -> np.ndarray:
    """Log of the mixture against a candidate ``d`` above the mean ``m`` (unit range), less ``threshold``."""
    eb = (mix.eb_log_w - threshold) + mix.eb_lambda * (t * d)[:, None] - mix.eb_psi * (spread + t * d * d)[:, None]
    # The Bernoulli bet: t(m log(1 - q) - log(1 - μq)) at the candidate μ = m + d.
    per_step = m[:, None] * mix.b_log_keep - np.log1p(-(m + d)[:, None] * mix.b_q)
    bern = (mix.b_log_w - threshold) + t[:, None] * per_step
    # Relative to the threshold the terms that matter are near 1: no max to subtract, only overflow to stop.
    total = np.exp(np.minimum(eb, 700.0)).sum(axis=1) + np.exp(np.minimum(bern, 700.0)).sum(axis=1)
    with np.errstate(divide="ignore"):
        return np.asarray(np.log(total))


def _ruled_out_above(m: np.ndarray, t: np.ndarray, spread: np.ndarray, mix: _Mixture, threshold: float) -> np.ndarray:
    """Per look, the distance above the mean ``m`` (unit range) beyond which candidates are ruled out (at most 1 - m).

    Every term grows with the candidate (λ ≤ 1/2 for the empirical-Bernstein ones, as d ≤ 1), so the
    boundary is one root. One term alone reaching ``threshold`` rules a candidate out (the mixture is
    larger), and no term reaching ``threshold - log(terms)`` leaves it in: both are roots in closed
    form, a bracket that an Illinois (regula falsi) search narrows. The answer is always a distance
    verified to be ruled out (or the whole room), so stopping early only widens the interval.
    """
    room = 1 - m

    def first_root(level: float) -> np.ndarray:
        # Empirical Bernstein: ψt·d² - λt·d + c ≤ 0, its smaller root written to keep its digits when c is
        # small against b (NaN, no root, is skipped by fmin).
        c = mix.eb_psi * spread[:, None] + (level - mix.eb_log_w)
        b = mix.eb_lambda * t[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            eb = np.fmin.reduce(2 * np.maximum(c, 0.0) / (b + np.sqrt(b * b - 4 * mix.eb_psi * t[:, None] * c)), axis=1)
            # Bernoulli: -log(1 - μq) ≥ g, so μ ≥ (1 - e^(-g))/q.
            g = (level - mix.b_log_w) / t[:, None] - m[:, None] * mix.b_log_keep
            bern = (-np.expm1(-g) / mix.b_q).min(axis=1) - m
        return np.fmin(np.fmin(eb, np.maximum(bern, 0.0)), room)

    hi = first_root(threshold)
    lo = np.minimum(first_root(threshold - math.log(mix.size)), hi)
    f_hi = _log_wealth(hi, m, t, spread, mix, threshold)
    f_lo = _log_wealth(lo, m, t, spread, mix, threshold)
    inside = f_hi < 0  # not even the end of the range is ruled out
    for _ in range(_SOLVER_STEPS):
        with np.errstate(invalid="ignore", divide="ignore"):
            x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        x = np.where(np.isfinite(x) & (x > lo) & (x < hi), x, (lo + hi) / 2)
        f_x = _log_wealth(x, m, t, spread, mix, threshold)
        out = f_x >= 0
        # Illinois: halve the value kept at the end that did not move, so the search never stalls there.
        lo, f_lo = np.where(out, lo, x), np.where(out, f_lo / 2, f_x)
        hi, f_hi = np.where(out, x, hi), np.where(out, f_x, f_hi / 2)
    return np.where(inside, room, hi)


def pooled_floor(
    n_treatment: ArrayLike, var_treatment: ArrayLike, n_control: ArrayLike, var_control: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Both arms' variances, scaled up together so the difference's variance is never below the pooled one.

    With unequal arms the smaller arm's variance dominates ``V = s_T²/n_T + s_C²/n_C``, and a plug-in
    variance from few observations of skewed values (thumbs at 90%, a rare error, a model that is
    seldom picked) is too small exactly when its mean is off: 25 thumbs up in a row make the small arm's
    variance near 0 and its mean 1. Read after every request, a 90/10 split then declared a winner
    between identical arms in 10-15% of experiments at alpha 5%. The pooled variance
    ``((n_T - 1)s_T² + (n_C - 1)s_C²)/(n_T + n_C - 2)`` is the common variance when the arms do not
    differ, estimated from both; ``V`` is raised to ``pooled x (1/n_T + 1/n_C)`` when that is larger.
    Balanced arms are unchanged (both are the same then), and the result is never below the plug-in
    ``V`` (so the asymptotic guarantee holds for any difference). Scaling both variances by one factor
    keeps the intrinsic time ``(s_T² + s_C²)/V`` of :func:`normal_mixture_margin` as it was.
    """
    nt = np.asarray(n_treatment, dtype=float)
    nc = np.asarray(n_control, dtype=float)
    vt = np.asarray(var_treatment, dtype=float)
    vc = np.asarray(var_control, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = ((nt - 1) * vt + (nc - 1) * vc) / (nt + nc - 2)
        factor = pooled * (1 / nt + 1 / nc) / (vt / nt + vc / nc)
    # Where the ratio is undefined (no variance yet, or both 0) the variances stay as they are.
    factor = np.where(np.isfinite(factor), np.maximum(factor, 1.0), 1.0)
    return vt * factor, vc * factor


def bounded_variance(n: ArrayLike, mean: ArrayLike, var: ArrayLike, bounds: Bounds) -> np.ndarray:
    """The plug-in variance of ``n`` observations within ``bounds``, smoothed so it is never 0.

    The sample (``n`` values with this mean and ``ddof=1`` variance) gets one pseudo-observation,
    half of it at each bound: the same weak prior as the proportions' ``(s + 0.5)/(n + 1)``, which
    this reduces to for 0/1 data. The result is the larger of the augmented sample's variance and
    the plain sample variance, so smoothing only ever widens an interval; the pseudo-observation's
    share is ``1/(n + 1)``, so the result tends to the sample variance (the plug-in stays consistent).
    Constant values give about ``(upper - lower)² (m² + (1 - m)²) / (2(n + 1))`` with ``m`` the mean's
    position in the range. Where the variance is unknown (NaN) it stays NaN; bounds of zero width
    leave the variance as it is (there is no range to be uncertain over).
    """
    nn = np.asarray(n, dtype=float)
    v = np.asarray(var, dtype=float)
    width = _span(bounds)
    if not (width > 0 and math.isfinite(width)):
        return v
    with np.errstate(divide="ignore", invalid="ignore"):
        m = (np.asarray(mean, dtype=float) - min(bounds)) / width  # the mean's position in [0, 1]
        ss = (nn - 1) * v / width**2  # the sum of squared deviations, on the unit range
        smoothed_mean = (nn * m + 0.5) / (nn + 1)
        # Deviations about the augmented mean: the data's (moved by the shift of the mean) and the
        # half-observations' at 0 and 1, over the total weight n + 1.
        augmented = (ss + nn * (m - smoothed_mean) ** 2 + 0.5 * smoothed_mean**2
                     + 0.5 * (1 - smoothed_mean) ** 2) / (nn + 1)
    return np.asarray(np.maximum(augmented * width**2, v))  # NaN (unknown) stays NaN


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
    n = np.cumsum(present)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Shifted sums keep the mean and variance accurate when the values sit far from zero (and
        # exact when every value is the same, where a plain running sum drifts in the last bits).
        shift = x[present][0] if present.any() else 0.0
        d = np.where(present, x - shift, 0.0)
        s1 = np.cumsum(d)
        s2 = np.cumsum(d * d)
        mean = np.where(n > 0, shift + s1 / n, np.nan)
        var = (s2 - s1 * s1 / n) / (n - 1)
    var = np.where(n >= 2, np.maximum(var, 0.0), np.nan)
    return n, mean, var


def mean_difference_cs(
    treatment: ArrayLike,
    control: ArrayLike,
    *,
    alpha: float = DEFAULT_ALPHA,
    rho: float | None = None,
    bounds: Bounds | None = None,
    clip: bool = True,
) -> SequentialDiff:
    """Always-valid ``1 - alpha`` CS for ``mean(treatment) - mean(control)`` (NaNs ignored).

    ``rho`` is the mixing parameter (see :func:`rho_for_planned_n`); fewer than
    :data:`MIN_SAMPLES` values in an arm gives an infinite interval, never an exception.
    ``bounds`` and ``clip``: the range every value lies in (see :func:`mean_difference_path`).
    """
    t = _finite(treatment)
    c = _finite(control)
    path = mean_difference_path(
        np.array([t.size]),
        np.array([shifted_mean(t)]),
        np.array([t.var(ddof=1) if t.size >= 2 else np.nan]),
        np.array([c.size]),
        np.array([shifted_mean(c)]),
        np.array([c.var(ddof=1) if c.size >= 2 else np.nan]),
        alpha=alpha,
        rho=rho,
        bounds=bounds,
        clip=clip,
    )
    return path.at(0)


def shifted_mean(values: np.ndarray) -> float:
    """The mean of finite ``values``, summed as offsets from the first: exact when they are all equal.

    A plain sum of 22 costs of $2.5e-05 divided by 22 is off in the last bit, and two arms with the
    same constant cost would then differ by a few 1e-21.
    """
    if not values.size:
        return math.nan
    shift = float(values[0])
    return shift + float(np.mean(values - shift))


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


def _span(bounds: Bounds) -> float:
    """The width of ``bounds`` (given in either order)."""
    return float(max(bounds) - min(bounds))


def _finite(values: ArrayLike) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
