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
non-asymptotic sequence instead (:func:`bounded_mean_path`): a betting confidence sequence (Waudby-Smith
& Ramdas 2024), a mixture of bets on the mean, which needs the bounds but no variance estimate, so it
keeps its promise for rates near 0 or 1, where the plug-in variance of the first few observations is
about 0, and is within 6-12% of the asymptotic width for scores in the middle of the range.

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
    variance estimate to be right, only the bounds: it is a betting confidence sequence (Waudby-Smith &
    Ramdas, "Estimating means of bounded random variables by betting", JRSS-B 2024). On the unit range,
    for a candidate mean ``μ`` and a bet ``λ`` in ``[0, 1/(1 - μ))``, the wealth::

        Π (1 + λ(μ - x_i))

    is a nonnegative martingale whenever the observations have mean ``μ``; so is any mixture of such
    bets with weights summing to at most 1 (:func:`_betting_mixture`: a grid of constant bets, the
    normal mixture's ρ for a few standard deviations, and bets of a fixed share of the most ``μ``
    allows, for rates at a bound), and so is its mirror on ``1 - x``. By Ville's inequality a candidate
    at which either mixture reaches ``2/alpha`` is ruled out with error at most ``alpha`` over all
    looks at once, and the interval is the candidates left.

    The wealth would need every observation; a lower bound needs only ``n``, the mean and the variance,
    so the path costs the same at 100 or 10⁶ requests and does not depend on their order. Among all
    samples on ``(-inf, 1]`` with a given mean and variance, ``Σ log(1 + λ(μ - x_i))`` (whose third
    derivative in ``x`` is negative) is smallest for the two-point sample with a share at 1 and the rest
    at one value below the mean (:func:`_two_point`): the quadratic through the log's value at 1 that
    touches it at the lower point lies below it on ``(-inf, 1]`` and has the same sum over both
    samples. For 0/1 values that sample is the data itself: the bound is exact for rates. A smaller
    wealth only widens the interval. ``var`` is the ``ddof=1`` sample variance of the values seen.
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
    mix = _betting_mixture(rho if rho is not None else rho_for_planned_n(DEFAULT_PLANNED_N, alpha))
    # On the unit range; a mean a rounding error outside it sits on the bound.
    unit = np.clip((np.where(enough, m, low) - low) / width, 0.0, 1.0).ravel()
    t = np.where(enough, nn, MIN_SAMPLES).ravel()
    # The population (ddof=0) variance, never above what a mean allows on the range (Bhatia-Davis).
    spread = (t - 1) / t * np.maximum(np.where(enough, v, 0.0), 0.0).ravel() / width**2
    spread = np.minimum(spread, unit * (1 - unit))
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


_CHUNK = 1 << 12  # looks per block of bounded_mean_path: arrays of CHUNK x bets floats stay in cache
_LAMBDA_MIN = 1e-3  # the smallest constant bet: the best λ at ~10⁷ observations of the widest spread
_LAMBDA_MAX = 1e3  # the largest (only allowed for candidates within 1/1000 of the top)
_LAMBDA_RATIO = 1.3  # a geometric grid of constant bets
_MAX_SHARE = 0.99  # a constant bet λ counts for a candidate μ only while λ(1 - μ) is at most this
# Standard deviations (as fractions of the range) the constant bets are tuned for, with their weights:
# spread-out data first (a rate near 50%), then uniform-ish scores, then scores bunched together.
_SPREADS = ((0.5, 0.3), (0.25, 0.3), (0.12, 0.4))
# Bets of a fixed share of all ``μ`` allows (λ = share/(1 - μ)), with their weights: the Kelly bets of
# rates at a bound (0 errors in 300 rules out 1.3% only with nearly all of it) and of very few requests.
_SHARE_BETS = ((0.3, 0.04), (0.6, 0.04), (0.85, 0.04), (0.97, 0.04), (0.995, 0.04))
_BISECTIONS = 8  # halvings of log(distance) from 10⁻¹⁰ of the room to all of it: a bracket within 9%
_SOLVER_STEPS = 6  # Illinois steps inside the bracket


@dataclass(frozen=True)
class _Mixture:
    """The bets (unit range) and log prior weights of :func:`bounded_mean_path`'s mixture."""

    lam: np.ndarray  # constant bets
    log_w: np.ndarray
    share: np.ndarray  # bets of a fixed share of the most a candidate allows
    share_log_w: np.ndarray

    @property
    def size(self) -> int:
        """How many bets the mixture has."""
        return int(self.lam.size + self.share.size)


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


