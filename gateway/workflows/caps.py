"""A workflow run's budget: steps, tokens and money, reserved before each sub-call and settled after.

Wall time is bounded by the runner (``asyncio.timeout`` around the whole run) and fan-out by a
semaphore per run; this module counts the rest. Before a sub-call, :meth:`Budget.reserve` checks the
caps against what is spent plus what running calls have reserved, and returns the ``max_tokens``
bound the call gets so that it cannot by itself overrun the token or cost cap: what is left, minus
the prompt's estimated size (and price). It raises :class:`CapReached` when no call fits. After the
call, :meth:`Budget.settle` replaces the reservation with the call's real usage (its estimate when the
upstream reported none).

Parallel calls each reserve an *expected* completion (at most :data:`EXPECTED_COMPLETION_TOKENS`),
not their full bound, so siblings are not starved; the total can then overshoot a cap by what one
call writes beyond that expectation (never beyond its own bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.completion_bounds import output_ceiling
from gateway.config import ModelConfig
from policies.workflows import Caps

#: The completion a call is assumed to write when it has no ``max_tokens`` (for reservations only).
EXPECTED_COMPLETION_TOKENS = 256


class CapReached(Exception):
    """A sub-call was not made: ``cap`` (``max_steps``, ``max_tokens``, ``max_seconds`` or
    ``max_cost_usd``; ``max_fanout`` only makes calls wait their turn) would be exceeded."""

    def __init__(self, cap: str, detail: str) -> None:
        super().__init__(f"{cap}: {detail}")
        self.cap = cap
        self.detail = detail


@dataclass(slots=True)
class Reservation:
    """What one sub-call holds of the budget until it is settled."""

    prompt_tokens: int
    tokens: int
    cost_usd: float
    settled: bool = False


class Budget:
    """Steps, tokens and cost of one workflow run against its :class:`~policies.workflows.Caps`."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self.steps = 0
        self.tokens = 0  # settled prompt + completion tokens
        self.cost_usd = 0.0  # settled cost
        self._reserved_tokens = 0
        self._reserved_usd = 0.0

    def reserve(
        self, model: ModelConfig, prompt_tokens: int, max_tokens: int | None, *, choices: int = 1
    ) -> tuple[Reservation, int | None]:
        """Reserve one sub-call of ``model`` with an estimated ``prompt_tokens``; returns the
        reservation and the ``max_tokens`` the call may use (``max_tokens`` itself when no cap binds
        it, None when nothing does). ``choices`` (a call with ``n``) each write up to that bound, so
        what is left is shared between them. Raises :class:`CapReached` when the call does not fit."""
        caps = self.caps
        if self.steps + 1 > caps.max_steps:
            raise CapReached("max_steps", f"{self.steps} sub-calls made, the cap is {caps.max_steps}")
        bound = max_tokens
        if caps.max_tokens is not None:
            left = (caps.max_tokens - self.tokens - self._reserved_tokens - prompt_tokens) // choices
            if left < 1:
                raise CapReached(
                    "max_tokens",
                    f"{self.tokens} tokens used, ~{prompt_tokens} for the next prompt, the cap is {caps.max_tokens}",
                )
            bound = left if bound is None else min(bound, left)
        price_in = model.input_cost_per_mtok / 1_000_000
        price_out = model.output_cost_per_mtok / 1_000_000
        if caps.max_cost_usd is not None:
            left_usd = caps.max_cost_usd - self.cost_usd - self._reserved_usd - prompt_tokens * price_in
            affordable = (math.floor(left_usd / price_out / choices) if price_out > 0
                          else (math.inf if left_usd >= 0 else 0))
            if affordable < 1:
                raise CapReached(
                    "max_cost_usd",
                    f"${self.cost_usd:.6f} spent, the next call to {model.name} does not fit the cap of "
                    f"${caps.max_cost_usd:g}",
                )
            if affordable != math.inf:
                bound = int(affordable) if bound is None else min(bound, int(affordable))
        if bound is not None and bound != max_tokens:
            # A bound the caps set: never more than the model can write in one answer. OpenAI refuses a
            # max_tokens over a model's output limit (16,384 for gpt-4o-mini), vLLM one over the context
            # left after the prompt: a cheap stage given such a bound failed every call and escalated.
            ceiling = output_ceiling(model, prompt_tokens)
            if ceiling is not None and bound > ceiling:
                bound = ceiling
        expected = choices * (EXPECTED_COMPLETION_TOKENS if bound is None else min(bound, EXPECTED_COMPLETION_TOKENS))
        reservation = Reservation(
            prompt_tokens=prompt_tokens,
            tokens=prompt_tokens + expected,
            cost_usd=prompt_tokens * price_in + expected * price_out,
        )
        self.steps += 1
        self._reserved_tokens += reservation.tokens
        self._reserved_usd += reservation.cost_usd
        return reservation, bound

    def settle(self, reservation: Reservation, tokens: int, cost_usd: float) -> None:
        """Replace ``reservation`` with what the call really used (idempotent)."""
        if reservation.settled:
            return
        reservation.settled = True
        self._reserved_tokens -= reservation.tokens
        self._reserved_usd -= reservation.cost_usd
        self.tokens += max(tokens, 0)
        self.cost_usd += max(cost_usd, 0.0)

    def release(self, reservation: Reservation) -> None:
        """Give a reservation back unused (the call was never sent; the step still counts)."""
        self.settle(reservation, 0, 0.0)
