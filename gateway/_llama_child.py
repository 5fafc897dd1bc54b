"""Entry point of the embedded model's child process: llama-cpp-python's OpenAI server, hardened.

Run as a script by :class:`gateway.local_model.LocalModelServer` (``python -P <this file>``, the
server settings as JSON on stdin); the gateway imports only ``PARENT_PID_ENV`` and ``STATS_PATH`` from
it, so nothing at module level may import llama.cpp. Before handing over to ``llama_cpp.server``'s app
it does what the stock server cannot be told to do:

* **Die with the parent.** ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, so a gateway killed with
  SIGKILL (or OOM-killed) never leaves an orphaned model server holding memory and a port. Done here,
  after ``exec``, rather than in a ``preexec_fn``, which is unsafe in a threaded parent.
* **Settings from the parent only, and never on disk.** They arrive on stdin, so a gateway killed
  at any moment of start-up leaves no settings file behind. ``llama_cpp.server`` (pydantic-settings)
  fills every setting they leave out from a same-named environment variable, case-insensitively: an
  unrelated ``API_KEY`` in the gateway's environment would make the child demand it, ``PORT``/``HOST``
  would move it. Those variables are removed from the child's environment before the server reads it.
* **No extra weight-buffer types** (``use_extra_bufts = False``). llama.cpp moves quantised weights
  into AMX / repacked buffers when the CPU advertises those features. Some hypervisors advertise AMX
  but fault on its first instruction (``ldtilecfg``), which kills the server with SIGSEGV on the
  first multi-token prompt (seen on this project's Firecracker VMs). Plain CPU buffers work everywhere.
* **Logprobs without every prompt token's logits.** llama-cpp-python answers ``logprobs`` only for a
  model loaded with ``logits_all``, and then has llama.cpp compute the vocabulary logits of every
  prompt token, which completion logprobs never read (they read the row before each generated token:
  the prompt's last row, then each generated token's). :func:`_last_row_logits` evaluates every batch
  with logits for its last token only and stores that row where the stock code would, so a request
  that does not ask for logprobs costs what it costs without them, and one that does gets the same
  numbers. ``echo`` with ``logprobs``, which would read the prompt rows, is refused (400).
* **Client errors are 400s, in OpenAI's shape.** The stock server answers a request it cannot parse
  (``"temperature": "hot"``), and several it cannot serve, with a 500, which a gateway retries and then
  reports as an upstream failure. :class:`_Guard` (an ASGI middleware in front of the app) and
  :func:`_openai_client_errors` answer them with ``400 {"error": {"message", "type":
  "invalid_request_error", "param", "code"}}`` naming the field.
* **Valid OpenAI conversations render.** SmolLM2's chat template concatenates ``content`` strings:
  it fails on content-part lists and on an assistant turn with ``content: null`` (a tool call), and
  llama-cpp-python's request model rejects that turn outright. :func:`_chat_request` flattens text
  parts, renders tool calls and tool results as text in the ChatML convention (``<tool_call>`` /
  ``<tool_response>``), maps ``developer`` to ``system`` and ``response_format: json_schema`` to
  llama.cpp's schema-constrained JSON. Images and audio are refused: the model reads text only.
* **Only what it serves.** ``n``/``best_of`` above 1 and more than one prompt per request are refused
  (the stock server silently answers one choice).
* **Stream errors before the stream.** A streamed request that fails before its first token (the
  prompt does not fit the context window, ...) gets the same JSON error as the unstreamed one: the
  response's headers are held back until the first ``data:`` event (the stock server sends a 200 at
  once and then closes an empty stream).
* **Generation stops when the client leaves.** The stock server watches for a disconnect only
  between stream chunks; an unstreamed request ran to ``max_tokens`` for nobody. The middleware
  watches the connection of every generation request and :func:`_stop_when_client_leaves` ends the
  token loop at the next token once it is gone.
* **Counters** at ``GET /pointsman/stats`` (generations started, finished, stopped because the client
  left, tokens generated), answered without waiting for a running generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import json
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Generator, MutableMapping, Sequence
from typing import Any

PARENT_PID_ENV = "POINTSMAN_PARENT_PID"
STATS_PATH = "/pointsman/stats"
_PR_SET_PDEATHSIG = 1

_CHAT_PATH = "/v1/chat/completions"
_COMPLETION_PATH = "/v1/completions"
_EMBEDDING_PATH = "/v1/embeddings"
# Content parts of media the model cannot read (it has no vision or audio input).
_MEDIA_PARTS = ("image_url", "input_image", "input_audio", "audio", "file", "input_file", "video_url")
_ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Set by the middleware for each generation request, read in the worker thread that generates (anyio
# copies the request's context into it): set once the HTTP client has gone away.
_CLIENT_GONE: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("client_gone", default=None)


def _die_with_parent() -> None:
    parent = os.environ.get(PARENT_PID_ENV)
    if not sys.platform.startswith("linux") or not parent:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The parent may have died between fork and prctl; then nobody would ever send the signal.
    if os.getppid() != int(parent):
        os._exit(1)


def _settings_from_parent_only() -> None:
    """Remove the environment variables pydantic-settings would read in place of missing settings."""
    from llama_cpp.server.settings import ConfigFileSettings, Settings

    names = {name.upper() for model in (Settings, ConfigFileSettings) for name in model.model_fields}
    names |= {"HOST", "PORT", "CONFIG_FILE"}  # read by llama_cpp.server directly, outside pydantic
    for key in list(os.environ):
        if key.upper() in names:
            del os.environ[key]


def _plain_cpu_buffers() -> None:
    import llama_cpp.llama_cpp as bindings

    default_params = bindings.llama_model_default_params

    def params() -> bindings.llama_model_params:
        value = default_params()
        value.use_extra_bufts = False
        return value

    # llama_cpp.Llama looks this function up on the module at load time, so replacing it is enough.
    bindings.llama_model_default_params = params


def _last_row_logits() -> None:
    import llama_cpp.llama as llama
    import numpy as np

    def evaluate(self: llama.Llama, tokens: Sequence[int]) -> None:
        """``Llama.eval`` (llama-cpp-python 0.3) computing and keeping only each batch's last logits row."""
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for start in range(0, len(tokens), self.n_batch):
            batch = tokens[start : min(len(tokens), start + self.n_batch)]
            n_past, n_tokens = self.n_tokens, len(batch)
            self._batch.set_batch(batch=batch, n_past=n_past, logits_all=False)
            self._ctx.decode(self._batch)
            self.input_ids[n_past : n_past + n_tokens] = batch
            if self._logits_all:  # else ``scores`` has n_batch rows and nothing reads it
                last = np.ctypeslib.as_array(self._ctx.get_logits_ith(-1), shape=(self._n_vocab,))
                self.scores[n_past + n_tokens - 1, :] = last
            self.n_tokens += n_tokens
            self._requires_eval = False

    llama.Llama.eval = evaluate  # type: ignore[method-assign]