def _betting_mixture(rho: float) -> _Mixture:
    """The prior of :func:`bounded_mean_path` for mixing parameter ``rho``: weights summing to 1.

    Any weights summing to at most 1 keep the guarantee; these only decide where the sequence is tight.
    """
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho}")
    shares = np.array([s for s, _ in _SHARE_BETS])
    share_w = np.array([w for _, w in _SHARE_BETS])
    lam, log_w = _half_normal_grid(rho, _LAMBDA_MIN, _LAMBDA_MAX, _SPREADS, 1 - float(share_w.sum()))
    return _Mixture(lam, log_w, shares, np.log(share_w))


def _two_point(m: np.ndarray, spread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(p, low)``: the sample with mean ``m`` and variance ``spread`` on ``(-inf, 1]`` that has ``p`` of it
    at 1 and the rest at ``low``."""
    room = 1 - m
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(room > 0, spread / (spread + room * room), 1.0)
        low = np.where(room > 0, m - spread / np.where(room > 0, room, 1.0), m)
    return np.where(np.isfinite(p), p, 1.0), low


def _log_wealth(mu: np.ndarray, p: np.ndarray, low: np.ndarray, t: np.ndarray, mix: _Mixture,
                threshold: float) -> np.ndarray:
    """Log of the mixture's wealth (its lower bound) against candidate means ``mu`` (< 1), less ``threshold``."""
    above = (1 - mu)[:, None]  # the most the observation at 1 can lose per unit bet
    gain = (mu - low)[:, None]  # what the lower point wins per unit bet
    p2, q2 = p[:, None], (1 - p)[:, None]
    t2 = t[:, None]
    risked = mix.lam * above
    per_step = p2 * np.log1p(-np.minimum(risked, _MAX_SHARE)) + q2 * np.log1p(mix.lam * gain)
    constant = (mix.log_w - threshold) + t2 * per_step
    fixed = (mix.share_log_w - threshold) + t2 * (p2 * np.log1p(-mix.share) + q2 * np.log1p(mix.share * (gain / above)))
    # Relative to the threshold the terms that matter are near 1: no max to subtract, only overflow to stop.
    total = (np.exp(np.minimum(constant, 700.0)) * (risked <= _MAX_SHARE)).sum(axis=1)
    total += np.exp(np.minimum(fixed, 700.0)).sum(axis=1)
    return np.asarray(np.log(total))


def _ruled_out_above(m: np.ndarray, t: np.ndarray, spread: np.ndarray, mix: _Mixture, threshold: float) -> np.ndarray:
    """Per look, the distance above the mean ``m`` (unit range) beyond which candidates are ruled out (at most 1 - m).

    Every bet's wealth grows with the candidate, and more bets are allowed as it grows, so the boundary
    is one root: bisected on a log scale to a bracket, then narrowed by Illinois (regula falsi) steps.
    The answer is always a distance verified to be ruled out (or the whole room), so stopping early
    only widens the interval.
    """
    room = 1 - m
    p, low = _two_point(m, spread)
    # Near the top (μ -> 1) any observation below it rules the candidate out; with none (m = 1) nothing does.
    inside = room <= 0
    safe = np.where(inside, 1.0, room)

    def excess(d: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return _log_wealth(m + d, p, low, t, mix, threshold)

    # log(d / room) in [log 1e-10, 0): the top end is ruled out (wealth unbounded as μ -> 1).
    a, b = np.full(m.shape, math.log(1e-10)), np.full(m.shape, math.log1p(-1e-12))
    f_hi = excess(safe * np.exp(b))
    inside |= ~(f_hi >= 0)  # checked, never assumed
    f_lo = np.full(m.shape, -threshold)  # at most this at the mean itself (each bet's log wealth is <= 0 there)
    for _ in range(_BISECTIONS):
        c = (a + b) / 2
        f_c = excess(safe * np.exp(c))
        out = f_c >= 0
        a, f_lo = np.where(out, a, c), np.where(out, f_lo, f_c)
        b, f_hi = np.where(out, c, b), np.where(out, f_c, f_hi)
    lo, hi = safe * np.exp(a), safe * np.exp(b)
    for _ in range(_SOLVER_STEPS):
        with np.errstate(invalid="ignore", divide="ignore"):
            x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        x = np.where(np.isfinite(x) & (x > lo) & (x < hi), x, (lo + hi) / 2)
        f_x = excess(x)
        out = f_x >= 0
        # Illinois: halve the value kept at the end that did not move, so the search never stalls there.
        lo, f_lo = np.where(out, lo, x), np.where(out, f_lo / 2, f_x)
        hi, f_hi = np.where(out, x, hi), np.where(out, f_x, f_hi / 2)
    # A bracket whose low end is already ruled out (below 10⁻¹⁰ of the room) keeps its verified high end.
    return np.where(inside, np.maximum(room, 0.0), np.minimum(hi, room))


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
