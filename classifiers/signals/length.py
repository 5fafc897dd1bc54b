"""Estimated token length of the whole conversation (messages, tool calls and tool definitions).

The estimate needs no tokenizer. It counts *pieces* — runs of word characters and single
punctuation characters — and digits (BPE vocabularies split numbers into 1-3 digit tokens), plus one
token per CJK character (about one token each in BPE vocabularies), then adds OpenAI's documented
chat framing overhead (about 4 tokens per message plus 3 to prime the reply)::

    tokens ≈ 1.08 * pieces + 0.54 * digits (+ CJK characters) + 4 * messages + 3

The two coefficients are a least-squares fit on 825 texts (RouteLLM MMLU/GSM8K/MT-bench prompts and
model answers, MBPP prompts and code answers, Python source files) against SmolLM2's byte-level BPE
tokenizer, a GPT-style tokenizer: mean absolute relative error 6.6 %, p90 12.7 %. For comparison on
the same texts: chars/4 22 % / 43 %; words*1.33 22 % / 45 %; the bundled MiniLM WordPiece tokenizer
9.1 % / 20.5 %. It costs ~0.1 ms per 2 KB, against ~0.8 ms for the MiniLM tokenizer and ~2 ms for
llama.cpp's on the same (loaded, 2-core) machine, so a real tokenizer buys nothing here. Known bias:
non-Latin alphabets (Cyrillic, Greek, Arabic) are undercounted, as BPE splits those words finer. The
true count depends on the target model's tokenizer anyway; the confidence (0.9) says so.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from classifiers.messages import iter_message_texts, iter_messages, last_user_index
from classifiers.signals.base import Signal

_PIECE = re.compile(r"\w+|[^\w\s]")
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_DIGITS = "0123456789"
_PIECE_WEIGHT = 1.08
_DIGIT_WEIGHT = 0.54

#: Per-message framing tokens (role markers) and reply priming, as OpenAI documents for chat models.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3


def estimate_tokens(text: str) -> int:
    """Estimated tokens of one text (no framing overhead); see the module docstring."""
    if not text:
        return 0
    estimate = _PIECE_WEIGHT * len(_PIECE.findall(text)) + _DIGIT_WEIGHT * sum(map(text.count, _DIGITS))
    if not text.isascii():
        estimate += len(_CJK.findall(text))
    return round(estimate)


class LengthSignal:
    """``value``: estimated prompt tokens of the whole request (int).

    ``detail``: ``messages`` (count), ``turns`` (user messages), ``by_role`` (message count per
    role), ``chars`` (text characters), ``tool_definition_tokens`` (tools count toward the context
    too) and ``last_user_tokens``.
    """

    def __init__(self, name: str = "length") -> None:
        self.name = name

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Estimate the prompt size of ``body``."""
        messages = 0
        by_role: dict[str, int] = {}
        for _, role, _ in iter_messages(body):
            messages += 1
            role = role or "unknown"
            by_role[role] = by_role.get(role, 0) + 1
        chars = 0
        tokens = 0
        per_message: dict[int, int] = {}
        for piece in iter_message_texts(body):
            n = estimate_tokens(piece.text)
            chars += len(piece.text)
            tokens += n
            per_message[piece.message] = per_message.get(piece.message, 0) + n
        tool_tokens = 0
        for key in ("tools", "functions"):
            defs = body.get(key)
            if isinstance(defs, list) and defs:
                # Unserialisable definitions count as nothing: the gateway rejects them elsewhere.
                with contextlib.suppress(TypeError, ValueError):
                    tool_tokens += estimate_tokens(json.dumps(defs, separators=(",", ":"), ensure_ascii=False))
        total = tokens + tool_tokens + MESSAGE_OVERHEAD * messages + (REPLY_PRIMING if messages else 0)
        # No user message: -1, the legacy prompt's tokens (the prompt is the user's turn).
        last_user = per_message.get(last_user_index(body), 0)
        detail = {
            "messages": messages,
            "turns": by_role.get("user", 0),
            "by_role": by_role,
            "chars": chars,
            "tool_definition_tokens": tool_tokens,
            "last_user_tokens": last_user,
            "method": "pieces-heuristic",
        }
        return Signal(self.name, total, 0.9, detail)
