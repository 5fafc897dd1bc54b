"""Token usage and cost: read from upstream responses, never estimated."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.config import ModelConfig
from gateway.sse_frames import EventTooLarge, SSEFramer, event_data
from policies.echo import masked_prefix

_FINISH_LENGTH = re.compile(rb'"finish_reason"\s*:\s*"length"')


#: More tokens than any one call reads or writes: a count beyond it is an upstream's bug, not usage.
MAX_TOKENS_PER_CALL = 1 << 31


def token_count(value: Any) -> int | None:
    """``value`` if it is a token count an upstream could have meant (an int in [0, 2^31)), else None.

    An upstream's ``usage`` is not trusted: a negative count once failed the request with a 500 after the
    answer was in (Prometheus counters only go up) and lost its record; a count of 2^63 made every later
    decision-log batch fail to insert.
    """
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TOKENS_PER_CALL:
        return value
    return None


def usage_from_body(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from an OpenAI response object's ``usage``, if present and sane
    (see :func:`token_count`; a count that is not is unknown)."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return None, None
    prompt = token_count(usage.get("prompt_tokens"))
    completion = token_count(usage.get("completion_tokens"))
    return prompt, completion if completion is not None else (0 if prompt is not None else None)


def cost_usd(model: ModelConfig, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
    """Cost of one call from the configured per-million-token prices; None when usage is unknown."""
    if prompt_tokens is None and completion_tokens is None:
        return None
    return (
        (prompt_tokens or 0) * model.input_cost_per_mtok + (completion_tokens or 0) * model.output_cost_per_mtok
    ) / 1_000_000


class SSEUsageScanner:
    """Watches a passthrough SSE byte stream for the ``usage`` chunk (``stream_options.include_usage``)
    and for an answer cut at the token limit (``finish_reason: "length"``).

    The bytes forwarded to the client are never touched. Every data event is parsed once (orjson,
    about a microsecond for a chunk): an upstream's event that is not JSON must not reach a client
    whose SDK would fail on it with a JSON error. With ``collect_text`` it also keeps the first
    choice's text (for a comparison of the answer).
    """

    def __init__(self, *, collect_text: bool = False) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.saw_done = False
        self.events = 0
        self.finish_length = False
        self._parts: list[str] | None = [] if collect_text else None
        # With the text: the first choice's finish_reason, and whether anything but content came
        # (tool calls, a refusal, another choice): the response cache stores only plain text answers.
        self.finish_reason: str | None = None
        self.other_deltas = False
        # What a stream's events said that makes it a failed answer, for the record (the events
        # themselves reach the client as they came, or not at all when they were malformed).
        self.upstream_error: str | None = None  # the code of an error object the upstream streamed
        self.malformed = False  # an event's data was neither JSON nor [DONE]
        self._framer = SSEFramer()

    def keep_text(self) -> None:
        """Collect the text from now on (call before the first chunk)."""
        if self._parts is None:
            self._parts = []

    @property
    def text(self) -> str | None:
        """The streamed answer's text when collected (first choice's content deltas), else None."""
        return None if self._parts is None else "".join(self._parts)

    def feed(self, chunk: bytes) -> None:
        """Scan the events ``chunk`` completes (any split of the stream; an oversized event is skipped)."""
        try:
            events = self._framer.feed(chunk)
        except EventTooLarge:
            self._framer = SSEFramer()
            return
        for event in events:
            self.scan(event)

    def scan(self, event: bytes) -> None:
        """Read one whole event (as :class:`gateway.sse_frames.SSEFramer` cuts them): ``[DONE]``, a usage
        chunk, an upstream's error object (``upstream_error``), data that is not JSON (``malformed``)."""
        data = event_data(event)
        if data is None:
            return
        self.events += 1
        data = data.strip()
        if data == b"[DONE]":
            self.saw_done = True
            return
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.malformed = True  # the client's SDK would fail on it with a JSON error, not an API error
            return
        if not isinstance(parsed, dict):
            return
        if b'"error"' in data and parsed.get("error"):
            error = parsed["error"]
            code = error.get("code") if isinstance(error, dict) else None
            # Upstream text stored in the record (error_message): treated as a client's echo, digits masked.
            self.upstream_error = masked_prefix(str(code)) if isinstance(code, (str, int)) else "error"
            return
        if b'"length"' in data and _FINISH_LENGTH.search(data) is not None:
            self.finish_length = True
        if self._parts is not None:
            self._collect(parsed)
        if b'"usage"' in data:
            prompt, completion = usage_from_body(parsed)
            if prompt is not None:
                self.prompt_tokens, self.completion_tokens = prompt, completion

    def _collect(self, parsed: dict[str, Any]) -> None:
        choices = parsed.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.other_deltas = True
                continue
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                assert self._parts is not None
                self._parts.append(content)
            if isinstance(delta, dict) and any(delta.get(k) for k in ("tool_calls", "function_call", "refusal")):
                self.other_deltas = True
            finish = choice.get("finish_reason")
            if isinstance(finish, str):
                self.finish_reason = finish
