"""Cache keys: what a cached answer is scoped by, as digests (never text).

A request's **scope** is everything that may change its answer: the tenant, the route, the model the
plan chose, the endpoint and every field of the (already redacted) body except the ones that only
change how the answer is delivered (``stream``, ``stream_options``) or who asked (``user``, unless the
route sets ``per_user``). The conversation, system prompt, tools, tool_choice, response_format and every
sampling parameter are in it, whatever their names, so an unknown new field also separates entries.

* ``exact``: a digest of the whole scope (the last user turn included).
* ``bucket``: (semantic mode) a digest of the scope with the last user turn's content left out; entries
  of one bucket are compared by the embedding of their last user turn.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from classifiers.messages import last_user_index
from policies.config import CacheSettings

#: Fields that change how an answer is delivered, not what it is.
DELIVERY_FIELDS = frozenset({"stream", "stream_options"})
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@dataclass(frozen=True, slots=True)
class CacheKeys:
    """The digests of one request's scope (hex, 32 characters)."""

    exact: str
    tenant: str  # digest of the tenant alone (16 hex): Redis key names carry it, so a tenant can be forgotten
    bucket: str | None = None  # semantic mode, when the last user turn is plain text of at most max_chars
    text: str | None = None  # that last user turn (for the encoder; stored only with store_text)
    numbers: str = ""  # digest of the numbers in the last user turn: a semantic hit needs the same ones


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def tenant_digest(tenant: str | None) -> str:
    """The digest of a tenant (``""`` when auth is off) as Redis key names carry it."""
    return hashlib.blake2b((tenant or "").encode(), digest_size=8).hexdigest()


def bypass_reason(body: Mapping[str, Any], settings: CacheSettings) -> str | None:
    """Why this request is not cached at all (None: it is)."""
    n = body.get("n")
    if n is not None and n != 1:
        return "n"  # several choices: a replay of one stored set would defeat asking for samples
    if not settings.sampled:
        temperature = body.get("temperature")
        if temperature is None or (isinstance(temperature, int | float) and temperature > 0):
            return "sampled"
    return None


def last_user_text(body: Mapping[str, Any]) -> tuple[int, str | None]:
    """(position, text) of the last user message; text None when its content is not plain text
    (images, audio, files: only an exact match may hit then)."""
    index = last_user_index(body)
    if index < 0:
        return index, None
    content = body["messages"][index].get("content")
    if isinstance(content, str):
        return index, content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type") in ("text", "input_text") and isinstance(
                part.get("text"), str
            ):
                texts.append(part["text"])
            else:
                return index, None
        return index, "\n".join(texts)
    return index, None


def numbers_digest(text: str) -> str:
    """A digest of the numbers in ``text``, in order (encoders barely see digits: "2+2" ~ "2+3")."""
    return hashlib.blake2b(" ".join(_NUMBER.findall(text)).encode(), digest_size=8).hexdigest()


def cache_keys(
    *, tenant: str | None, route: str, model: str, endpoint: str, body: Mapping[str, Any], settings: CacheSettings,
    encoder: str = "",
) -> CacheKeys:
    """The request's keys (``encoder``: the id of the encoder whose embeddings a bucket holds).

    Raises ``TypeError``/``orjson.JSONEncodeError`` on a body orjson cannot serialise canonically (the
    caller bypasses the cache then)."""
    scope = {
        k: v for k, v in body.items()
        if k not in DELIVERY_FIELDS and (k != "user" or settings.per_user)
    }
    head = orjson.dumps([tenant or "", route, model, endpoint])
    exact = _digest(head, orjson.dumps(scope, option=orjson.OPT_SORT_KEYS))
    tenant_key = tenant_digest(tenant)
    if settings.mode != "semantic":
        return CacheKeys(exact=exact, tenant=tenant_key)
    index, text = last_user_text(scope)
    if text is None or not text.strip() or len(text) > settings.max_chars:
        return CacheKeys(exact=exact, tenant=tenant_key)
    messages = list(scope["messages"])
    messages[index] = {**messages[index], "content": None}
    rest = orjson.dumps({**scope, "messages": messages}, option=orjson.OPT_SORT_KEYS)
    bucket = _digest(head, b"bucket", encoder.encode(), rest)
    return CacheKeys(exact=exact, tenant=tenant_key, bucket=bucket, text=text, numbers=numbers_digest(text))
