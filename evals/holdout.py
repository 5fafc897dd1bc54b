"""``--holdout FRACTION``: one labelled source split into a training part and a held-out part, the same
split in ``pointsman train`` and ``pointsman promote``.

Logged traffic is one stream: to gate a version trained on it, part of it must stay out of training.
A request is held out when ``prompt_unit(key, HOLDOUT_SEED) < fraction``, its key being the one
cross-validation folds use (the conversation text, else the request id, else the stored embedding):
it depends only on the request, so the same prompt is held out on every run, from every source it
appears in, and a request logged after training lands on the same side it would have before.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from evals.data.split import prompt_unit
from evals.labelled import LoadedSource

#: Independent of the train/val/test split seed and the fold seed (DEFAULT_SEED, DEFAULT_SEED + 1).
HOLDOUT_SEED = 7_310_001
Part = Literal["train", "heldout"]


def holdout_fraction(value: str) -> float:
    """``--holdout``'s argparse type: a fraction strictly between 0 and 1."""
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not 0.0 < fraction < 1.0:
        raise argparse.ArgumentTypeError(f"{value!r}: give a fraction strictly between 0 and 1, e.g. 0.2")
    return fraction


def is_held_out(key: str, fraction: float) -> bool:
    """Whether the request identified by ``key`` is in the held-out part."""
    return prompt_unit(key, HOLDOUT_SEED) < fraction


def split_sources(sources: Sequence[LoadedSource], fraction: float, part: Part) -> list[LoadedSource]:
    """Each source with only its ``part`` rows (labelled rows and logged outcomes alike); ``describe()``
    then names the part and the fraction."""
    from evals.retrain import row_key

    want_held = part == "heldout"
    return [
        replace(
            src,
            rows=[r for r in src.rows if is_held_out(row_key(r), fraction) == want_held],
            logged=[r for r in src.logged if is_held_out(row_key(r), fraction) == want_held],
            holdout={"fraction": fraction, "part": part, "seed": HOLDOUT_SEED},
        )
        for src in sources
    ]


def describe(fraction: float) -> dict[str, object]:
    """What a version records about its hold-out."""
    return {
        "fraction": fraction,
        "seed": HOLDOUT_SEED,
        "key": "the conversation text (else the request id, else the stored embedding)",
        "gate": f"pointsman promote VERSION --registry DIR --data <the same sources> --holdout {fraction:g}",
    }
