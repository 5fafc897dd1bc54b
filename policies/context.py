"""What a policy sees of a request: the whole conversation and the request's parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, frozen=True)
class RequestContext:
    """One request as the routing layer sees it.

    ``body`` is the parsed OpenAI request (messages, tools, params): policies read the whole
    conversation from it, never just the last message. It must not be mutated.
    """

    request_id: str
    endpoint: str  # "chat.completions" | "completions" | "embeddings"
    route: str  # the virtual model the client asked for, e.g. "auto"
    body: Mapping[str, Any]
    tenant: str | None = None
    session_id: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The body's bytes as received, when there are any (they let a long request's text scans run
    #: in another process without re-encoding the body here).
    raw_body: bytes | None = None
