"""Experiments: A/B and shadow evaluation of routing policies, with always-valid statistics.

- :mod:`.config`: the ``experiments:`` schema and its cross-checks.
- :mod:`.assign`: stable hashing of a request's assignment key to an arm.
- :mod:`.allocation`: Thompson sampling of new keys, with exact propensities.
- :mod:`.arms`: the policy an arm decides with.
- :mod:`.guardrails`: the tests that stop an arm worse than the control.
- :mod:`.sequential`: confidence sequences and the sample-ratio check.

The names below are re-exported lazily: the statistics need scipy, which reading a config must not
import (``gateway.config`` reads the schema).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.experiments.allocation import ArmEvidence, ThompsonAllocator
    from policies.experiments.arms import ArmPolicy, FixedModelPolicy
    from policies.experiments.assign import ArmTable, AssignmentKey, assignment_key, key_digest
    from policies.experiments.config import Allocation, ArmConfig, ExperimentConfig, Guardrails
    from policies.experiments.guardrails import Breach, check_arm
    from policies.experiments.sequential import (
        SampleRatioCheck,
        SequentialDiff,
        mean_difference_cs,
        proportion_difference_cs,
        sample_ratio_check,
    )

_EXPORTS = {
    "Allocation": "config",
    "ArmConfig": "config",
    "ExperimentConfig": "config",
    "Guardrails": "config",
    "ArmTable": "assign",
    "AssignmentKey": "assign",
    "assignment_key": "assign",
    "key_digest": "assign",
    "ArmEvidence": "allocation",
    "ThompsonAllocator": "allocation",
    "ArmPolicy": "arms",
    "FixedModelPolicy": "arms",
    "Breach": "guardrails",
    "check_arm": "guardrails",
    "SampleRatioCheck": "sequential",
    "SequentialDiff": "sequential",
    "mean_difference_cs": "sequential",
    "proportion_difference_cs": "sequential",
    "sample_ratio_check": "sequential",
}

__all__ = [
    "Allocation",
    "ArmConfig",
    "ArmEvidence",
    "ArmPolicy",
    "ArmTable",
    "AssignmentKey",
    "Breach",
    "ExperimentConfig",
    "FixedModelPolicy",
    "Guardrails",
    "SampleRatioCheck",
    "SequentialDiff",
    "ThompsonAllocator",
    "assignment_key",
    "check_arm",
    "key_digest",
    "mean_difference_cs",
    "proportion_difference_cs",
    "sample_ratio_check",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
