"""The gateway's log: plain text lines or one JSON object per line, tagged with the request id.

:data:`request_id` is a context variable the service sets for the request it is serving; every
line logged while serving it (in its task, or in tasks it started) carries that id. A JSON line holds
``ts``, ``level``, ``logger``, ``message``, ``request_id`` (when known), the structured extras a call
passed with ``extra={...}`` and, for an exception, ``exc_info``. Whatever the format, a credential
never reaches the log: ``Authorization``-like extras and ``Bearer``/``sk-`` tokens in messages are
masked, and prompt-like extras (``prompt``, ``messages``, ``body`` ...) are dropped unless
``logging.include_prompts`` is true. So are the messages of exceptions in logged tracebacks that the
gateway did not raise itself: ``int(value)``, a ``KeyError`` on a client's key or a driver's error can
quote the request's text; their type, frames and the gateway's own exceptions' messages stay.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re
import sys
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO

import orjson

from gateway.config import LoggingConfig

#: The id of the request being served in this context (None outside a request).
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("pointsman_request_id", default=None)

#: Extras that may hold a client's text: kept only with ``logging.include_prompts``.
PROMPT_KEYS = frozenset({"prompt", "prompts", "messages", "input", "body", "text", "content", "answer"})
#: Extras (and keys inside extras that are mappings, e.g. headers) that hold credentials: always masked.
SECRET_KEYS = frozenset({"authorization", "proxy-authorization", "api_key", "api-key", "x-api-key", "cookie",
                         "set-cookie", "password", "secret", "token", "dsn"})
MASK = "[redacted]"
_TOKEN = re.compile(r"(?i)(bearer\s+)[^\s'\",]+|\bsk-[A-Za-z0-9_\-]{6,}")
# Attributes every LogRecord has: anything else on a record came from ``extra=``.
# (uvicorn's ``color_message`` is its message with terminal colours: never wanted in JSON.)
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}


def scrub(text: str) -> str:
    """``text`` with bearer tokens and ``sk-...`` keys masked."""
    if "earer" not in text and "sk-" not in text and "EARER" not in text:
        return text
    return _TOKEN.sub(lambda m: (m.group(1) or "") + MASK, text)


#: Exceptions whose messages the gateway's own code wrote: kept in logged tracebacks.
_OWN_PACKAGES = ("gateway.", "policies.", "classifiers.", "store.", "evals.")
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def format_exception(exc_info: ExcInfo, include_prompts: bool) -> str:
    """The traceback of ``exc_info`` (and its causes) as logging prints it, credentials masked; without
    ``include_prompts`` the messages of exceptions not raised by the gateway's own code are withheld
    (types and frames are kept: enough to find the bug, never the client's text)."""
    if exc_info[0] is None:
        return ""
    error = traceback.TracebackException(*exc_info)
    if not include_prompts:
        _withhold_foreign_messages(error)
    return scrub("".join(error.format()).rstrip("\n"))


def _withhold_foreign_messages(error: traceback.TracebackException) -> None:
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        module = getattr(current.exc_type, "__module__", "") or ""
        text = getattr(current, "_str", None)  # the message, as TracebackException.format prints it
        if not module.startswith(_OWN_PACKAGES) and isinstance(text, str) and text:
            withheld = f"[message withheld ({len(text)} chars): logging.include_prompts shows it]"
            setattr(current, "_str", withheld)  # noqa: B010 (a private attribute: mypy does not know it)
        if getattr(current, "__notes__", None):
            current.__notes__ = ["[notes withheld]"]
        pending.extend(e for e in (current.__cause__, current.__context__, *(current.exceptions or ())) if e)


def _clean(key: str, value: Any, include_prompts: bool) -> Any:
    if key.lower() in SECRET_KEYS:
        return MASK
    if isinstance(value, Mapping):
        return {str(k): _clean(str(k), v, include_prompts) for k, v in value.items()
                if include_prompts or str(k).lower() not in PROMPT_KEYS}
    if isinstance(value, str):
        return scrub(value)
    return value


class RequestIdFilter(logging.Filter):
    """Puts the current :data:`request_id` on every record (``%(request_id)s`` in text formats)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        return True


class TextFormatter(logging.Formatter):
    """The classic line, with ``[request id]`` when one is known and credentials masked."""

    def __init__(self, include_prompts: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.include_prompts = include_prompts

    def formatException(self, ei: Any) -> str:
        return format_exception(ei, self.include_prompts)

    def format(self, record: logging.LogRecord) -> str:
        line = scrub(super().format(record))
        rid = getattr(record, "request_id", None)
        return line if rid is None else f"{line} [request {rid}]"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (newlines inside values are escaped, so one line per record)."""

    def __init__(self, include_prompts: bool = False) -> None:
        super().__init__()
        self.include_prompts = include_prompts

    def formatException(self, ei: Any) -> str:
        return format_exception(ei, self.include_prompts)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid is not None:
            entry["request_id"] = rid
        for key, value in vars(record).items():
            if key in _STANDARD or key in entry or key == "request_id":
                continue
            if not self.include_prompts and key.lower() in PROMPT_KEYS:
                continue
            entry[key] = _clean(key, value, self.include_prompts)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = scrub(record.exc_text)
        try:
            return orjson.dumps(entry, default=str).decode()
        except orjson.JSONEncodeError:
            # A string holding half a surrogate pair (a file name or an environment value can): orjson
            # refuses it, and logging would then print the record's raw arguments, unmasked, to stderr.
            return json.dumps(entry, default=str, ensure_ascii=True)


def configure(config: LoggingConfig, stream: TextIO | None = None) -> logging.Handler:
    """Send the process's log to ``stream`` (stderr) in ``config``'s format and level; replaces any
    handler already on the root logger. Python warnings go through the log too (one line each)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RequestIdFilter())
    formatter = JsonFormatter if config.format == "json" else TextFormatter
    handler.setFormatter(formatter(config.include_prompts))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(config.level.upper())
    logging.captureWarnings(True)
    return handler
