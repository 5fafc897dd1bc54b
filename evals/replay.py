"""Offline replay of a route's policy over labelled requests, through the code the gateway serves with.

Every request is explained by :func:`policies.brain.explain_request` on a brain built from the config
(the helper ``POST /v1/route`` and ``pointsman route`` use): the same signals, rules, knob and model
choice as serving, without calling any backend. Replay is stateless and deterministic:

- stickiness off and exploration off (``build_brain(sticky=False, explore=False)``): every request is
  decided on its own, as a first turn;
- a knob with ``target_strong_share`` is calibrated over the replayed set itself, in two passes: the
  first collects every request's score, the threshold is the one that sends that share of them to the
  strong model (the knob's own calibration code over a window holding exactly these scores), and the
  second pass decides every request with that threshold as its per-request threshold (the serving
  override path). A fixed ``threshold`` needs one pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies.knob import THRESHOLD_HEADER, CostQualityKnob

#: Requests explained concurrently: enough for the encoder to micro-batch, few enough to stay light.
CONCURRENCY = 64
# Why replay leaves a workflow decision out (the labelled data has no outcome for a cascade or fusion).
WORKFLOW_EXCLUDED = "answered by a workflow (its sub-calls' outcome is not in the data)"


@dataclass(frozen=True)
class ReplayDecision:
    """What the route decided for one request.

    ``by`` says what decided: ``knob`` (the cost-quality score against the threshold: the model
    depends on the threshold), ``rule`` (a routing rule), ``multi_model``, ``default`` (the route's
    model, or the strong model when the knob's score was unavailable), ``blocked`` or ``error``
    (e.g. no eligible model).
    """

    index: int
    model: str | None
    by: str
    score: float | None  # the knob's score (P(strong needed)) when the knob decided
    reason: str
    request_id: str | None = None
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON form (one line of ``decisions.jsonl``)."""
        return {
            "index": self.index, "request_id": self.request_id, "source": self.source, "model": self.model,
            "by": self.by, "score": self.score, "reason": self.reason,
        }


@dataclass
class Replay:
    """A route's decisions over a data set, with the knob's setting they were made at."""

    route: str
    router_version: str
    decisions: list[ReplayDecision]
    strong: str | None = None  # the cost-quality knob's models (config names), when the route has one
    weak: str | None = None
    threshold: float | None = None
    threshold_source: str = ""  # "config" | "target share over the replayed set" | ""
    target_share: float | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    #: The pair head the knob read the other way round (its name), when the route names the trained
    #: pair reversed (:mod:`classifiers.heads.reverse`).
    difficulty_reversed_from: str | None = None


class ReplayError(ValueError):
    """The route cannot be replayed (unknown route, no cost-quality knob where one is needed …)."""


def request_body(route: str, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The chat-completions body a client would send for this conversation on ``route``."""
    return {"model": route, "messages": [dict(m) for m in messages]}


async def replay_route(
    brain: Any,
    route: str,
    conversations: Sequence[Sequence[Mapping[str, Any]]],
    *,
    request_ids: Sequence[str | None] | None = None,
    sources: Sequence[str] | None = None,
    concurrency: int = CONCURRENCY,
    progress: Callable[[int, str], Any] | None = None,
) -> Replay:
    """Decide every conversation on ``route`` of a started brain (see :mod:`policies.brain`).

    ``progress(total, description)`` may return a tqdm-like bar (``update(n)``, ``close()``).
    """
    from policies.brain import explain_request

    policy = brain.policies.get(route)
    if policy is None:
        known = ", ".join(brain.policies) or "none"
        raise ReplayError(f"--route {route}: no such route in the config (routes: {known})")
    config = getattr(policy, "config", None)
    cq = getattr(config, "cost_quality", None)
    bodies = [request_body(route, messages) for messages in conversations]
    ids = list(request_ids) if request_ids is not None else [None] * len(bodies)

    async def explain_all(headers: Mapping[str, str], what: str) -> list[dict[str, Any]]:
        semaphore = asyncio.Semaphore(concurrency)
        bar = progress(len(bodies), what) if progress is not None else None

        async def one(i: int) -> dict[str, Any]:
            async with semaphore:
                out: dict[str, Any] = await explain_request(
                    brain, route, bodies[i], headers=dict(headers), request_id=f"replay:{ids[i] or i}"
                )
            if bar is not None:
                bar.update(1)
            return out

        try:
            return list(await asyncio.gather(*(one(i) for i in range(len(bodies)))))
        finally:
            if bar is not None:
                bar.close()

    explanations = await explain_all({}, f"replay {route}")
    threshold: float | None = None
    source = ""
    target = getattr(cq, "target_strong_share", None)
    if cq is not None and target is not None:
        scores = [s for e in explanations if (s := knob_score(e)) is not None]
        threshold = share_threshold(scores, target)
        source = "target share over the replayed set"
        # Second pass: the calibrated threshold as every request's threshold (the serving override path).
        explanations = await explain_all({THRESHOLD_HEADER: repr(threshold)}, f"replay {route} @ {threshold:.4f}")
    elif cq is not None:
        threshold = 0.5 if cq.threshold is None else float(cq.threshold)
        source = "config"
    decisions = [
        decision_of(i, e, request_id=ids[i], source=(sources[i] if sources is not None else ""))
        for i, e in enumerate(explanations)
    ]
    return Replay(
        route=route,
        router_version=str(getattr(brain, "router_version", "") or ""),
        decisions=decisions,
        strong=getattr(cq, "strong", None),
        weak=getattr(cq, "weak", None),
        threshold=threshold,
        threshold_source=source,
        target_share=target,
        difficulty_reversed_from=_reversed_from(explanations),
    )


def _reversed_from(explanations: Iterable[Mapping[str, Any]]) -> str | None:
    for explanation in explanations:
        difficulty = (explanation.get("signals") or {}).get("difficulty")
        if isinstance(difficulty, Mapping):
            found = (difficulty.get("detail") or {}).get("reversed_from")
            return str(found) if found else None
    return None


def subset(replay: Replay, indices: Iterable[int]) -> Replay:
    """The same replay restricted to the decisions at ``indices`` (in that order): the rows of one
    estimator when several sets of requests were replayed together, at one knob setting."""
    return dataclasses.replace(replay, decisions=[replay.decisions[i] for i in indices])


def share_threshold(scores: Iterable[float], share: float) -> float:
    """The threshold that sends ``share`` of ``scores`` to the strong model: the knob's own
    calibration over a window holding exactly these scores, clamped to [0, 1] (a per-request
    threshold must lie there; a score of exactly 1.0 then goes strong even at share 0)."""
    values = [float(s) for s in scores if math.isfinite(s)]
    if not values:
        return 1.0 - share  # what the knob does before it has any sample
    knob = CostQualityKnob(target_share=share, window=len(values), min_samples=1, seed=values)
    threshold, _ = knob.threshold()
    return min(max(threshold, 0.0), 1.0)


def knob_score(explanation: Mapping[str, Any]) -> float | None:
    """The score the knob compared for this request, or None when the knob did not decide."""
    knob = explanation.get("knob")
    if not isinstance(knob, Mapping) or not knob.get("used"):
        return None
    score = knob.get("score")
    return float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None


def decision_of(index: int, explanation: Mapping[str, Any], *, request_id: str | None = None,
                source: str = "") -> ReplayDecision:
    """One explanation as a :class:`ReplayDecision`."""
    reason = str(explanation.get("reason") or "")
    model = explanation.get("model")
    score = knob_score(explanation)
    plan = explanation.get("plan")
    if explanation.get("blocked"):
        by = "blocked"
    elif explanation.get("error") or model is None:
        by = "error"
    elif isinstance(plan, Mapping) and plan.get("workflow"):
        # A workflow (a cascade of the knob's middle band, a rule's fusion) answers with sub-calls whose
        # outcome the labelled data cannot say: replay leaves these requests out and counts them.
        by = "workflow"
    elif score is not None:
        by = "knob"
    elif _rule_routed(explanation):
        by = "rule"
    elif isinstance(explanation.get("multi_model"), Mapping):
        by = "multi_model"
    else:
        by = "default"
    return ReplayDecision(index=index, model=model, by=by, score=score, reason=reason, request_id=request_id,
                          source=source)


def _rule_routed(explanation: Mapping[str, Any]) -> bool:
    rules = explanation.get("rules") or ()
    return any(r.get("applied") and r.get("action") in ("route", "tier") for r in rules if isinstance(r, Mapping))


def pair_arrays(replay: Replay) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per decision: the knob score (NaN when the knob did not decide), the pin (+1: the strong model
    whatever the threshold, -1: the weak one, 0: the knob decides) and whether it went strong.

    Decisions for neither model of the pair (blocked, errors, a rule routing elsewhere) get pin 0 and
    NaN score; callers leave them out (see :func:`pair_usable`).
    """
    n = len(replay.decisions)
    scores = np.full(n, np.nan)
    pins = np.zeros(n, dtype=int)
    strong = np.zeros(n, dtype=bool)
    for i, d in enumerate(replay.decisions):
        strong[i] = d.model == replay.strong
        if d.by == "workflow":
            continue  # left out (pair_usable): no pin, no score
        if d.by == "knob" and d.score is not None:
            scores[i] = d.score
        elif d.model == replay.strong:
            pins[i] = 1
        elif d.model == replay.weak:
            pins[i] = -1
    return scores, pins, strong


def pair_usable(replay: Replay) -> np.ndarray:
    """Which decisions a pairwise evaluation can use: the knob decided, or the model is one of the pair."""
    pair = (replay.strong, replay.weak)
    return np.array([
        d.by != "workflow" and ((d.by == "knob" and d.score is not None) or (d.model is not None and d.model in pair))
        for d in replay.decisions
    ], dtype=bool)
