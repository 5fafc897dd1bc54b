"""Goodput: the highest arrival rate whose TTFT p99 meets the SLO, found by bracketing and bisection.

Runs at different rates replay the same sessions (common random numbers, see
:mod:`bench.replica_sim.traces`), so the p99 rises with the rate almost monotonically and a bisection
on one seed is meaningful. The search brackets from a guess (x1.3 up or /1.3 down until the answer
flips), then bisects geometrically until the bracket is within ``rel_tol``; a run that already
misses the SLO on more than 1% of its requests stops early, which keeps overloaded probes cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.replica_sim.run import RunResult, RunSpec, simulate


@dataclass(slots=True)
class Goodput:
    """A search's answer: the goodput (0 when even ``floor`` misses the SLO) and the run there."""

    rate: float
    at: RunResult | None
    probes: list[tuple[float, bool, float]] = field(default_factory=list)  # (rate, met, p99)
    wall_s: float = 0.0


def find_goodput(
    spec: RunSpec, slo: float, guess: float, *, rel_tol: float = 0.01, step: float = 1.3, floor: float | None = None,
) -> Goodput:
    """The goodput of ``spec`` (its ``rate`` is ignored) under TTFT p99 <= ``slo``."""
    floor = guess / 50 if floor is None else floor
    out = Goodput(0.0, None)

    def probe(rate: float) -> tuple[bool, RunResult]:
        result = simulate(replace(spec, rate=rate, slo=slo))
        met = result.meets(slo)
        out.probes.append((rate, met, result.ttft_p99))
        out.wall_s += result.wall_s
        return met, result

    met, result = probe(guess)
    if met:
        lo, best = guess, result
        hi = guess * step
        for _ in range(12):
            met, result = probe(hi)
            if not met:
                break
            lo, best = hi, result
            hi *= step
        else:
            out.rate, out.at = lo, best  # never missed: report the highest rate tried
            return out
    else:
        hi = guess
        lo = guess / step
        while True:
            met, result = probe(lo)
            if met:
                best = result
                break
            hi = lo
            lo /= step
            if lo < floor:
                return out
    while hi / lo > 1.0 + rel_tol:
        mid = (lo * hi) ** 0.5
        met, result = probe(mid)
        if met:
            lo, best = mid, result
        else:
            hi = mid
    out.rate, out.at = lo, best
    return out
