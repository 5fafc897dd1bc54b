"""The ASGI guard in front of the embedded model's llama-cpp-python app, and its counters.

Part of ``gateway/_llama_child.py``'s hardening of llama-cpp-python's server (the request checks it
runs are in :mod:`gateway._llama_requests`). Nothing at module level may import llama.cpp (the gateway
imports ``STATS_PATH`` through the child's module).

* **Stream errors before the stream.** A streamed request that fails before its first token (the
  prompt does not fit the context window, ...) gets the same JSON error as the unstreamed one: the
  response's headers are held back until the first ``data:`` event (the stock server sends a 200 at
  once and then closes an empty stream).
* **Generation stops when the client leaves.** The stock server watches for a disconnect only
  between stream chunks; an unstreamed request ran to ``max_tokens`` for nobody. The middleware
  watches the connection of every generation request and :func:`stop_when_client_leaves` ends the
  token loop at the next token once it is gone.
* **Usage in streams.** ``stream_options.include_usage`` ends a stream with OpenAI's usage chunk
  (no choices; prompt and generated tokens counted as they are generated).
* **Counters** at ``GET /pointsman/stats`` (generations started, finished, stopped because the client
  left, tokens generated), answered without waiting for a running generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
from collections.abc import Awaitable, Callable, Generator, MutableMapping, Sequence
from typing import Any

from gateway._llama_requests import (
    Refusal,
    chat_request,
    completion_request,
    embedding_request,
    openai_error,
    token_biases,
)

STATS_PATH = "/pointsman/stats"

_CHAT_PATH = "/v1/chat/completions"
_COMPLETION_PATH = "/v1/completions"
_EMBEDDING_PATH = "/v1/embeddings"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Set by the middleware for each generation request, read in the worker thread that generates (anyio
# copies the request's context into it): set once the HTTP client has gone away.
_CLIENT_GONE: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("client_gone", default=None)


class TokenCounts:
    """One generation's prompt and generated tokens, filled in the generating thread (a streamed request
    with ``stream_options.include_usage`` ends with them as OpenAI's usage chunk; the stock server sends none)."""

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0

    def usage(self) -> dict[str, int]:
        """OpenAI's ``usage`` object."""
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion}


# Set by the middleware for a streamed request that asked for usage; shared by reference with the
# worker thread (anyio copies the context, not the object).
_USAGE: contextvars.ContextVar[TokenCounts | None] = contextvars.ContextVar("usage", default=None)


# ----------------------------------------------------------------------------------- counters


