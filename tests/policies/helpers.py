"""Building policies from YAML the way the gateway will: parse, validate, construct."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import yaml

from policies import ModelInfo, RouteConfig, RulePolicy, validate_policy
from tests.policies.signals import KNOWN_SIGNALS, TestSignals

MODELS: dict[str, ModelInfo] = {
    "tiny": ModelInfo("tiny", 0.05, 0.1, context_window=512),
    "small": ModelInfo("small", 0.15, 0.6, context_window=8192, tags=frozenset({"tools"})),
    "coder": ModelInfo("coder", 0.5, 1.5, context_window=32768),
    "big": ModelInfo("big", 2.5, 10.0, context_window=128000, tags=frozenset({"tools", "vision"})),
}
TAGS = {name: set(info.tags) for name, info in MODELS.items()}


def route_config(text: str) -> RouteConfig:
    data: dict[str, Any] = yaml.safe_load(text)
    return RouteConfig.model_validate(data)


def build(
    text: str,
    *,
    historic_scores: Iterable[float] = (),
    clock: Callable[[], float] | None = None,
) -> tuple[RulePolicy, TestSignals]:
    """Parse and validate a route's YAML, then build its RulePolicy with the test provider."""
    cfg = route_config(text)
    validate_policy(cfg.name, cfg, KNOWN_SIGNALS, set(MODELS), TAGS)
    provider = TestSignals({name: list(kw.keywords) for name, kw in cfg.signals.keywords.items()})
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    policy = RulePolicy(cfg.name, cfg, provider, MODELS, historic_scores=historic_scores, **extra)
    return policy, provider
