"""Experiments: A/B and shadow evaluation of routing policies, with always-valid statistics.

- :mod:`.sequential`: confidence sequences and the sample-ratio check.

The names below are re-exported lazily: the statistics need scipy, which reading a config must not
import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.experiments.sequential import (
        SampleRatioCheck,
        SequentialDiff,
        mean_difference_cs,
        proportion_difference_cs,
        sample_ratio_check,
    )

_EXPORTS = {
    "SampleRatioCheck": "sequential",
    "SequentialDiff": "sequential",
    "mean_difference_cs": "sequential",
    "proportion_difference_cs": "sequential",
    "sample_ratio_check": "sequential",
}

__all__ = [
    "SampleRatioCheck",
    "SequentialDiff",
    "mean_difference_cs",
    "proportion_difference_cs",
    "sample_ratio_check",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
