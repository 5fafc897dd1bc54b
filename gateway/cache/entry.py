"""What the cache keeps per answer, and which answers it keeps at all.

Only a complete, successful answer is stored: HTTP 200, one choice, ``finish_reason: "stop"`` (never
``length``, ``tool_calls``, ``content_filter``, an error, a stream that broke or ended without
``[DONE]``). An entry holds the chat completion object, the model that answered, when, and — only
with ``store_text`` — the last user turn's text. No other prompt text is ever stored: entries are
found by digests (``gateway/cache/key.py``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

_FORMAT = 1


@dataclass(slots=True)
class CachedAnswer:
    """One stored answer."""

    completion: dict[str, Any]  # an OpenAI chat.completion object (one choice)
    model: str  # the gateway's name of the model that answered
    created_at: float  # wall-clock seconds
    text: str | None = None  # the last user turn, only with store_text

    def to_bytes(self) -> bytes:
        return orjson.dumps({"v": _FORMAT, "completion": self.completion, "model": self.model,
                             "created_at": self.created_at, "text": self.text})

    @classmethod
    def from_bytes(cls, data: bytes) -> CachedAnswer | None:
        """The entry, or None for bytes that are not one (another release's format, corruption)."""
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(raw, dict) or raw.get("v") != _FORMAT or not isinstance(raw.get("completion"), dict):
            return None
        return cls(completion=raw["completion"], model=str(raw.get("model") or ""),
                   created_at=float(raw.get("created_at") or 0.0), text=raw.get("text"))


@dataclass(frozen=True, slots=True)
class BucketItem:
    """One entry of a semantic bucket: its exact key, when it was stored, its last user turn's guard
    digest (numbers, signs, units, negations: ``gateway/cache/key.py``) and that turn's embedding."""

    key: str
    created_at: float
    guard: str
    vector: np.ndarray  # float32, unit length

    def to_bytes(self) -> bytes:
        return (bytes.fromhex(self.key) + bytes.fromhex(self.guard) + struct.pack("<d", self.created_at)
                + self.vector.astype("<f2").tobytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> BucketItem | None:
        if len(data) < 32 or (len(data) - 32) % 2:
            return None
        (created,) = struct.unpack("<d", data[24:32])
        vector = np.frombuffer(data[32:], dtype="<f2").astype(np.float32)
        return cls(key=data[:16].hex(), created_at=created, guard=data[16:24].hex(), vector=vector)


def storable_completion(body: bytes) -> dict[str, Any] | None:
    """The answer as a chat completion if it may be cached (one choice that stopped normally)."""
    try:
        completion = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(completion, dict) or completion.get("object") != "chat.completion":
        return None
    choices = completion.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        return None
    choice = choices[0]
    message = choice.get("message")
    if choice.get("finish_reason") != "stop" or not isinstance(message, Mapping):
        return None
    if message.get("tool_calls") or message.get("function_call"):
        return None
    if not isinstance(message.get("content"), str):
        return None
    return completion


def completion_from_stream(*, text: str, model: str, usage: tuple[int | None, int | None]) -> dict[str, Any]:
    """The chat completion a complete streamed answer amounts to (``usage`` zero when the stream had none)."""
    prompt, completion_tokens = usage
    usage_obj = {"prompt_tokens": prompt or 0, "completion_tokens": completion_tokens or 0,
                 "total_tokens": (prompt or 0) + (completion_tokens or 0)}
    return {
        "id": "chatcmpl-cached", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": usage_obj,
    }
