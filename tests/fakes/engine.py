"""A fake engine replica with a prefix cache, for replica-routing tests: a real uvicorn server on loopback.

Like vLLM with prefix caching, it remembers the conversations it has served (every message prefix of
every prompt, and of the prompt with its answer appended) in a bounded LRU table, and its time to first
token grows with the part of the prompt it has *not* seen: ``base + per_char * uncached characters``.
So a test can tell from the engine's own log (and from the client's time to first token) whether a
turn landed where its prefix was cached.

Controls (``POST /control`` with a JSON object; each key optional):

* ``healthy``: false makes ``GET /v1/models`` (the health check) and every request answer 503.
* ``waiting``: requests the engine reports waiting in its vLLM-style ``GET /metrics`` (another
  gateway's traffic the test pretends it has).
* ``forget``: true empties the prefix cache (a restarted engine).
* ``release``: true lets every request held so far finish (a request whose last user message
  contains ``[hold]`` waits for this before answering).
* ``metrics``: a text ``GET /metrics`` answers instead of the engine's own numbers (an engine that
  reports garbage); null goes back to the real ones. ``state.metrics_reads`` counts the reads.

``GET /stats`` returns ``{"requests": [{"session", "cached_chars", "uncached_chars", "ttft_s", "at"}...]}``
(``session``: the text after ``session=`` in the first user message, if any).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.upstream import LoopbackServer

_SESSION = re.compile(r"session=(\S+)")


@dataclass
class EngineState:
    """What the fake engine holds and has seen."""

    base_s: float = 0.005
    per_char_s: float = 1e-5  # 10 us a character: a 40k-character uncached prompt waits 0.4 s
    capacity: int = 10_000  # cached message prefixes
    healthy: bool = True
    waiting: int = 0
    running: int = 0
    cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event | None = None
    metrics_text: str | None = None
    metrics_reads: int = 0

    def cached_chars(self, messages: list[Any]) -> tuple[int, int]:
        """(characters of the longest cached message prefix, characters of the whole prompt)."""
        sizes = [len(orjson.dumps(m)) for m in messages]
        cached = 0
        for i in range(len(messages), 0, -1):
            if _key(messages[:i]) in self.cache:
                cached = sum(sizes[:i])
                break
        return cached, sum(sizes)

    def remember(self, messages: list[Any]) -> None:
        for i in range(1, len(messages) + 1):
            key = _key(messages[:i])
            self.cache[key] = None
            self.cache.move_to_end(key)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)


def _key(messages: list[Any]) -> bytes:
    return orjson.dumps(messages)


def _session(messages: list[Any]) -> str | None:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            found = _SESSION.search(str(message.get("content")))
            return found.group(1) if found else None
    return None


def build_engine_app(state: EngineState) -> Starlette:
    async def chat(request: Request) -> Response:
        if not state.healthy:
            return JSONResponse({"error": {"message": "engine down", "type": "server_error"}}, status_code=503)
        body = orjson.loads(await request.body())
        messages = body.get("messages") or []
        arrived = time.perf_counter()
        state.running += 1
        try:
            cached, total = state.cached_chars(messages)
            state.remember(messages)
            last = str(messages[-1].get("content")) if messages and isinstance(messages[-1], dict) else ""
            if "[hold]" in last:
                if state.release is None:
                    state.release = asyncio.Event()
                await state.release.wait()
            await asyncio.sleep(state.base_s + state.per_char_s * (total - cached))  # prefill
            ttft = time.perf_counter() - arrived
            state.requests.append({"session": _session(messages), "cached_chars": cached,
                                   "uncached_chars": total - cached, "ttft_s": ttft, "at": arrived})
            answer = f"done {len(messages)}"
            state.remember([*messages, {"role": "assistant", "content": answer}])
        finally:
            state.running -= 1
        completion = {
            "id": "chatcmpl-engine", "object": "chat.completion", "created": 1700000000,
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": total // 4, "completion_tokens": 2, "total_tokens": total // 4 + 2},
        }
        if body.get("stream"):
            return StreamingResponse(_stream(completion), media_type="text/event-stream")
        return JSONResponse(completion)

    async def models(request: Request) -> Response:
        if not state.healthy:
            return JSONResponse({"error": {"message": "engine down"}}, status_code=503)
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def metrics(request: Request) -> Response:
        state.metrics_reads += 1
        if state.metrics_text is not None:
            return PlainTextResponse(state.metrics_text)
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {float(state.running)}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {float(state.waiting)}\n'
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {min(len(state.cache) / state.capacity, 1.0)}\n'
        )

    async def control(request: Request) -> Response:
        change = orjson.loads(await request.body())
        if "healthy" in change:
            state.healthy = bool(change["healthy"])
        if "waiting" in change:
            state.waiting = int(change["waiting"])
        if "metrics" in change:
            state.metrics_text = change["metrics"]
        if change.get("forget"):
            state.cache.clear()
        if change.get("release") and state.release is not None:
            state.release.set()
            state.release = None
        return JSONResponse({"ok": True})

    async def stats(request: Request) -> Response:
        return JSONResponse({"requests": state.requests})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/control", control, methods=["POST"]),
        Route("/stats", stats, methods=["GET"]),
    ])


async def _stream(completion: dict[str, Any]) -> AsyncIterator[bytes]:
    text = completion["choices"][0]["message"]["content"]
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    for delta, finish in (({"role": "assistant", "content": text}, None), ({}, "stop")):
        chunk = base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"


class FakeEngine(LoopbackServer):
    """A prefix-caching fake engine on a loopback port; ``state`` holds its cache and request log."""

    def __init__(self, port: int | None = None, **settings: Any) -> None:
        self.state = EngineState(**settings)
        super().__init__(build_engine_app(self.state), port)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def served(self, session: str) -> list[dict[str, Any]]:
        """The requests of ``session`` this engine answered, in order."""
        return [r for r in self.state.requests if r["session"] == session]
