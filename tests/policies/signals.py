"""A real, deterministic, in-process signal provider for policy tests.

The unit under test is the policy engine, so the signals are simple extractors over the whole
conversation: markers such as ``[d=0.7]`` set the difficulty, ``[q m1=0.9 m2=0.4]`` the predicted
quality per model; keywords decide the domain, regexes find PII.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from typing import Any

from classifiers.signals.base import Signal
from policies import RequestContext


def conversation(body: Mapping[str, Any]) -> str:
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
    return "\n".join(parts)


def _difficulty(body: Mapping[str, Any]) -> Signal:
    found = re.findall(r"\[d=([0-9.]+)\]", conversation(body))
    return Signal("difficulty", float(found[-1]) if found else 0.1, 0.8)


def _domain(body: Mapping[str, Any]) -> Signal:
    text = conversation(body).lower()
    if "python" in text or "def " in text:
        return Signal("domain", "code", 0.9, {"scores": {"code": 0.9, "math": 0.05}})
    if "integral" in text or "solve" in text:
        return Signal("domain", "math", 0.7, {"scores": {"code": 0.1, "math": 0.7}})
    return Signal("domain", "chat", 0.5, {"scores": {"code": 0.1, "math": 0.1}})


def _jailbreak(body: Mapping[str, Any]) -> Signal:
    hit = "ignore previous instructions" in conversation(body).lower()
    return Signal("jailbreak", 0.95 if hit else 0.02, 0.9)


def _pii(body: Mapping[str, Any]) -> Signal:
    text = conversation(body)
    kinds = []
    if re.search(r"[\w.+-]+@[\w-]+\.\w+", text):
        kinds.append("email")
    if re.search(r"\+?\d[\d -]{8,}\d", text):
        kinds.append("phone")
    return Signal("pii", kinds, 1.0)


def _tools(body: Mapping[str, Any]) -> Signal:
    return Signal("tools", bool(body.get("tools")), 1.0)


def _length(body: Mapping[str, Any]) -> Signal:
    return Signal("length", len(conversation(body)) // 4, 0.9)


def _quality(body: Mapping[str, Any]) -> Signal:
    found = re.findall(r"\[q ([^\]]*)\]", conversation(body))
    scores = {}
    if found:
        for pair in found[-1].split():
            model, value = pair.split("=")
            scores[model] = float(value)
    return Signal("quality", scores, 0.7)


EXTRACTORS: dict[str, Callable[[Mapping[str, Any]], Signal]] = {
    "difficulty": _difficulty,
    "domain": _domain,
    "jailbreak": _jailbreak,
    "pii": _pii,
    "tools": _tools,
    "length": _length,
    "quality": _quality,
}
KNOWN_SIGNALS = set(EXTRACTORS)


class TestSignals:
    """Computes the requested signals concurrently and remembers which were asked for."""

    __test__ = False  # not a pytest test class

    def __init__(self, keywords: Mapping[str, list[str]] | None = None) -> None:
        self.requested: list[set[str]] = []
        self.keywords = dict(keywords or {})

    async def compute(self, names: set[str], ctx: RequestContext) -> dict[str, Signal]:
        self.requested.append(set(names))

        async def one(name: str) -> Signal:
            await asyncio.sleep(0)
            if name in self.keywords:
                text = conversation(ctx.body).lower()
                return Signal(name, [k for k in self.keywords[name] if k in text], 1.0)
            return EXTRACTORS[name](ctx.body)

        computed = await asyncio.gather(*(one(name) for name in sorted(names)))
        return {signal.name: signal for signal in computed}


def request(
    *turns: str,
    system: str | None = None,
    tools: bool = False,
    headers: Mapping[str, str] | None = None,
    session_id: str | None = None,
    route: str = "auto",
    **extra: Any,
) -> RequestContext:
    """A chat request: turns alternate user/assistant, starting with the user."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    body: dict[str, Any] = {"model": route, "messages": messages, **extra}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    return RequestContext(
        request_id="req-test", endpoint="chat.completions", route=route, body=body,
        session_id=session_id, headers=dict(headers or {}),
    )