# ----------------------------------------------------------------------------------- counters


class _Stats:
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


def _stop_when_client_leaves(stats: _Stats) -> None:
    """Make ``Llama.generate`` end at the next token once the request's client has gone away.

    Every completion, streamed or not, draws its tokens from ``Llama.generate``; returning from it
    ends the completion normally (``finish_reason: length``), so nothing downstream sees an error.
    The prompt's own evaluation is not interrupted (it is bounded by the small ``n_ctx``).
    """
    import llama_cpp.llama as llama

    original = llama.Llama.generate

    def generate(self: llama.Llama, *args: Any, **kwargs: Any) -> Generator[int, Sequence[int] | None, None]:
        """``Llama.generate``, checking between tokens whether the client is still there."""
        gone = _CLIENT_GONE.get()  # read here, in the generating thread's copy of the request's context
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
                reply = yield token
        finally:
            tokens.close()
            stats.add("generations_finished")
            # Ended here, or closed by a stream sender that saw the disconnect first.
            if not completed and gone is not None and gone.is_set():
                stats.add("generations_stopped")

    llama.Llama.generate = generate  # type: ignore[method-assign]


def _streams_end_their_generation() -> None:
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
                try:
                    async for chunk in iterate_in_threadpool(iterator):
                        await inner_send_chan.send({"data": json.dumps(chunk)})
                        if await request.is_disconnected():
                            return
                        if interrupt_requests and llama_app.llama_outer_lock.locked():
                            await inner_send_chan.send({"data": "[DONE]"})
                            return
                    await inner_send_chan.send({"data": "[DONE]"})
                finally:
                    # Not running: a worker thread's next() is always awaited to its end, even when cancelled.
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()

    llama_app.get_event_publisher = get_event_publisher


