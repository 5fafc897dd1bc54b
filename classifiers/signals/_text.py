"""The scopes a text-scanning signal can be limited to, over the one walker in :mod:`classifiers.messages`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from classifiers.messages import SYSTEM_ROLES, TextPiece, iter_message_texts

Scope = Literal["all", "user", "last_user", "system"]
SCOPES: tuple[str, ...] = ("all", "user", "last_user", "system")

_USER = frozenset({"user"})


def iter_texts(body: Mapping[str, Any], scope: str = "all") -> Iterator[TextPiece]:
    """Every text run of the request within ``scope``.

    Scopes: ``all`` (every message, tool-call arguments, legacy prompt), ``user`` (user messages and
    the legacy prompt), ``last_user`` (the last user message only; the legacy prompt when there is no
    user message), ``system`` (system and developer messages). Only ``all`` reads tool-call arguments.
    """
    if scope == "all":
        return iter_message_texts(body)
    if scope == "last_user":
        return iter_message_texts(body, last_user=True, tool_calls=False)
    if scope == "user":
        return iter_message_texts(body, roles=_USER, tool_calls=False)
    if scope == "system":
        return iter_message_texts(body, roles=SYSTEM_ROLES, tool_calls=False, prompt=False)
    # Signals validate their scope; an unknown one has always read every message's content.
    return iter_message_texts(body, tool_calls=False, prompt=False)
