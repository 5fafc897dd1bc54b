"""Reproducible per-request randomness: exploration between the knob's two models, and sampling.

Both are decided by a hash of the request id (never by a process-local random generator), so a
decision can be reproduced from the log, every replica agrees, and two different uses of the same
id (exploring, sampling a comparison) stay independent through their ``purpose`` salt.

Exploration is epsilon-uniform: a share ``epsilon`` of the knob's decisions is made uniformly at
random between the two models, so the model the knob chose is served with probability
``1 - epsilon/2`` and the other with ``epsilon/2``. That probability of the served model is the
decision's *propensity*, what inverse-propensity estimators weigh logged outcomes by.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXPLORE_PURPOSE = "explore"


def request_fraction(request_id: str, purpose: str) -> float:
    """A number in [0, 1), uniform over request ids, fixed for (``request_id``, ``purpose``)."""
    digest = hashlib.blake2b(f"{purpose}\x00{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def sampled(request_id: str, share: float, purpose: str) -> bool:
    """Whether this request is in the ``share`` of requests sampled for ``purpose``."""
    return share > 0.0 and request_fraction(request_id, purpose) < share


@dataclass(frozen=True, slots=True)
class Exploration:
    """One explored knob decision: what the knob chose (``greedy``), what is served, and why."""

    epsilon: float
    greedy: str
    other: str
    served: str
    randomised: bool  # the decision was made at random (it may still have landed on ``greedy``)

    def probability(self, model: str) -> float:
        """The probability the policy gives ``model`` for this request."""
        if model == self.greedy:
            return 1.0 - self.epsilon / 2.0
        if model == self.other:
            return self.epsilon / 2.0
        return 0.0

    def propensity_of(self, model: str, outcome_of: Callable[[str], str] | None = None) -> float:
        """The probability that ``model`` ends up served when each arm, once chosen, becomes
        ``outcome_of(arm)`` (for example a session that stays on its model): the sum over the arms
        that lead to ``model``."""
        if outcome_of is None:
            return self.probability(model)
        return sum(self.probability(arm) for arm in (self.greedy, self.other) if outcome_of(arm) == model)

    def as_dict(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "greedy": self.greedy, "served": self.served, "randomised": self.randomised}


def explore_pair(request_id: str, epsilon: float, greedy: str, other: str) -> Exploration:
    """Decide between ``greedy`` (the knob's choice) and ``other`` for this request.

    With draw ``u`` (:func:`request_fraction`): ``u < epsilon`` makes the decision random; its
    lower half serves ``other``, its upper half ``greedy``. So ``other`` is served for a share
    ``epsilon/2`` of requests, and the propensities are exact, not estimates.
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    u = request_fraction(request_id, EXPLORE_PURPOSE)
    served = other if u < epsilon / 2.0 else greedy
    return Exploration(epsilon=epsilon, greedy=greedy, other=other, served=served, randomised=u < epsilon)
