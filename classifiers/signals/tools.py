"""Whether the request offers the model tools (function calling), and which."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from classifiers.messages import messages_of
from classifiers.signals.base import Signal


class ToolsSignal:
    """``value`` is True when the request defines tools (``tools`` or legacy ``functions``).

    ``detail``: the tool names, the ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or the
    forced function's name), whether parallel tool calls are allowed, and how many tool calls and
    tool results the conversation already holds (an agent loop in progress). A request that has
    ``tool_choice: "none"`` still counts as having tools — the definitions are sent and count toward
    the context — but ``detail["tool_choice"]`` lets a policy tell the cases apart. Confidence 1.0:
    this is read straight from the request.
    """

    def __init__(self, name: str = "tools") -> None:
        self.name = name

    def extract(self, body: Mapping[str, Any]) -> Signal:
        """Read tool definitions and tool traffic from ``body``."""
        names: list[str] = []
        for key in ("tools", "functions"):
            defs = body.get(key)
            if not isinstance(defs, list):
                continue
            for d in defs:
                if not isinstance(d, Mapping):
                    continue
                fn = d.get("function") if key == "tools" else d
                if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                    names.append(fn["name"])
                elif isinstance(d.get("type"), str):  # built-in tools, e.g. {"type": "web_search"}
                    names.append(d["type"])
        calls = results = 0
        for msg in messages_of(body):
            tc = msg.get("tool_calls")
            if isinstance(tc, list):
                calls += len(tc)
            if isinstance(msg.get("function_call"), Mapping):
                calls += 1
            if msg.get("role") in ("tool", "function"):
                results += 1
        detail = {
            "names": names,
            "count": len(names),
            "tool_choice": _choice(body.get("tool_choice", body.get("function_call"))),
            "parallel_tool_calls": body.get("parallel_tool_calls"),
            "tool_calls_in_history": calls,
            "tool_results_in_history": results,
        }
        return Signal(self.name, bool(names), 1.0, detail)


def _choice(choice: Any) -> str | None:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            return f"function:{fn['name']}"
        if isinstance(choice.get("name"), str):  # legacy {"name": ...}
            return f"function:{choice['name']}"
        if isinstance(choice.get("type"), str):
            return str(choice["type"])
    return str(choice)
