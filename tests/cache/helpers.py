"""Shared pieces of the cache tests: the fake's models, API keys, and one request helper."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from gateway.cache.entry import BucketItem, CachedAnswer
from gateway.cache.key import CacheKeys, cache_keys
from gateway.cache.memory import MemoryStore
from gateway.cache.redis import RedisStore
from policies.config import CacheSettings
from tests.fakes.upstream import FakeUpstream

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
AUTH = {"api_keys": [{"name": "tenant-a", "sha256": hashlib.sha256(KEY_A.encode()).hexdigest()},
                     {"name": "tenant-b", "sha256": hashlib.sha256(KEY_B.encode()).hexdigest()}]}
MODELS = {  # gateway name -> fake behaviour
    "echo-model": "echo", "text-model": "text-only", "big": "echo", "small": "echo", "len-model": "length",
    "err-model": "always-500", "bad-model": "bad-request", "trunc-model": "truncated-stream",
    "reset-model": "reset-midstream",
}


def backend(upstream: FakeUpstream) -> dict[str, Any]:
    return {"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
            "timeouts": {"connect": 1.0, "first_byte": 2.0, "total": 10.0, "idle": 1.0},
            "models": [{"name": name, "upstream_name": fake, "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 2.0}
                       for name, fake in MODELS.items()]}


def user_id() -> str:
    """A fresh ``user`` field: the fake counts upstream calls per (model, user); the cache ignores it."""
    return f"u-{uuid.uuid4().hex[:12]}"


def unique(text: str) -> str:
    return f"{text} [{uuid.uuid4().hex[:8]}]"


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    body: dict[str, Any]

    @property
    def cache(self) -> str | None:
        return self.headers.get("x-pointsman-cache")

    @property
    def text(self) -> str:
        return str(self.body["choices"][0]["message"]["content"])


def ask(base_url: str, route: str, messages: list[dict[str, Any]], *, key: str = KEY_A,
        headers: dict[str, str] | None = None, **fields: Any) -> Reply:
    body = {"model": route, "messages": messages, **fields}
    response = httpx.post(f"{base_url}/chat/completions", json=body, timeout=30,
                          headers={"authorization": f"Bearer {key}", **(headers or {})})
    return Reply(response.status_code, response.headers, response.json())


def calls(upstream: FakeUpstream, fake_model: str, user: str) -> int:
    return upstream.state.requests[(fake_model, user)]


async def stored_pair(store: MemoryStore | RedisStore) -> tuple[CacheKeys, CacheKeys]:
    """Two answers (models ``a`` and ``b``) stored in ``store`` under two exact keys of one semantic bucket,
    each with its bucket item."""
    settings = CacheSettings(mode="semantic")
    stored = []
    for name, text in (("a", "reset my password"), ("b", "How can I change my password?")):
        keys = cache_keys(tenant="t", route="r", model="m", endpoint="chat.completions", settings=settings,
                          body={"messages": [{"role": "user", "content": text}]}, encoder="enc")
        vector = np.ones(4, dtype=np.float32) / 2
        item = BucketItem(key=keys.exact, created_at=time.time(), guard=keys.guard, vector=vector)
        answer = CachedAnswer(completion={"object": "chat.completion"}, model=name, created_at=time.time())
        if isinstance(store, MemoryStore):
            store.put_now(keys, answer, item, ttl=60)
        else:
            await store.put(keys, answer, item, ttl=60)
        stored.append(keys)
    return stored[0], stored[1]
