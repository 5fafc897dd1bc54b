"""How many tokens a call may write: what the client asked, what the model can, what a bound allows.

Shared by the workflows' budgets and the comparisons' spend cap (both bound a call's ``max_tokens`` so
that what it can cost is known before it is made). A leaf: it imports only the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config import ModelConfig


def output_ceiling(model: ModelConfig, prompt_tokens: int) -> int | None:
    """The most tokens ``model`` can write after a prompt of ~``prompt_tokens``: its configured
    ``max_output_tokens``, and its ``context_window`` less the prompt (None when neither is configured)."""
    limits = [model.max_output_tokens] if model.max_output_tokens is not None else []
    if model.context_window is not None:
        limits.append(max(model.context_window - prompt_tokens, 1))
    return min(limits) if limits else None


def requested_completion(request: Mapping[str, Any]) -> int | None:
    """The completion bound the client asked for (``max_completion_tokens``, else ``max_tokens``), if
    it is a positive int."""
    asked = request.get("max_completion_tokens", request.get("max_tokens"))
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked
    return None


def with_max_tokens(request: dict[str, Any], bound: int | None) -> dict[str, Any]:
    """``request`` whose completion may not exceed ``bound`` tokens (the field the client used:
    ``max_completion_tokens`` if present, else ``max_tokens``)."""
    if bound is None:
        return request
    key = "max_completion_tokens" if "max_completion_tokens" in request else "max_tokens"
    current = request.get(key)
    if isinstance(current, int) and not isinstance(current, bool) and current <= bound:
        return request
    return {**request, key: bound}