# ----------------------------------------------------------------------------------- errors


def _error(message: str, param: str | None, code: str | None) -> dict[str, Any]:
    """OpenAI's error object for a request the local model cannot take."""
    return {"message": message, "type": "invalid_request_error", "param": param, "code": code}


def _param_of(error: dict[str, Any], body: Any) -> str:
    """The field a pydantic error is about, as OpenAI names it: ``messages[1].content``.

    pydantic's location also names the union members it tried (``ChatCompletionRequestUserMessage``,
    ``str``, ``list[str]``); walking it through the request body keeps only the keys and indexes the
    body has (plus the key a ``missing`` error is about).
    """
    location = list(error.get("loc", ()))
    if location[:1] == ["body"]:
        location = location[1:]
    param, node = "", body
    for position, part in enumerate(location):
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]
        elif not (error.get("type") == "missing" and position == len(location) - 1):
            continue
        param += f"[{part}]" if isinstance(part, int) else (f".{part}" if param else str(part))
    return param or "body"


def _validation_error(errors: Sequence[dict[str, Any]], body: Any) -> dict[str, Any]:
    """One OpenAI error for pydantic's list of validation errors, naming the first offending field.

    A message that matches none of the union's members yields one error per member; those saying
    its ``role`` is not that member's role are noise beside the one about the member it meant to be.
    """
    relevant = [
        e for e in errors if not (e.get("type") == "literal_error" and tuple(e.get("loc", ()))[-1:] == ("role",))
    ]
    first = (relevant or list(errors) or [{"loc": (), "msg": "invalid request", "type": ""}])[0]
    param = _param_of(first, body)
    kind = str(first.get("type", ""))
    if kind == "missing":
        code = "missing_required_parameter"
    elif kind.endswith(("_type", "_parsing")):
        code = "invalid_type"
    else:
        code = "invalid_value"
    shown = json.dumps(first["input"], default=str)[:60] if "input" in first and kind != "missing" else None
    detail = f"{first.get('msg', 'invalid value')}" + (f" (got {shown})" if shown is not None else "")
    # Only the first: the others are mostly the other union members' view of the same mistake.
    return _error(f"Invalid '{param}': {detail}.", param, code)


class _GrammarError(ValueError):
    """A grammar (a request's ``grammar``, or one built from a JSON schema) llama.cpp cannot parse or survive."""


# Code points a token can produce: llama.cpp matches grammars against C strings of decoded UTF-8,
# so never NUL (a C string ends there) and never a surrogate or anything past U+10FFFF.
_PRODUCIBLE = ((0x01, 0xD7FF), (0xE000, 0x10FFFF))
_ESCAPES = {"x": 2, "u": 4, "U": 8}
_NAMED_ESCAPES = {"t": 0x09, "r": 0x0D, "n": 0x0A}


def _grammar_char(text: str, index: int) -> tuple[int, int]:
    """The code point of the (possibly escaped) GBNF character at ``index``, and the index after it."""
    if text[index] != "\\" or index + 1 >= len(text):
        return ord(text[index]), index + 1
    kind = text[index + 1]
    if kind in _ESCAPES:
        digits = text[index + 2 : index + 2 + _ESCAPES[kind]]
        try:
            return int(digits, 16), index + 2 + len(digits)
        except ValueError:
            return -1, index + 2 + len(digits)  # llama.cpp refuses it when parsing
    return _NAMED_ESCAPES.get(kind, ord(kind)), index + 2


def _covers(ranges: list[tuple[int, int]], low: int, high: int) -> bool:
    """Whether the union of ``ranges`` covers every code point from ``low`` to ``high``."""
    for start, end in sorted(ranges):
        if start > low:
            return False
        low = max(low, end + 1)
        if low > high:
            return True
    return low > high


