"""Multi-model choice: the eligible model with the best predicted quality - λ · normalised cost."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from classifiers.messages import content_texts, iter_messages

TOOLS_TAG = "tools"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the policy layer knows of a configured model (built by the gateway from its config)."""

    name: str
    input_cost_per_mtok: float = 0.0
    output_cost_per_mtok: float = 0.0
    context_window: int | None = None
    tags: frozenset[str] = frozenset()

    @property
    def price(self) -> float:
        """Input + output price per million tokens: the cost of a request of equal in/out size."""
        return self.input_cost_per_mtok + self.output_cost_per_mtok


@dataclass(frozen=True, slots=True)
class Scored:
    """One candidate's evaluation; ``excluded`` says why an ineligible model was left out.

    ``quality_key`` is the key its quality was read under when that differs from ``model``.
    """

    model: str
    quality: float | None
    cost: float
    norm_cost: float
    utility: float | None
    excluded: str | None = None
    quality_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form for explanations."""
        return {
            "model": self.model,
            **({"quality_key": self.quality_key} if self.quality_key else {}),
            "quality": None if self.quality is None else round(self.quality, 4),
            "cost": self.cost,
            "norm_cost": round(self.norm_cost, 4),
            "utility": None if self.utility is None else round(self.utility, 4),
            "eligible": self.excluded is None,
            **({"excluded": self.excluded} if self.excluded else {}),
        }


@dataclass(frozen=True, slots=True)
class Choice:
    """The ranking: eligible models best first, then the excluded ones."""

    ranked: tuple[Scored, ...]
    needed_tokens: int
    lam: float
    tools: bool = False
    eligible: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Scored | None:
        """The chosen model's entry, ``None`` if no candidate is eligible."""
        return self.ranked[0] if self.ranked and self.ranked[0].excluded is None else None


class UtilityChooser:
    """Ranks ``candidates`` for a request (see :class:`policies.config.MultiModel`).

    ``quality_keys`` maps a candidate to the key of its score in the quality mapping (default: its name).
    """

    def __init__(
        self,
        candidates: Sequence[str],
        lam: float,
        models: Mapping[str, ModelInfo],
        *,
        costs: Mapping[str, float] | None = None,
        require_tags: Sequence[str] = (),
        quality_keys: Mapping[str, str] | None = None,
    ) -> None:
        if lam < 0:
            raise ValueError("lambda must be >= 0")
        self.candidates = tuple(candidates)
        self.quality_keys = {name: (quality_keys or {}).get(name, name) for name in self.candidates}
        self.lam = lam
        self.models = {name: models.get(name, ModelInfo(name)) for name in self.candidates}
        costs = costs or {}
        self.costs = {name: float(costs.get(name, self.models[name].price)) for name in self.candidates}
        top = max(self.costs.values(), default=0.0)
        # Normalise by the dearest candidate so λ means "quality points per full price range".
        self.norm_costs = {name: (cost / top if top > 0 else 0.0) for name, cost in self.costs.items()}
        self.require_tags = frozenset(require_tags)

    def choose(self, quality: Any, body: Mapping[str, Any]) -> Choice:
        """Rank the candidates for ``body`` given predicted ``quality`` (a mapping model → score)."""
        needed = rough_token_count(body)
        tools = request_has_tools(body)
        qualities = quality if isinstance(quality, Mapping) else {}
        entries: list[Scored] = []
        for name in self.candidates:
            info = self.models[name]
            key = self.quality_keys[name]
            q = qualities.get(key)
            q_value = float(q) if isinstance(q, int | float) and not isinstance(q, bool) and math.isfinite(q) else None
            excluded = self._excluded(info, needed, tools, q_value)
            utility = None if q_value is None else q_value - self.lam * self.norm_costs[name]
            entries.append(
                Scored(name, q_value, self.costs[name], self.norm_costs[name], utility, excluded,
                       quality_key=key if key != name else None)
            )
        eligible = [e for e in entries if e.excluded is None]
        # Stable sort: on equal utility the cheaper model wins, then configuration order.
        eligible.sort(key=lambda e: (-(e.utility or 0.0), e.cost))
        ranked = (*eligible, *(e for e in entries if e.excluded is not None))
        return Choice(
            ranked=tuple(ranked), needed_tokens=needed, lam=self.lam, tools=tools,
            eligible=tuple(e.model for e in eligible),
        )

    def _excluded(self, info: ModelInfo, needed: int, tools: bool, quality: float | None) -> str | None:
        if info.context_window is not None and needed > info.context_window:
            return f"needs ~{needed} tokens, context window is {info.context_window}"
        if tools and TOOLS_TAG not in info.tags:
            return "the request offers tools and the model lacks the 'tools' tag"
        missing = self.require_tags - info.tags
        if missing:
            return f"missing required tags {sorted(missing)}"
        if quality is None:
            return "no quality prediction for this model"
        return None


def request_has_tools(body: Mapping[str, Any]) -> bool:
    """Whether the request defines tools (``tools`` or the legacy ``functions``)."""
    return any(isinstance(body.get(key), list) and bool(body.get(key)) for key in ("tools", "functions"))


def rough_token_count(body: Mapping[str, Any]) -> int:
    """A deliberately generous count of the context a request needs: prompt plus reply budget.

    Text counts one token per 3 characters (real tokenizers average about 4 on English, so this
    errs towards excluding a model rather than overflowing it), plus 4 tokens of framing per
    message, plus the tool calls and tool definitions as compact JSON, plus
    ``max_completion_tokens`` / ``max_tokens``. (The signals' fitted estimate is
    :func:`classifiers.signals.length.estimate_tokens`.)
    """
    chars = 0
    count = 0
    for _, _, message in iter_messages(body):
        count += 1
        chars += _text_chars(message.get("content"))
        for key in ("tool_calls", "function_call"):
            if message.get(key):
                chars += len(_dumps(message[key]))
    # A legacy prompt reads like content: a string, or a list whose string items count.
    chars += _text_chars(body.get("prompt"))
    for key in ("tools", "functions"):
        if body.get(key):
            chars += len(_dumps(body[key]))
    reply = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    reply = reply if isinstance(reply, int) and not isinstance(reply, bool) else 0
    return math.ceil(chars / 3) + 4 * count + reply


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    total = 0
    for _, text in content_texts(content):
        total += len(text)
    return total


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return ""