class Stats:
    """Generation counters, updated from worker threads and read by ``GET /pointsman/stats``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {"generations_started": 0, "generations_finished": 0, "generations_stopped": 0,
                        "tokens_generated": 0}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def stop_when_client_leaves(stats: Stats) -> None:
    """Make ``Llama.generate`` end at the next token once the request's client has gone away.

    Every completion, streamed or not, draws its tokens from ``Llama.generate``; returning from it
    ends the completion normally (``finish_reason: length``), so nothing downstream sees an error.
    The prompt's own evaluation is not interrupted (it is bounded by the small ``n_ctx``).
    """
    import llama_cpp
    import llama_cpp.llama as llama

    original = llama.Llama.generate

    def generate(self: llama.Llama, *args: Any, **kwargs: Any) -> Generator[int, Sequence[int] | None, None]:
        """``Llama.generate``, checking between tokens whether the client is still there."""
        gone = _CLIENT_GONE.get()  # read here, in the generating thread's copy of the request's context
        counts = _USAGE.get()
        if counts is not None:
            prompt = args[0] if args else kwargs.get("tokens", ())
            counts.prompt = len(prompt)
        tokens = original(self, *args, **kwargs)
        stats.add("generations_started")
        completed = False
        try:
            reply: Sequence[int] | None = None
            while gone is None or not gone.is_set():
                try:
                    token = tokens.send(reply)  # None starts it, like next()
                except StopIteration:
                    completed = True
                    return
                stats.add("tokens_generated")
                # The end-of-generation token ends the answer without being part of it: the completion
                # leaves it out of its text and its usage, and so does the stream's usage chunk.
                if counts is not None and not llama_cpp.llama_vocab_is_eog(self._model.vocab, token):
                    counts.completion += 1
                reply = yield token
        finally:
            tokens.close()
            stats.add("generations_finished")
            # Ended here, or closed by a stream sender that saw the disconnect first.
            if not completed and gone is not None and gone.is_set():
                stats.add("generations_stopped")

    llama.Llama.generate = generate  # type: ignore[method-assign]


def streams_end_their_generation() -> None:
    """Replace the stock stream sender with one that closes the token generator when the stream ends.

    The stock sender (``llama_cpp.server.app.get_event_publisher``, looked up by the route at request
    time) stops pulling chunks when its client disconnects but leaves the generator suspended until
    the garbage collector finds it. Closing it at once ends the generation's bookkeeping (and frees
    its state) before the next request starts. Otherwise it does what the stock one does.
    """
    from llama_cpp.server import app as llama_app
    from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

    async def get_event_publisher(
        request: Any, inner_send_chan: Any, body: Any, body_model: str | None, llama_call: Any, kwargs: Any
    ) -> None:
        """Send a completion's chunks to ``inner_send_chan`` until done or the client has gone."""
        server_settings = next(llama_app.get_server_settings())
        interrupt_requests = server_settings.interrupt_requests if server_settings else False
        async with contextlib.asynccontextmanager(llama_app.get_llama_proxy)() as llama_proxy:
            llama = llama_app.prepare_request_resources(body, llama_proxy, body_model, kwargs)
            async with inner_send_chan:
                iterator = await run_in_threadpool(llama_call, llama, **kwargs)
                counts = _USAGE.get()
                last: dict[str, Any] | None = None
                try:
                    async for chunk in iterate_in_threadpool(iterator):
                        last = chunk
                        await inner_send_chan.send({"data": json.dumps(chunk)})
                        if await request.is_disconnected():
                            return
                        if interrupt_requests and llama_app.llama_outer_lock.locked():
                            await inner_send_chan.send({"data": "[DONE]"})
                            return
                    if counts is not None and last is not None:
                        await inner_send_chan.send({"data": json.dumps(usage_chunk(last, counts))})
                    await inner_send_chan.send({"data": "[DONE]"})
                finally:
                    # Not running: a worker thread's next() is always awaited to its end, even when cancelled.
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()

    llama_app.get_event_publisher = get_event_publisher


def usage_chunk(last: dict[str, Any], counts: TokenCounts) -> dict[str, Any]:
    """The final chunk OpenAI sends for ``stream_options.include_usage``: no choices, the usage."""
    fields: dict[str, Any] = {key: last[key] for key in ("id", "object", "created", "model") if key in last}
    return {**fields, "choices": [], "usage": counts.usage()}


# ----------------------------------------------------------------------------------- ASGI


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _has_data_event(body: bytes) -> bool:
    return body.startswith(b"data:") or b"\ndata:" in body


