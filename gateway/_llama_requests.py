"""OpenAI error shapes and request checks for the embedded model's child process.

Part of ``gateway/_llama_child.py``'s hardening of llama-cpp-python's server; the checks run in
:class:`gateway._llama_guard.Guard` before a request reaches the app. Nothing at module level may
import llama.cpp (the gateway imports the child's module).

* **Client errors are 400s, in OpenAI's shape.** The stock server answers a request it cannot parse
  (``"temperature": "hot"``), and several it cannot serve, with a 500, which a gateway retries and then
  reports as an upstream failure. :class:`gateway._llama_guard.Guard` (an ASGI middleware in front of
  the app) and :func:`openai_client_errors` answer them with ``400 {"error": {"message", "type":
  "invalid_request_error", "param", "code"}}`` naming the field.
* **Valid OpenAI conversations render.** SmolLM2's chat template concatenates ``content`` strings:
  it fails on content-part lists and on an assistant turn with ``content: null`` (a tool call), and
  llama-cpp-python's request model rejects that turn outright. :func:`chat_request` flattens text
  parts, renders tool calls and tool results as text in the ChatML convention (``<tool_call>`` /
  ``<tool_response>``), maps ``developer`` to ``system`` and ``response_format: json_schema`` to
  llama.cpp's schema-constrained JSON. Images and audio are refused: the model reads text only.
* **Only what it serves.** ``n``/``best_of`` above 1 and more than one prompt per request are refused
  (the stock server silently answers one choice).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway._llama_grammar import GrammarError

# Content parts of media the model cannot read (it has no vision or audio input).
_MEDIA_PARTS = ("image_url", "input_image", "input_audio", "audio", "file", "input_file", "video_url")
_ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


# ----------------------------------------------------------------------------------- errors


def openai_error(message: str, param: str | None, code: str | None) -> dict[str, Any]:
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
    return openai_error(f"Invalid '{param}': {detail}.", param, code)


class _TemplateError(ValueError):
    """The model's chat template could not render the conversation: the conversation's shape is the cause."""


def template_errors_are_client_errors() -> None:
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


def openai_client_errors() -> None:
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
            return 400, openai_error(  # type: ignore[return-value]
                "This local model does not serve logprobs (local_model.logprobs is off).", "logprobs",
                "unsupported_parameter",
            )
        if isinstance(error, GrammarError):
            sources = ("grammar", "response_format", "tool_choice", "function_call")
            param = next((name for name in sources if getattr(body, name, None)), "grammar")
            return 400, openai_error(f"Invalid '{param}': {text}.", param, "invalid_value")  # type: ignore[return-value]
        if isinstance(error, _TemplateError):
            return 400, openai_error(text, "messages", "invalid_value")  # type: ignore[return-value]
        if text.startswith("Tool choice '") and text.endswith("not found in tools."):
            return 400, openai_error(text, "tool_choice", "invalid_value")  # type: ignore[return-value]
        status, response = original(self, error, body)
        if response.get("code") == "context_length_exceeded" and not hasattr(body, "messages"):
            response["param"] = "prompt"  # the stock text says "messages" for text completions too
        return status, response

    RouteErrorHandler.error_message_wrapper = error_message_wrapper  # type: ignore[method-assign]


# ----------------------------------------------------------------------------------- requests


class Refusal(Exception):
    """A request the local model cannot serve: answered 400 with this OpenAI error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["message"])
        self.error = error


def _one_choice(request: dict[str, Any]) -> None:
    """llama.cpp's server generates one choice per request (and silently ignores ``n``)."""
    for name in ("n", "best_of"):
        value = request.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value != 1:
            raise Refusal(openai_error(
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
            raise Refusal(openai_error(
                f"The local model {model} reads text only; {where}[{index}] is an '{kind}' part, "
                "which it cannot take.",
                f"{where}[{index}]", "unsupported_value",
            ))
        else:
            raise Refusal(openai_error(
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


def chat_request(request: dict[str, Any], model: str) -> None:
    """Rewrite a chat request, in place, into one llama-cpp-python serves; raise :class:`Refusal` if none."""
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
            raise Refusal(openai_error(
                "Invalid 'response_format.json_schema': expected an object with a 'schema' object.",
                "response_format.json_schema", "invalid_type",
            ))
        if schema is not None:
            try:
                json_schema_to_gbnf(json.dumps(schema))
            except Exception as exc:  # any failure means the schema cannot be followed
                raise Refusal(openai_error(
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
            raise Refusal(openai_error(
                f"Invalid '{choice_key}': it names the function {name!r}, which is not among the request's "
                f"{list_key}.",
                choice_key, "invalid_value",
            ))


def completion_request(request: dict[str, Any]) -> None:
    """Check a text completion request; raise :class:`Refusal` for what the local model cannot serve."""
    _one_choice(request)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise Refusal(openai_error(
            f"The local model completes one prompt per request (got {len(prompt)}).", "prompt", "unsupported_value"
        ))
    if prompt in ("", [], [""]):
        # SmolLM2's tokenizer adds no BOS token, so llama-cpp-python would decode nothing and fail.
        raise Refusal(openai_error("The local model needs a non-empty 'prompt'.", "prompt", "invalid_value"))
    if request.get("echo") is True and request.get("logprobs") not in (None, False):
        raise Refusal(openai_error(
            "The local model cannot return the prompt's logprobs ('echo' with 'logprobs').", "echo",
            "unsupported_value",
        ))
    if "max_tokens" not in request and "max_completion_tokens" in request:
        request["max_tokens"] = request.pop("max_completion_tokens")


def embedding_request(request: dict[str, Any]) -> None:
    """Empty input (``[]``, ``""``) is refused: llama.cpp fails to decode zero tokens (the stock answer is a 500)."""
    texts = request.get("input")
    if texts == "" or (isinstance(texts, list) and (not texts or any(text == "" for text in texts))):
        raise Refusal(openai_error(
            "Invalid 'input': the local model embeds non-empty texts only.", "input", "invalid_value"
        ))


def token_biases(request: dict[str, Any], n_vocab: int) -> None:
    """``logit_bias`` keys are token ids of this model's vocabulary (the stock server fails with a 500)."""
    bias = request.get("logit_bias")
    if not isinstance(bias, dict) or request.get("logit_bias_type") == "tokens":
        return
    for key, value in bias.items():
        # OpenAI's range; an infinite bias (JSON 1e999) could mask every token a grammar allows.
        if isinstance(value, int | float) and not -100 <= value <= 100:
            raise Refusal(openai_error(
                f"Invalid 'logit_bias': values must be between -100 and 100 (got {value} for {key[:32]!r}).",
                "logit_bias", "invalid_value",
            ))
        if not (isinstance(key, str) and key.strip().lstrip("-").isdigit() and 0 <= int(key) < n_vocab):
            raise Refusal(openai_error(
                f"Invalid 'logit_bias': {key[:32]!r} is not a token id of the local model (0..{n_vocab - 1}).",
                "logit_bias", "invalid_value",
            ))
