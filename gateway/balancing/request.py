"""What a request brings to replica choice (:class:`~gateway.balancing.select.Affinity`), computed once
per request and per partitioning, only for what the backend's policy reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import xxhash

from gateway.balancing.prefix import prefix_blocks, tenant_seed
from gateway.balancing.select import Affinity, ReplicaPolicy
from policies.sticky import conversation_start

#: Expected completion tokens when the request sets no limit, and the cap on what a limit counts for:
#: a token-load estimate, not a promise (agents' tool calls are short; max_tokens is often generous).
DEFAULT_OUTPUT_TOKENS = 256
MAX_OUTPUT_TOKENS = 1024

_NONE = Affinity()


class BalancingSettings(Protocol):
    """The parts of ``backends[].balancing`` a request's affinity depends on."""

    @property
    def load(self) -> str: ...
    @property
    def partition(self) -> str: ...
    @property
    def block_bytes(self) -> int: ...


def affinity_of(
    policy: ReplicaPolicy, settings: BalancingSettings, raw_body: bytes, tenant: str | None,
    session_id: str | None, body: Mapping[str, Any], cache: dict[tuple[Any, ...], Affinity],
) -> Affinity:
    """The request's affinity for a backend with ``policy`` and ``settings``; ``cache`` (one per request)
    keeps it for the next candidate model whose backend partitions the same way."""
    if not (policy.needs_blocks or policy.needs_session or settings.load == "tokens"):
        return _NONE
    key = (settings.partition, settings.block_bytes, policy.needs_blocks, policy.needs_session)
    found = cache.get(key)
    if found is not None:
        return found
    scope = tenant if settings.partition == "tenant" else None
    affinity = Affinity(output_tokens=_output_tokens(body), prompt_bytes=len(raw_body))
    if policy.needs_blocks:
        affinity.blocks = prefix_blocks(raw_body, seed=tenant_seed(scope), block_bytes=settings.block_bytes)
    if policy.needs_session:
        affinity.session = session_hash(scope, session_id, body)
    cache[key] = affinity
    return affinity


def session_hash(tenant: str | None, session_id: str | None, body: Mapping[str, Any]) -> int | None:
    """A 64-bit key of the request's session: its ``x-pointsman-session-id``, else the conversation's
    start (system prompt and first user message, which every later turn repeats), scoped by tenant.
    None when there is neither: a request without a conversation (embeddings' ``input``, no messages
    or prompt) is no session's turn, and one shared key would pin all of a tenant's such requests to
    the replica the first one went to.

    Only the first :data:`SESSION_START_CHARS` characters of the start are hashed: the key places a
    session on a replica, so two sessions that open with the same 8k characters may share one (their
    shared prefix is cached there anyway), and a 100k-token pasted first message costs no more than a
    short one.
    """
    scope = (tenant or "").encode() + b"\x00"
    if session_id:
        return xxhash.xxh3_64_intdigest(scope + b"id\x00" + session_id.encode())
    start = conversation_start(body)
    if all(part is None for part in start):  # [] (no system or user message) or [None] (no prompt)
        return None
    digest = xxhash.xxh3_64(scope + b"start\x00")
    _feed(digest, start, SESSION_START_CHARS)
    return digest.intdigest()


#: Characters of a conversation's start that make its session key (see :func:`session_hash`).
SESSION_START_CHARS = 8192


def _feed(digest: Any, value: Any, budget: int) -> int:
    """Hash ``value``'s strings (structure-marked, cut to ``budget`` characters in all) into ``digest``;
    returns the budget left. Walks JSON-like values: strings, lists, dicts (sorted keys), scalars."""
    if budget <= 0:
        return 0
    if isinstance(value, str):
        piece = value[:budget]
        digest.update(b"s" + piece.encode("utf-8", "surrogatepass") + b"\x00")
        return budget - len(piece)
    if isinstance(value, list | tuple):
        digest.update(b"[")
        for item in value:
            budget = _feed(digest, item, budget)
        digest.update(b"]")
        return budget
    if isinstance(value, Mapping):
        digest.update(b"{")
        for key in sorted(value, key=str):
            budget = _feed(digest, str(key), budget)
            budget = _feed(digest, value[key], budget)
        digest.update(b"}")
        return budget
    digest.update(b"v" + repr(value).encode() + b"\x00")
    return budget


def _output_tokens(body: Mapping[str, Any]) -> int:
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if type(value) is int and value > 0:
            return min(value, MAX_OUTPUT_TOKENS)
    return DEFAULT_OUTPUT_TOKENS
