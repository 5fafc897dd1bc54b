"""Shared pieces of the cache tests: the fake's models, API keys, and one request helper."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.cache.entry import BucketItem, CachedAnswer
from gateway.cache.key import CacheKeys, cache_keys
from gateway.cache.memory import MemoryStore
from gateway.cache.redis import RedisStore
from policies.config import CacheSettings
from tests.fakes.upstream import FakeUpstream, LoopbackServer

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


class PairedUpstream(LoopbackServer):
    """An upstream that answers ``ECHO: <last user turn>`` (model ``echo``), but holds every request whose
    ``user`` starts with ``pair-`` until a second request of that ``user`` has arrived, then answers both:
    two identical requests are in flight together (both looked up and missed) before either is stored.
    A request still alone after ``PAIR_WAIT`` seconds is answered anyway (the test then fails on what the
    cache did, never hangs)."""

    PAIR_WAIT = 10.0

    def __init__(self) -> None:
        self.arrived: dict[str, asyncio.Event] = {}
        self.counts: Counter[str] = Counter()

        async def chat(request: Request) -> Response:
            body = await request.json()
            user = str(body.get("user") or "")
            self.counts[user] += 1
            if user.startswith("pair-"):
                both = self.arrived.setdefault(user, asyncio.Event())
                if self.counts[user] >= 2:
                    both.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(both.wait(), self.PAIR_WAIT)
            text = next((m.get("content") for m in reversed(body["messages"]) if m.get("role") == "user"), "")
            return JSONResponse({
                "id": "chatcmpl-paired", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "echo"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"ECHO: {text}"},
                             "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            })

        super().__init__(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))


def paired_backend(upstream: PairedUpstream) -> dict[str, Any]:
    return {"name": "paired", "base_url": upstream.base_url, "health": {"enabled": False},
            "timeouts": {"connect": 1.0, "first_byte": 15.0, "total": 20.0, "idle": 15.0},
            "models": [{"name": "paired-model", "upstream_name": "echo"}]}


def ask_together(base_url: str, route: str, messages: list[dict[str, Any]], *, user: str) -> list[Reply]:
    """The same request twice at once (two threads): with a :class:`PairedUpstream` both are in flight
    together until the upstream has seen both."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: ask(base_url, route, messages, user=user), range(2)))


def semantic_keys(text: str) -> CacheKeys:
    """The keys of a semantic route's request whose only message is the user turn ``text``."""
    return cache_keys(tenant="t", route="r", model="m", endpoint="chat.completions",
                      settings=CacheSettings(mode="semantic"),
                      body={"messages": [{"role": "user", "content": text}]}, encoder="enc")


def bucket_item(keys: CacheKeys) -> BucketItem:
    """A bucket item of ``keys`` (a fixed unit vector: the stores do not compare them)."""
    return BucketItem(key=keys.exact, created_at=time.time(), guard=keys.guard, vector=np.ones(4, np.float32) / 2)


async def stored_pair(store: MemoryStore | RedisStore) -> tuple[CacheKeys, CacheKeys]:
    """Two answers (models ``a`` and ``b``) stored in ``store`` under two exact keys of one semantic bucket,
    each with its bucket item."""
    stored = []
    for name, text in (("a", "reset my password"), ("b", "How can I change my password?")):
        keys = semantic_keys(text)
        item, answer = bucket_item(keys), CachedAnswer(completion={"object": "chat.completion"}, model=name,
                                                      created_at=time.time())
        if isinstance(store, MemoryStore):
            store.put_now(keys, answer, item, ttl=60)
        else:
            await store.put(keys, answer, item, ttl=60)
        stored.append(keys)
    return stored[0], stored[1]
