"""Which arm a request belongs to: its assignment key, hashed stably, then the arms' cumulative shares.

The key (the API key, the ``user`` field, the session id or the conversation's start; see
:class:`~policies.experiments.config.ExperimentConfig`) is hashed with the experiment's name by
BLAKE2b into 16 bytes; the first 8, read as an integer over 2**64, are a number ``u`` uniform in
[0, 1). The arm is the first whose cumulative share exceeds ``u`` (a bisect). Nothing else goes in:
no process-local seed, no clock, no state, so the same key gets the same arm across requests,
restarts and replicas, and, the experiment's name being part of the hash, two experiments split the
same keys independently. The hex digest is the key's stored identity (adaptive allocation keeps
assignments by it); the key itself is never stored.

A request without its key falls back as ``missing_key`` says: ``conversation`` (the conversation's
start, which is always there), ``request`` (the request id: a fresh draw per request) or ``exclude``
(:func:`assignment_key` returns None: the request is routed as if there were no experiment).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from policies.sticky import SESSION_HEADER

_SCALE = 2.0**-64
#: A conversation start longer than this (encoded) is hashed by its first and last halves of it and its
#: length: hashing costs ~1.3 us per KB, and two conversations that share their first and last 8 KB
#: and their length sharing an arm is harmless.
_CONVERSATION_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class AssignmentKey:
    """A request's assignment key, hashed: ``source`` says which key it was (``api_key``, ``user``,
    ``session``, ``conversation`` or ``request``), ``digest`` is its 16-byte hash in this experiment."""

    source: str
    digest: bytes

    @property
    def fraction(self) -> float:
        """The key's point in [0, 1): uniform over keys, fixed for (experiment, key)."""
        return int.from_bytes(self.digest[:8], "big") * _SCALE

    @property
    def hash(self) -> str:
        """The digest as hex: how a key is stored (adaptive assignments), never the key itself."""
        return self.digest.hex()


def key_digest(experiment: str, source: str, value: str) -> bytes:
    """BLAKE2b-128 of (experiment, source, value): the hash every replica computes alike."""
    return hashlib.blake2b(f"{experiment}\x00{source}\x00{value}".encode(), digest_size=16).digest()


def key_value(kind: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The raw value of key ``kind`` in a request, or None when the request does not carry it.

    ``headers`` must answer lower-case names (Starlette's headers do; a plain dict must use them).
    """
    if kind == "user":
        user = body.get("user")
        return user if isinstance(user, str) and user else None
    if kind == "session":
        return headers.get(SESSION_HEADER) or None
    if kind == "api_key":
        auth = headers.get("authorization")
        if not auth:
            return None
        scheme, _, token = auth.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else auth.strip()
        return token or None
    if kind == "conversation":
        return conversation_hash(body)
    raise ValueError(f"unknown assignment key kind {kind!r}")


def assignment_key(
    experiment: str,
    kind: str,
    missing: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    request_id: str,
) -> AssignmentKey | None:
    """The hashed assignment key of a request in ``experiment``; None when it has no ``kind`` key and
    ``missing`` is ``exclude``."""
    value = key_value(kind, body, headers)
    source = kind
    if value is None:
        if missing == "exclude":
            return None
        source = missing
        value = conversation_hash(body) if missing == "conversation" else request_id
    return AssignmentKey(source, key_digest(experiment, source, value))


def conversation_hash(body: Mapping[str, Any]) -> str:
    """A hash of the conversation's start: its system (and developer) messages and its first user
    message, which every later turn of the conversation repeats (a completion: its prompt). A start
    over 16 KB (encoded) is hashed by its first and last 8 KB and its length, so the cost is bounded."""
    messages = body.get("messages")
    prefix: list[Any] = []
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            role = message.get("role")
            if role in ("system", "developer"):
                prefix.append((role, message.get("content")))
            elif role == "user":
                prefix.append(("user", message.get("content")))
                break
    else:
        prefix.append(("prompt", body.get("prompt")))
    encoded = orjson.dumps(prefix, option=orjson.OPT_SORT_KEYS, default=str)
    if len(encoded) > _CONVERSATION_BYTES:
        half = _CONVERSATION_BYTES // 2
        encoded = b"%b%b%d" % (encoded[:half], encoded[-half:], len(encoded))
    return hashlib.blake2b(encoded, digest_size=16).hexdigest()


class ArmTable:
    """Arms and their shares (normalised here), for picking an arm from a key's point in [0, 1)."""

    __slots__ = ("_bounds", "arms", "shares")

    def __init__(self, shares: Mapping[str, float]) -> None:
        total = float(sum(shares.values()))
        if not shares or total <= 0 or any(share < 0 for share in shares.values()):
            raise ValueError("an arm table needs non-negative shares with a positive sum")
        self.arms: tuple[str, ...] = tuple(shares)
        self.shares: dict[str, float] = {arm: share / total for arm, share in shares.items()}
        bounds, running = [], 0.0
        for arm in self.arms:
            running += self.shares[arm]
            bounds.append(running)
        # Rounding must never leave a point past the last arm that has a share (nor give a share to
        # a zero-share arm after it).
        last = max(i for i, arm in enumerate(self.arms) if self.shares[arm] > 0)
        bounds[last:] = [1.0] * (len(bounds) - last)
        self._bounds = bounds

    def pick(self, fraction: float) -> str:
        """The arm whose cumulative share first exceeds ``fraction`` (an arm of share 0 is never picked)."""
        index = bisect.bisect_right(self._bounds, fraction)
        return self.arms[min(index, len(self.arms) - 1)]