def _dead_end(grammar: str) -> str | None:
    """What in ``grammar`` no token can ever produce (a NUL, an empty character class, ...), or None.

    llama.cpp does not survive such a grammar: once it masks every token, whichever token is sampled
    fails the grammar's accept step, which throws a C++ exception through the C API and aborts the
    process. Conservative: an unproducible literal or class anywhere in the grammar counts.
    """
    index = 0
    while index < len(grammar):
        char = grammar[index]
        if char == "#":
            end = grammar.find("\n", index)
            index = len(grammar) if end < 0 else end
        elif char == '"':
            index += 1
            while index < len(grammar) and grammar[index] != '"':
                point, index = _grammar_char(grammar, index)
                if not any(low <= point <= high for low, high in _PRODUCIBLE):
                    return f"the character U+{max(point, 0):04X}"
            index += 1
        elif char == "[":
            start = index
            index += 1
            negated = grammar[index : index + 1] == "^"
            index += negated
            ranges: list[tuple[int, int]] = []
            while index < len(grammar) and grammar[index] != "]":
                low, index = _grammar_char(grammar, index)
                high = low
                if grammar[index : index + 1] == "-" and grammar[index + 1 : index + 2] not in ("", "]"):
                    high, index = _grammar_char(grammar, index + 1)
                ranges.append((low, high))
            index += 1
            if negated:
                possible = not all(_covers(ranges, low, high) for low, high in _PRODUCIBLE)
            else:
                possible = any(
                    max(low, p_low) <= min(high, p_high) for low, high in ranges for p_low, p_high in _PRODUCIBLE
                )
            if not possible:
                return f"the character class {grammar[start:index][:40]}"
        else:
            index += 1
    return None


