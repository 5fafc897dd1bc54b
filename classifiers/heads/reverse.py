"""A pair difficulty head read the other way round: strong and weak swapped.

``pointsman train`` names the pair's strong model by the labelled data (the higher mean quality,
unless ``--strong``/``--weak`` say). A route may name them the other way: the model it pays more for
as ``strong`` even where, on this traffic, the other one does better on average. The head trained for
``(a, b)`` ranks prompts by the expected gain ``q_a - q_b``; the same pair read as ``(b, a)`` ranks them
by its negation, so its linear part is the same weights negated. Its probability needs a calibration
of its own: P(b strictly better) is not 1 - P(a strictly better) when the two often tie (both right).
``pointsman train`` fits it on the same out-of-fold scores and records it in the head's manifest under
``reverse`` (with the reversed score quantiles a target-share knob starts from).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from classifiers.heads.head import Head

#: The manifest key ``pointsman train`` records the reverse direction's calibration under.
REVERSE_KEY = "reverse"


def reversible(head: Head) -> bool:
    """Whether ``head`` records what reading it the other way round needs (heads trained before this
    was recorded, or of another kind than a linear pair head, do not)."""
    reverse = head.manifest.get(REVERSE_KEY)
    pair = head.manifest.get("model_pair")
    return (
        head.kind == "logreg"
        and isinstance(reverse, Mapping)
        and isinstance(reverse.get("calibration"), Mapping)
        and isinstance(pair, Mapping)
        and {"strong", "weak"} <= set(pair)
        and np.asarray(head.params.get("coef")).shape[:1] == (1,)
    )


def reversed_pair_head(head: Head) -> Head:
    """The head of ``head``'s pair with strong and weak swapped: column 1 is P(the trained *weak*
    model does strictly better), calibrated by the manifest's ``reverse`` record.

    Raises:
        ValueError: ``head`` is not :func:`reversible`.
    """
    if not reversible(head):
        raise ValueError(f"head {head.manifest.get('name')!r} records no reverse calibration")
    reverse: Mapping[str, Any] = head.manifest[REVERSE_KEY]
    pair = head.manifest["model_pair"]
    params = dict(head.params)
    params["coef"] = -np.asarray(head.params["coef"])
    params["intercept"] = -np.asarray(head.params["intercept"])
    manifest = {key: value for key, value in head.manifest.items() if key not in (REVERSE_KEY, "score_quantiles")}
    manifest["model_pair"] = {"strong": pair["weak"], "weak": pair["strong"]}
    manifest["reversed_from"] = head.manifest.get("name")
    manifest["description"] = (
        f"P(strong model needed) for {pair['weak']} (strong) vs {pair['strong']} (weak): the head trained "
        f"for the reverse pair, its score negated and calibrated for this direction"
    )
    if isinstance(reverse.get("score_quantiles"), Mapping):
        manifest["score_quantiles"] = reverse["score_quantiles"]
    return Head(
        kind=head.kind,
        labels=head.labels,
        params=params,
        config=dict(head.config),
        calibration=dict(reverse["calibration"]),
        manifest=manifest,
    )


__all__ = ["REVERSE_KEY", "reversed_pair_head", "reversible"]