def _innermost(error: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio task groups wrap what a stream's sender raised)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


class Guard:
    """ASGI middleware in front of llama-cpp-python's app: checks, disconnects, held-back stream headers.

    For ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` it reads the whole
    body, answers 400 for what the model cannot serve, rewrites the rest into what llama-cpp-python
    renders, and passes it on
    with a ``receive`` of its own: it alone reads the connection, so it learns of a disconnect while the
    app is busy, and tells the generating thread (:data:`_CLIENT_GONE`).
    """

    def __init__(self, app: ASGIApp, stats: Stats, model: str, n_vocab: int, error_of: Callable[..., Any]) -> None:
        self._app = app
        self._stats = stats
        self._model = model
        self._n_vocab = n_vocab
        self._error_of = error_of  # (exception, request dict, path) -> (status, error object)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == STATS_PATH:
            await _send_json(send, 200, self._stats.snapshot())
            return
        if scope["method"] != "POST" or scope["path"] not in (_CHAT_PATH, _COMPLETION_PATH, _EMBEDDING_PATH):
            await self._app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before it finished sending: nobody to answer
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            await _send_json(send, 400, {"error": openai_error("The request body is not a JSON object.", None, None)})
            return
        try:
            if scope["path"] == _CHAT_PATH:
                chat_request(request, self._model)
            elif scope["path"] == _COMPLETION_PATH:
                completion_request(request)
            else:
                embedding_request(request)
            token_biases(request, self._n_vocab)
        except Refusal as refusal:
            await _send_json(send, 400, {"error": refusal.error})
            return
        body = json.dumps(request).encode("utf-8")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode("ascii"))]}
        await self._generate(scope, receive, send, body, request)

    async def _generate(self, scope: Scope, receive: Receive, send: Send, body: bytes, request: dict[str, Any]) -> None:
        """Run the app on ``body`` while watching the connection; hold a stream's headers until its first event."""
        gone = threading.Event()
        disconnected = asyncio.Event()

        async def watch() -> None:
            try:
                while (await receive())["type"] != "http.disconnect":
                    pass
            except Exception:  # a connection the server can no longer read is as good as gone
                pass
            gone.set()
            disconnected.set()

        body_sent = False

        async def app_receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            # No await when already gone: Starlette's ``is_disconnected`` polls inside a cancelled scope.
            if not disconnected.is_set():
                await disconnected.wait()
            return {"type": "http.disconnect"}

        # A stream's status line waits for its first event, so an error before the first token (the
        # prompt does not fit n_ctx, ...) can still be the JSON error an unstreamed request gets.
        committed = request.get("stream") is not True
        held: list[Message] = []

        async def app_send(message: Message) -> None:
            nonlocal committed
            if committed:
                await send(message)
                return
            held.append(message)
            if message["type"] == "http.response.body" and _has_data_event(message.get("body", b"")):
                await flush()

        async def flush() -> None:
            nonlocal committed
            committed = True
            for queued in held:
                await send(queued)
            held.clear()

        watcher = asyncio.create_task(watch())
        context = _CLIENT_GONE.set(gone)
        options = request.get("stream_options")
        wants_usage = committed is False and isinstance(options, dict) and options.get("include_usage") is True
        usage_context = _USAGE.set(TokenCounts() if wants_usage else None)
        try:
            await self._app(scope, app_receive, app_send)
            # Ended without an event (an error answered as JSON, an empty stream): send it as it was.
            # A stream whose sender failed ends the same way, but the failure then reaches us first.
            await flush()
        except Exception as exc:  # re-raised unless it can still be answered
            if committed:
                raise
            if gone.is_set():
                return  # nobody to answer
            status, error = self._error_of(_innermost(exc), request, scope["path"])
            await _send_json(send, status, {"error": error})
        finally:
            _USAGE.reset(usage_context)
            _CLIENT_GONE.reset(context)
            watcher.cancel()


def error_mapper() -> Callable[[BaseException, dict[str, Any], str], tuple[int, Any]]:
    """``(exception, request, path) -> (status, error)`` exactly as the stock routes map exceptions."""
    from llama_cpp.server.errors import RouteErrorHandler
    from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest, CreateEmbeddingRequest

    models = {_CHAT_PATH: CreateChatCompletionRequest, _COMPLETION_PATH: CreateCompletionRequest,
              _EMBEDDING_PATH: CreateEmbeddingRequest}

    def error_of(error: BaseException, request: dict[str, Any], path: str) -> tuple[int, Any]:
        model = models[path]
        try:
            body: Any = model(**request)
        except Exception:  # the stock handler then maps without a body, as here
            body = None
        if not isinstance(error, Exception):
            error = RuntimeError(repr(error))
        # The wrapper reads only class attributes: the class itself serves as ``self``.
        status, payload = RouteErrorHandler.error_message_wrapper(RouteErrorHandler, error, body)  # type: ignore[arg-type]
        return status, payload

    return error_of