def _unparsable_grammars_are_errors() -> None:
    """Refuse a grammar llama.cpp cannot parse, or cannot survive, instead of crashing on it.

    ``llama_sampler_init_grammar`` returns NULL for a grammar it cannot parse, and llama-cpp-python
    adds that NULL to the sampler chain, which kills the process (SIGSEGV) on the first token: one
    request with ``"grammar": "root ::= ("`` would take the model down for everyone. A grammar that
    parses but needs a character no token produces aborts it too (see :func:`_dead_end`); that one is
    reachable with valid OpenAI fields (``response_format`` with ``{"const": "\\u0000"}``: llama-cpp-python's
    schema converter writes ``\\u0000`` into the grammar as a NUL).
    """
    import llama_cpp.llama_cpp as bindings
    from llama_cpp._internals import LlamaSampler

    def add_grammar(self: LlamaSampler, model: Any, grammar: Any) -> None:
        """``LlamaSampler.add_grammar``, raising :class:`_GrammarError` where the stock one would crash."""
        dead_end = _dead_end(grammar._grammar)
        if dead_end is not None:
            raise _GrammarError(f"the grammar requires {dead_end}, which the model can never produce")
        sampler = bindings.llama_sampler_init_grammar(
            model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not sampler:
            raise _GrammarError("llama.cpp could not parse the grammar")
        bindings.llama_sampler_chain_add(self.sampler, sampler)

    LlamaSampler.add_grammar = add_grammar  # type: ignore[method-assign]


class _TemplateError(ValueError):
    """The model's chat template could not render the conversation: the conversation's shape is the cause."""


def _template_errors_are_client_errors() -> None:
    """Make any failure of the GGUF chat template a :class:`_TemplateError` (a 400, not a 500).

    :func:`_chat_messages` gives the template strings everywhere it needs them; whatever shape still
    defeats it (a ``null`` user turn, ...) is the request's, not the server's, fault.
    """
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    original = Jinja2ChatFormatter.__call__

    def render(self: Jinja2ChatFormatter, **kwargs: Any) -> Any:
        """``Jinja2ChatFormatter.__call__``, its failures wrapped."""
        try:
            return original(self, **kwargs)
        except Exception as exc:
            raise _TemplateError(f"The local model's chat template cannot render these messages: {exc}") from exc

    Jinja2ChatFormatter.__call__ = render  # type: ignore[method-assign]


def _openai_client_errors() -> None:
    """Teach the stock route error handler which exceptions are the client's fault (400, not 500)."""
    from fastapi.exceptions import RequestValidationError
    from llama_cpp.server.errors import ErrorResponse, RouteErrorHandler

    original = RouteErrorHandler.error_message_wrapper

    def error_message_wrapper(
        self: RouteErrorHandler, error: Exception, body: Any = None
    ) -> tuple[int, ErrorResponse]:
        """The stock mapping, plus request validation errors and the known refusals of llama.cpp."""
        text = str(error)
        if isinstance(error, RequestValidationError):
            return 400, _validation_error(error.errors(), error.body)  # type: ignore[return-value]
        if "logprobs is not supported for models created with logits_all=False" in text:
            return 400, _error(  # type: ignore[return-value]
                "This local model does not serve logprobs (local_model.logprobs is off).", "logprobs",
                "unsupported_parameter",
            )
        if isinstance(error, _GrammarError):
            sources = ("grammar", "response_format", "tool_choice", "function_call")
            param = next((name for name in sources if getattr(body, name, None)), "grammar")
            return 400, _error(f"Invalid '{param}': {text}.", param, "invalid_value")  # type: ignore[return-value]
        if isinstance(error, _TemplateError):
            return 400, _error(text, "messages", "invalid_value")  # type: ignore[return-value]
        if text.startswith("Tool choice '") and text.endswith("not found in tools."):
            return 400, _error(text, "tool_choice", "invalid_value")  # type: ignore[return-value]
        status, response = original(self, error, body)
        if response.get("code") == "context_length_exceeded" and not hasattr(body, "messages"):
            response["param"] = "prompt"  # the stock text says "messages" for text completions too
        return status, response

    RouteErrorHandler.error_message_wrapper = error_message_wrapper  # type: ignore[method-assign]


# ----------------------------------------------------------------------------------- requests


class _Refusal(Exception):
    """A request the local model cannot serve: answered 400 with this OpenAI error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["message"])
        self.error = error


def _one_choice(request: dict[str, Any]) -> None:
    """llama.cpp's server generates one choice per request (and silently ignores ``n``)."""
    for name in ("n", "best_of"):
        value = request.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value != 1:
            raise _Refusal(_error(
                f"The local model generates one choice per request; '{name}' must be 1 (got {value}).",
                name, "unsupported_value",
            ))


def _text_of(content: list[Any], where: str, model: str) -> str:
    """The text of a content-part list (parts joined by newlines); media parts are refused."""
    texts: list[str] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _MEDIA_PARTS:
            raise _Refusal(_error(
                f"The local model {model} reads text only; {where}[{index}] is an '{kind}' part, "
                "which it cannot take.",
                f"{where}[{index}]", "unsupported_value",
            ))
        else:
            raise _Refusal(_error(
                f"Invalid '{where}[{index}]': expected a content part with type 'text'.",
                f"{where}[{index}]", "invalid_value",
            ))
    return "\n".join(texts)


def _rendered_calls(message: dict[str, Any]) -> list[str] | None:
    """An assistant turn's tool calls (and legacy ``function_call``) as ``<tool_call>`` text lines.

    None when they are not the documented shape: the request model then reports what is wrong.
    """
    calls = message.get("tool_calls")
    legacy = message.get("function_call")
    functions: list[Any] = []
    if calls is not None:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            return None
        functions += [call.get("function") for call in calls]
    if legacy is not None:
        functions.append(legacy)
    rendered = []
    for function in functions:
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return None
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments  # a model may have produced invalid JSON; show it as it was
        call = json.dumps({"name": function["name"], "arguments": parsed}, ensure_ascii=False)
        rendered.append(f"<tool_call>\n{call}\n</tool_call>")
    return rendered


def _chat_messages(messages: list[Any], model: str) -> list[Any]:
    """The conversation in a form SmolLM2's ChatML template renders (see the module docstring).

    Tool calls go into the assistant turn's text, tool (and legacy function) results into a user turn
    of ``<tool_response>`` blocks (consecutive results share one turn), as ChatML tool-use models
    (Hermes, Qwen) have them. Anything not of a documented shape is left for the request model to report.
    """
    rendered: list[Any] = []
    results: dict[str, Any] | None = None  # the user turn collecting consecutive tool results
    for index, original in enumerate(messages):
        if not isinstance(original, dict):
            rendered.append(original)
            results = None
            continue
        message = dict(original)
        role = message.get("role")
        if isinstance(message.get("content"), list):
            message["content"] = _text_of(message["content"], f"messages[{index}].content", model)
        if role in ("tool", "function") and message.get("content") is None:
            message["content"] = ""  # a tool that returned nothing
        if role in ("tool", "function") and isinstance(message.get("content"), str):
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if results is None:
                results = {"role": "user", "content": block}
                rendered.append(results)
            else:
                results["content"] += "\n" + block
            continue
        results = None
        if role == "developer":  # OpenAI's newer name for the system turn
            message["role"] = "system"
        elif role == "assistant":
            calls = _rendered_calls(message)
            if calls is not None:
                message.pop("tool_calls", None)
                message.pop("function_call", None)
                text = message.get("content")
                message["content"] = "\n".join([text, *calls] if isinstance(text, str) and text else calls)
            elif message.get("content") is None:
                message["content"] = ""
        rendered.append(message)
    return rendered


def _chat_request(request: dict[str, Any], model: str) -> None:
    """Rewrite a chat request, in place, into one llama-cpp-python serves; raise :class:`_Refusal` if none."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    _one_choice(request)
    if isinstance(request.get("messages"), list):
        request["messages"] = _chat_messages(request["messages"], model)
    if "max_tokens" not in request and "max_completion_tokens" in request:  # OpenAI's newer name
        request["max_tokens"] = request.pop("max_completion_tokens")
    if request.get("logprobs") is True and request.get("top_logprobs") is None:
        # llama-cpp-python answers logprobs only when top_logprobs is given; OpenAI does without.
        request["top_logprobs"] = 0
    for key in ("tools", "functions"):
        # ``parameters`` is optional in OpenAI's API but required by llama-cpp-python's request model.
        offered = request.get(key)
        for tool in offered if isinstance(offered, list) else ():
            function = tool.get("function") if key == "tools" and isinstance(tool, dict) else tool
            if isinstance(function, dict) and "parameters" not in function:
                function["parameters"] = dict(_ANY_OBJECT_SCHEMA)
    _named_tool_exists(request)
    response_format = request.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(schema, dict | None):
            raise _Refusal(_error(
                "Invalid 'response_format.json_schema': expected an object with a 'schema' object.",
                "response_format.json_schema", "invalid_type",
            ))
        if schema is not None:
            try:
                json_schema_to_gbnf(json.dumps(schema))
            except Exception as exc:  # any failure means the schema cannot be followed
                raise _Refusal(_error(
                    f"The local model cannot constrain its output to this JSON schema: {exc}",
                    "response_format.json_schema.schema", "invalid_value",
                )) from None
        # llama.cpp's equivalent: JSON constrained by a grammar built from the schema.
        request["response_format"] = {"type": "json_object", **({"schema": schema} if schema else {})}


def _named_tool_exists(request: dict[str, Any]) -> None:
    """A ``tool_choice`` (or legacy ``function_call``) naming a function must name one of the request's."""
    checks = (("tool_choice", "tools"), ("function_call", "functions"))
    for choice_key, list_key in checks:
        choice, offered = request.get(choice_key), request.get(list_key)
        if not isinstance(choice, dict) or not isinstance(offered, list):
            continue
        function = choice.get("function") if choice_key == "tool_choice" else choice
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            continue  # malformed: the request model reports it
        declared = [item.get("function") if list_key == "tools" else item for item in offered if isinstance(item, dict)]
        names = [item.get("name") for item in declared if isinstance(item, dict)]
        if name not in names:
            raise _Refusal(_error(
                f"Invalid '{choice_key}': it names the function {name!r}, which is not among the request's "
                f"{list_key}.",
                choice_key, "invalid_value",
            ))


def _completion_request(request: dict[str, Any]) -> None:
    """Check a text completion request; raise :class:`_Refusal` for what the local model cannot serve."""
    _one_choice(request)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise _Refusal(_error(
            f"The local model completes one prompt per request (got {len(prompt)}).", "prompt", "unsupported_value"
        ))
    if prompt in ("", [], [""]):
        # SmolLM2's tokenizer adds no BOS token, so llama-cpp-python would decode nothing and fail.
        raise _Refusal(_error("The local model needs a non-empty 'prompt'.", "prompt", "invalid_value"))
    if request.get("echo") is True and request.get("logprobs") not in (None, False):
        raise _Refusal(_error(
            "The local model cannot return the prompt's logprobs ('echo' with 'logprobs').", "echo",
            "unsupported_value",
        ))
    if "max_tokens" not in request and "max_completion_tokens" in request:
        request["max_tokens"] = request.pop("max_completion_tokens")


def _embedding_request(request: dict[str, Any]) -> None:
    """Empty input (``[]``, ``""``) is refused: llama.cpp fails to decode zero tokens (the stock answer is a 500)."""
    texts = request.get("input")
    if texts == "" or (isinstance(texts, list) and (not texts or any(text == "" for text in texts))):
        raise _Refusal(_error(
            "Invalid 'input': the local model embeds non-empty texts only.", "input", "invalid_value"
        ))


def _token_biases(request: dict[str, Any], n_vocab: int) -> None:
    """``logit_bias`` keys are token ids of this model's vocabulary (the stock server fails with a 500)."""
    bias = request.get("logit_bias")
    if not isinstance(bias, dict) or request.get("logit_bias_type") == "tokens":
        return
    for key, value in bias.items():
        # OpenAI's range; an infinite bias (JSON 1e999) could mask every token a grammar allows.
        if isinstance(value, int | float) and not -100 <= value <= 100:
            raise _Refusal(_error(
                f"Invalid 'logit_bias': values must be between -100 and 100 (got {value} for {key[:32]!r}).",
                "logit_bias", "invalid_value",
            ))
        if not (isinstance(key, str) and key.strip().lstrip("-").isdigit() and 0 <= int(key) < n_vocab):
            raise _Refusal(_error(
                f"Invalid 'logit_bias': {key[:32]!r} is not a token id of the local model (0..{n_vocab - 1}).",
                "logit_bias", "invalid_value",
            ))


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


class _Guard:
    """ASGI middleware in front of llama-cpp-python's app: checks, disconnects, held-back stream headers.

    For ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` it reads the whole
    body, answers 400 for what the model cannot serve, rewrites the rest into what llama-cpp-python
    renders, and passes it on
    with a ``receive`` of its own: it alone reads the connection, so it learns of a disconnect while the
    app is busy, and tells the generating thread (:data:`_CLIENT_GONE`).
    """

    def __init__(self, app: ASGIApp, stats: _Stats, model: str, n_vocab: int, error_of: Callable[..., Any]) -> None:
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
            await _send_json(send, 400, {"error": _error("The request body is not a JSON object.", None, None)})
            return
        try:
            if scope["path"] == _CHAT_PATH:
                _chat_request(request, self._model)
            elif scope["path"] == _COMPLETION_PATH:
                _completion_request(request)
            else:
                _embedding_request(request)
            _token_biases(request, self._n_vocab)
        except _Refusal as refusal:
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
            _CLIENT_GONE.reset(context)
            watcher.cancel()


def _error_mapper() -> Callable[[BaseException, dict[str, Any], str], tuple[int, Any]]:
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


def _serve(settings_json: bytes) -> None:
    """llama_cpp.server's ``__main__`` for settings given as JSON, with :class:`_Guard` in front."""
    import uvicorn
    from llama_cpp.server import app as llama_app
    from llama_cpp.server.settings import ConfigFileSettings, ServerSettings

    config = ConfigFileSettings.model_validate_json(settings_json)
    server_settings = ServerSettings.model_validate(config)
    stats = _Stats()
    _stop_when_client_leaves(stats)
    _streams_end_their_generation()
    _template_errors_are_client_errors()
    _unparsable_grammars_are_errors()
    _openai_client_errors()
    app = llama_app.create_app(server_settings=server_settings, model_settings=config.models)
    proxy = llama_app._llama_proxy
    assert proxy is not None
    model = config.models[0].model_alias or config.models[0].model
    guarded = _Guard(app, stats, model, proxy().n_vocab(), _error_mapper())
    uvicorn.run(guarded, host=server_settings.host, port=server_settings.port)


def main() -> None:
    _die_with_parent()
    _plain_cpu_buffers()
    _last_row_logits()
    _settings_from_parent_only()
    settings = sys.stdin.buffer.read()
    sys.argv[0] = "llama_cpp.server"
    _serve(settings)


if __name__ == "__main__":
    main()
