"""Token usage and cost: read from upstream responses, never estimated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.config import ModelConfig


def usage_from_body(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from an OpenAI response object's ``usage``, if present."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return None, None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else (0 if isinstance(prompt, int) else None),
    )


def cost_usd(model: ModelConfig, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
    """Cost of one call from the configured per-million-token prices; None when usage is unknown."""
    if prompt_tokens is None and completion_tokens is None:
        return None
    return (
        (prompt_tokens or 0) * model.input_cost_per_mtok + (completion_tokens or 0) * model.output_cost_per_mtok
    ) / 1_000_000


class SSEUsageScanner:
    """Watches a passthrough SSE byte stream for the ``usage`` chunk (``stream_options.include_usage``).

    The bytes forwarded to the client are never touched; this only looks at complete events that
    mention a non-null usage, so the per-chunk cost stays a couple of substring searches.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.saw_done = False
        self.events = 0

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        if b"\n\n" not in self._buffer and b"\r\n\r\n" not in self._buffer:
            return
        text = bytes(self._buffer).replace(b"\r\n", b"\n")
        *events, rest = text.split(b"\n\n")
        self._buffer = bytearray(rest)
        for event in events:
            self._scan(event)

    def _scan(self, event: bytes) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            self.events += 1
            data = line[5:].strip()
            if data == b"[DONE]":
                self.saw_done = True
            elif b'"usage"' in data and b'"usage":null' not in data and b'"usage": null' not in data:
                try:
                    parsed = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    prompt, completion = usage_from_body(parsed)
                    if prompt is not None:
                        self.prompt_tokens, self.completion_tokens = prompt, completion
