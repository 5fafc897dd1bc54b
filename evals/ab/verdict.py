"""The plain-language verdict for one treatment arm against control, from always-valid intervals.

Order of precedence: a sample-ratio mismatch voids everything ("do not trust"); a quality interval
that excludes zero names the winner (with the cost difference beside it); an interval inside
``±min_effect`` says there is no difference worth having; anything else is "not enough data yet",
with how many more requests per arm would shrink the interval to the difference that matters.
Because the intervals are confidence *sequences*, the verdict may be read after every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from policies.experiments.sequential import SampleRatioCheck, SequentialDiff, samples_to_detect

VerdictKind = Literal["srm", "better", "worse", "no_difference", "not_enough_data"]
MAX_SCORE_VARIANCE = 0.25  # a score in [0, 1] has at most this variance (the unknown-variance stand-in)


@dataclass(frozen=True)
class ArmVerdict:
    """What the report says about one treatment arm (``winner`` is an arm name or None)."""

    arm: str
    control: str
    kind: VerdictKind
    text: str
    winner: str | None = None
    more_requests_per_arm: int | None = None
    detectable_difference: float | None = None


def winner(diff: SequentialDiff) -> Literal["treatment", "control"] | None:
    """Which side the interval declares better, or None while it covers zero."""
    if diff.lower > 0:
        return "treatment"
    if diff.upper < 0:
        return "control"
    return None


def fmt_diff(diff: SequentialDiff, digits: int = 3) -> str:
    """``estimate [lower, upper]`` with infinite bounds shown as ±inf."""

    def f(v: float) -> str:
        if math.isnan(v):
            return "n/a"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else f"{v:+.{digits}f}"

    return f"{f(diff.estimate)} [{f(diff.lower)}, {f(diff.upper)}]"


def fmt_money(v: float) -> str:
    """A USD amount with enough digits for per-request costs."""
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"${v:.3g}" if v >= 0 else f"-${-v:.3g}"


def cost_phrase(cost: SequentialDiff | None) -> str:
    """How the treatment's cost per request compares (always-valid interval)."""
    if cost is None or math.isnan(cost.estimate):
        return "cost per request unknown"
    bounds = f"[{fmt_money(cost.lower)}, {fmt_money(cost.upper)}]"
    side = winner(cost)
    if side == "treatment":
        return f"costs {fmt_money(cost.estimate)} more per request {bounds}"
    if side == "control":
        return f"costs {fmt_money(-cost.estimate)} less per request {bounds}"
    return f"no cost difference detected ({fmt_money(cost.estimate)} per request {bounds})"


def arm_verdict(
    arm: str,
    control: str,
    quality: SequentialDiff,
    cost: SequentialDiff | None,
    *,
    source: str,
    min_effect: float,
    var_treatment: float,
    var_control: float,
    coverage: float,
    rho: float,
    srm: SampleRatioCheck | None = None,
) -> ArmVerdict:
    """The verdict on ``arm`` against ``control`` from the quality and cost intervals.

    ``coverage`` is the share of requests that carry a score of ``source`` (at most 1): "more
    requests" counts requests, of which only that share will bring a score. ``var_*`` are the
    score variances per arm (NaN while unknown: the largest possible is assumed). "Not enough
    data" names the requests that would detect ``min_effect`` and, when the difference seen so far
    is larger, how many would confirm that one.
    """
    if srm is not None and srm.mismatch:
        counts = ", ".join(f"{a} {n}" for a, n in srm.counts.items())
        shares = ", ".join(f"{a} {s:.1%}" for a, s in srm.expected_share.items())
        return ArmVerdict(arm, control, "srm",
                          f"SRM: assignment is broken, do not trust these numbers (requests {counts}; "
                          f"expected shares {shares}; chi-square p = {srm.p_value:.2g})")
    side = winner(quality)
    what = f"quality ({source})"
    if side is not None:
        better = side == "treatment"
        amount = abs(quality.estimate)
        bounds = sorted((abs(quality.lower), abs(quality.upper)))
        text = (f"{arm} {'better' if better else 'worse'} than {control} on {what} by {amount:.3f} "
                f"[{bounds[0]:.3f}, {bounds[1]:.3f}]; {cost_phrase(cost)}")
        return ArmVerdict(arm, control, "better" if better else "worse", text, arm if better else control)
    if math.isfinite(quality.lower) and -min_effect < quality.lower and quality.upper < min_effect:
        return ArmVerdict(arm, control, "no_difference",
                          f"no difference detected between {arm} and {control} on {what}: "
                          f"{fmt_diff(quality)}, within ±{min_effect:g}; {cost_phrase(cost)}")
    vt = var_treatment if math.isfinite(var_treatment) else MAX_SCORE_VARIANCE
    vc = var_control if math.isfinite(var_control) else MAX_SCORE_VARIANCE
    have = min(quality.n_treatment, quality.n_control)

    def more_requests(effect: float) -> tuple[int, int | None]:
        """(scores, requests) still needed per arm for the interval to shrink to ``effect``."""
        more = max(samples_to_detect(effect, vt, vc, alpha=quality.alpha, rho=rho) - have, 1)
        return more, (math.ceil(more / coverage) if coverage > 0 else None)

    scores, requests = more_requests(min_effect)
    how_many = (f"about {requests:,} more requests per arm" if requests is not None
                else f"about {scores:,} scored requests per arm ({_unscored(arm, control, quality, source)})")
    text = (f"not enough data yet: {how_many} would detect a difference of {min_effect:g} in {what} "
            f"between {arm} and {control}")
    seen = abs(quality.estimate)
    if math.isfinite(seen) and seen > min_effect:
        _, if_real = more_requests(seen)
        if if_real is not None:
            text += f" (about {if_real:,} more if the {quality.estimate:+.3f} seen so far is real)"
    text += f"; so far {fmt_diff(quality)}"
    return ArmVerdict(arm, control, "not_enough_data", text, more_requests_per_arm=requests,
                      detectable_difference=min_effect)


def _unscored(arm: str, control: str, quality: SequentialDiff, source: str) -> str:
    """Which arm has no ``source`` score yet: requests cannot be counted until both have some.

    Coverage is the smaller of the arms', so it is 0 when either arm lacks scores; naming the arm
    that lacks them keeps the sentence true when the other already has some.
    """
    if quality.n_treatment == 0 and quality.n_control == 0:
        return f"neither arm has {_article(source)} {source} score yet"
    lacking, other, count = ((arm, control, quality.n_control) if quality.n_treatment == 0
                             else (control, arm, quality.n_treatment))
    return f"{lacking} has no {source} score yet; {other} has {count:,}"


def _article(word: str) -> str:
    """``a`` or ``an`` before ``word`` (by its first letter: the sources are explicit, judge, implicit)."""
    return "an" if word[:1].lower() in "aeiou" else "a"
