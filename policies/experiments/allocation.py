"""Adaptive allocation: Thompson sampling of new keys over an experiment's served arms.

Each arm's reward is ``quality - lambda x cost / reference cost`` (the reference is the control's
mean cost per request, so ``lambda`` is the quality given up for paying the control's cost once
more). The posteriors: quality ~ Beta(1 + sum of outcomes, 1 + sum of (1 - outcome)) over the
requests with an outcome in [0, 1] (fractional outcomes count fractionally), the mean cost ~
Normal(sample mean, sample sd / sqrt(n)). Thompson sampling gives a key arm *a* with probability
P(*a*'s reward is the largest); :meth:`ThompsonAllocator.propensities` estimates it with ``draws``
joint Monte Carlo draws and mixes in a floor (``min_propensity`` per arm), so no arm starves and
inverse-propensity weights stay bounded.

The key is then placed with those probabilities by its hashed point in [0, 1)
(:class:`~policies.experiments.assign.ArmTable`), so the probability logged with an assignment is
*exactly* the one it was made with, not an estimate: the offline estimators' weights are right.
The Monte Carlo draws are seeded from the evidence itself, so replicas that read the same evidence
compute the same probabilities. Only keys not yet assigned are placed this way; an assignment is
kept forever (the gateway stores it, first writer wins).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ArmEvidence:
    """What the served requests of one arm say so far: ``outcomes`` requests with an outcome (their
    ``quality_sum``), ``cost_requests`` with a cost (``cost_sum``, ``cost_sq_sum``)."""

    outcomes: float = 0.0
    quality_sum: float = 0.0
    cost_requests: int = 0
    cost_sum: float = 0.0
    cost_sq_sum: float = 0.0

    @property
    def mean_cost(self) -> float | None:
        """Mean cost per request, None without costs."""
        return self.cost_sum / self.cost_requests if self.cost_requests else None

    @property
    def cost_se(self) -> float:
        """Standard error of the mean cost (0 with fewer than two costs)."""
        n = self.cost_requests
        if n < 2:
            return 0.0
        variance = max((self.cost_sq_sum - self.cost_sum * self.cost_sum / n) / (n - 1), 0.0)
        return math.sqrt(variance / n)


_AGREED_DIGITS = 9  # significant digits of the evidence every replica draws from


def _significant(value: float) -> float:
    return float(f"{value:.{_AGREED_DIGITS}g}") if math.isfinite(value) else value


def _agreed(stats: ArmEvidence) -> ArmEvidence:
    """``stats`` to 9 significant digits: what every replica reading the same rows agrees on.

    A database's floating-point sums change in their last bits with the order it adds in (PostgreSQL's
    plan, its parallel workers): 49980.30927705945 on one read, 49980.30927705845 on the next. Rounded
    to a fixed number of decimals such sums still fell on both sides of a rounding step, so replicas
    (and successive updates of one) seeded different draws and split traffic a point or two apart:
    nine decimals of a sum of 50,000 are fourteen digits, within a hundred times of that noise. Nine
    significant digits are ~10^6 times above it (a straddle is then a one-in-a-million read) and still
    far finer than anything the posterior can tell apart.
    """
    return ArmEvidence(
        _significant(stats.outcomes), _significant(stats.quality_sum), stats.cost_requests,
        _significant(stats.cost_sum), _significant(stats.cost_sq_sum),
    )


class ThompsonAllocator:
    """Assignment probabilities of new keys over ``arms`` (``control`` among them) by Thompson sampling."""

    def __init__(
        self,
        arms: Sequence[str],
        control: str,
        *,
        lam: float = 0.0,
        draws: int = 4000,
        min_propensity: float = 0.05,
        salt: str = "",
    ) -> None:
        if control not in arms:
            raise ValueError(f"the control {control!r} is not one of the arms {list(arms)}")
        if draws < 1 or lam < 0 or not 0 <= min_propensity < 1:
            raise ValueError("draws must be >= 1, lam >= 0 and min_propensity in [0, 1)")
        self.arms = tuple(arms)
        self.control = control
        self.lam = lam
        self.draws = draws
        self.min_propensity = min_propensity
        self.salt = salt

    def propensities(
        self, evidence: Mapping[str, ArmEvidence], available: Collection[str] | None = None
    ) -> dict[str, float]:
        """P(each available arm is assigned) to a new key; arms not available (stopped) get 0.

        With no evidence at all every available arm is equally likely (the priors are equal).
        """
        arms = [arm for arm in self.arms if available is None or arm in available]
        if not arms:
            raise ValueError("no arm is available to assign")
        if len(arms) == 1:
            return {arm: (1.0 if arm == arms[0] else 0.0) for arm in self.arms}
        wins = self._win_shares(arms, evidence)
        k = len(arms)
        floor = self.min_propensity if self.min_propensity * k < 1 else 1.0 / k
        # Plain floats, not numpy scalars: these go into JSON (orjson writes a numpy float64 through
        # ``default=str`` as a string: /v1/route showed "propensity": "0.93").
        mixed = {arm: floor + (1.0 - k * floor) * float(wins[i]) for i, arm in enumerate(arms)}
        total = sum(mixed.values())
        return {arm: mixed.get(arm, 0.0) / total for arm in self.arms}

    def _win_shares(self, arms: Sequence[str], evidence: Mapping[str, ArmEvidence]) -> np.ndarray:
        """The share of joint posterior draws in which each arm's reward is the largest."""
        empty = ArmEvidence()
        stats = [_agreed(evidence.get(arm, empty)) for arm in arms]
        rng = np.random.default_rng(self._seed(arms, stats))
        shape = (self.draws, len(arms))
        alpha = np.array([1.0 + s.quality_sum for s in stats])
        beta = np.array([1.0 + max(s.outcomes - s.quality_sum, 0.0) for s in stats])
        reward = rng.beta(alpha, beta, size=shape)
        if self.lam > 0:
            reference = self._reference_cost(stats, arms)
            if reference > 0:
                known = [s.mean_cost for s in stats if s.mean_cost is not None]
                pooled = sum(known) / len(known) if known else 0.0
                means = np.array([pooled if s.mean_cost is None else s.mean_cost for s in stats])
                ses = np.array([s.cost_se for s in stats])
                cost = np.maximum(means + ses * rng.standard_normal(shape), 0.0)
                reward = reward - self.lam * cost / reference
        winners = np.argmax(reward, axis=1)
        wins = np.bincount(winners, minlength=len(arms)) / self.draws
        # Arms with the same evidence are exchangeable: their true probabilities are equal, so they
        # share their draws' wins (no evidence at all: exactly uniform, not 0.49 / 0.51).
        groups: dict[ArmEvidence, list[int]] = {}
        for index, stat in enumerate(stats):
            groups.setdefault(stat, []).append(index)
        for members in groups.values():
            if len(members) > 1:
                wins[members] = wins[members].mean()
        return wins

    def _reference_cost(self, stats: Sequence[ArmEvidence], arms: Sequence[str]) -> float:
        """The control's mean cost per request; without one, the largest arm's (0: no costs known)."""
        by_arm = dict(zip(arms, stats, strict=True))
        control = by_arm.get(self.control)
        if control is not None and control.mean_cost:
            return control.mean_cost
        known = [s.mean_cost for s in stats if s.mean_cost]
        return max(known) if known else 0.0

    def _seed(self, arms: Sequence[str], stats: Sequence[ArmEvidence]) -> int:
        """A seed from the evidence: the same evidence gives the same draws on every replica."""
        text = repr((self.salt, self.lam, self.draws, tuple(arms), tuple(
            (s.outcomes, s.quality_sum, s.cost_requests, s.cost_sum, s.cost_sq_sum) for s in stats
        )))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
