"""Thompson sampling of new keys: uniform without evidence, towards the arm whose quality - lambda x cost
is best as evidence arrives, never below the floor, nothing for a stopped arm, the same numbers on
every replica for the same evidence, and keys placed with exactly the probabilities logged."""

from __future__ import annotations

from collections import Counter

import pytest

from policies.experiments.allocation import ArmEvidence, ThompsonAllocator
from policies.experiments.assign import ArmTable, key_digest


def evidence(n: int, quality: float, cost: float = 0.0) -> ArmEvidence:
    """``n`` requests of mean quality ``quality`` and constant cost ``cost``."""
    return ArmEvidence(n, n * quality, n, n * cost, n * cost * cost)


def test_without_evidence_every_available_arm_is_equally_likely() -> None:
    allocator = ThompsonAllocator(["c", "a", "b"], "c")
    assert allocator.propensities({}) == {"c": pytest.approx(1 / 3), "a": pytest.approx(1 / 3),
                                          "b": pytest.approx(1 / 3)}
    assert allocator.propensities({}, available=["c", "b"]) == {"c": 0.5, "a": 0.0, "b": 0.5}
    assert allocator.propensities({}, available=["c"]) == {"c": 1.0, "a": 0.0, "b": 0.0}


def test_evidence_moves_new_keys_to_the_better_arm_down_to_the_floor() -> None:
    allocator = ThompsonAllocator(["c", "a"], "c", min_propensity=0.05)
    p = allocator.propensities({"c": evidence(400, 0.5), "a": evidence(400, 0.7)})
    assert p["a"] == pytest.approx(0.95) and p["c"] == pytest.approx(0.05)  # floored, not starved
    close = allocator.propensities({"c": evidence(20, 0.5), "a": evidence(20, 0.55)})
    assert 0.5 < close["a"] < 0.95  # little evidence: still exploring
    assert sum(close.values()) == pytest.approx(1.0)
    # Plain floats: they are written into JSON (/v1/route, decision records), where a numpy scalar
    # would turn into a string.
    assert all(type(v) is float for v in (*p.values(), *close.values()))


def test_cost_counts_against_quality_with_lambda() -> None:
    same_quality = {"c": evidence(500, 0.7, cost=0.001), "a": evidence(500, 0.7, cost=0.004)}
    free = ThompsonAllocator(["c", "a"], "c", lam=0.0, min_propensity=0.0).propensities(same_quality)
    assert free["a"] == pytest.approx(0.5, abs=0.1)  # cost ignored: a coin flip
    priced = ThompsonAllocator(["c", "a"], "c", lam=0.1, min_propensity=0.0).propensities(same_quality)
    assert priced["c"] > 0.99  # paying the control's cost 3 more times costs 0.3 quality


def test_the_same_evidence_gives_the_same_probabilities_on_every_replica() -> None:
    data = {"c": evidence(30, 0.5, 0.002), "a": evidence(25, 0.6, 0.003)}
    one = ThompsonAllocator(["c", "a"], "c", lam=0.05, salt="exp").propensities(data)
    two = ThompsonAllocator(["c", "a"], "c", lam=0.05, salt="exp").propensities(dict(data))
    assert one == two


def test_sums_that_differ_in_their_last_bits_give_the_same_probabilities() -> None:
    # PostgreSQL adds an arm's outcomes in the order its plan (and parallel workers) gives: two reads
    # of the same rows returned these two sums. Replicas reading either must split traffic alike.
    def evidence(quality_sum: float, cost_sum: float) -> dict[str, ArmEvidence]:
        return {
            "a": ArmEvidence(100_000, quality_sum, 100_000, cost_sum, 0.0012000000000004),
            "b": ArmEvidence(100_000, 49_990.0, 100_000, 100.0, 0.0012),
        }

    allocator = ThompsonAllocator(["a", "b"], "a", lam=0.5)
    one = allocator.propensities(evidence(49980.30927705945, 100.0000000000118))
    other = allocator.propensities(evidence(49980.30927705845, 100.00000000003034))
    assert one == other
    assert 0.2 < one["a"] < 0.5  # close arms: a coin-like split that any other seed would move


def test_keys_are_placed_with_exactly_the_logged_probabilities() -> None:
    propensities = ThompsonAllocator(["c", "a", "b"], "c").propensities(
        {"c": evidence(50, 0.5), "a": evidence(50, 0.6), "b": evidence(50, 0.4)}
    )
    table = ArmTable(propensities)
    n = 20_000
    counts = Counter(table.pick(int.from_bytes(key_digest("exp", "user", f"k{i}")[:8], "big") / 2**64)
                     for i in range(n))
    for arm, p in propensities.items():
        assert counts[arm] / n == pytest.approx(p, abs=4 * (p * (1 - p) / n) ** 0.5 + 1e-9)
        assert table.shares[arm] == pytest.approx(p)  # what the gateway logs as arm_propensity


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ThompsonAllocator(["a", "b"], "c")
    with pytest.raises(ValueError):
        ThompsonAllocator(["a", "b"], "a", lam=-1)
