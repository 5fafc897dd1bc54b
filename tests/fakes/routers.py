"""Router registries for tests: versions whose pair difficulty heads give a known answer.

A head here is the shipped static-encoder difficulty head with its Platt calibration set to a
constant (``a = 0``), so whatever the prompt, P(strong needed) is the ``p_strong`` asked for: a
version that always routes strong, one that always routes weak. Real artifacts on disk (manifest
+ npz, hashed), written through the registry API as ``pointsman train`` writes them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from classifiers.heads import Head, load_head
from classifiers.provider import DEFAULT_ROUTERS_DIR
from classifiers.registry import RouterRegistry, pair_artifact

ENCODER = "static"
_SHIPPED = DEFAULT_ROUTERS_DIR / f"difficulty-gpt4-mixtral-{ENCODER}"


def constant_pair_head(
    strong: str, weak: str, p_strong: float, score_quantiles: Sequence[float] | None = None
) -> Head:
    """A difficulty head for ``strong`` vs ``weak`` that says ``p_strong`` for every prompt; with
    ``score_quantiles``, its manifest records them as ``pointsman train`` records a head's scores."""
    base = load_head(_SHIPPED)
    logit = math.log(p_strong / (1.0 - p_strong))
    manifest = {key: value for key, value in base.manifest.items() if key != "score_quantiles"}
    if score_quantiles is not None:
        manifest["score_quantiles"] = {"of": "test", "values": list(score_quantiles)}
    return dataclasses.replace(
        base,
        calibration={"method": "platt", "a": 0.0, "b": logit},
        manifest={**manifest, "model_pair": {"strong": strong, "weak": weak},
                  "name": f"constant-{p_strong:g}-{strong}--{weak}"},
    )


def add_version(
    registry: RouterRegistry,
    pairs: Mapping[tuple[str, str], float],
    score_quantiles: Sequence[float] | None = None,
) -> str:
    """A new registry version holding one constant head per ``(strong, weak): p_strong``; its id.

    The registry's first version becomes active; later ones wait for :meth:`RouterRegistry.promote`.
    """
    staging = registry.staging_dir()
    for (strong, weak), p_strong in pairs.items():
        constant_pair_head(strong, weak, p_strong, score_quantiles).save(staging / pair_artifact(strong, weak, ENCODER))
    info = {
        "encoders": [ENCODER],
        "pairs": [{"strong": s, "weak": w, "artifact": pair_artifact(s, w, ENCODER)} for s, w in pairs],
        "data": [],
        "metrics": {},
    }
    return registry.add_version(staging, info)


def break_version(registry: RouterRegistry, version: str) -> None:
    """Corrupt every head's weights in ``version`` (their sha256 no longer matches the manifest)."""
    for weights in Path(registry.version_dir(version)).rglob("weights.npz"):
        weights.write_bytes(weights.read_bytes()[:-16] + b"\0" * 16)
