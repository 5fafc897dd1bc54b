"""A graded fake upstream: answer quality depends on the prompt in a known way, and a fake judge.

Every model but the judge answers with a grade marker, ``[[grade:0.75]]``, whose value comes from
a quality function of (model, last user message) or from a table keyed by the message's sha256.
The judge model (``judge`` by default) reads the grade markers in its own request in order of
appearance: the first belongs to answer A, the second to answer B. It answers ``A``, ``B`` or
``tie``, so a comparison scored through the gateway's judge path reproduces the known outcome, and
asking both orders cancels nothing but position (there is no position bias here to cancel).

Run as a process for benchmarks::

    python -m tests.fakes.graded --table outcomes.json --port 9100

where ``outcomes.json`` maps ``sha256(last user message)`` to ``{model: quality}``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.upstream import LoopbackServer

GRADE = re.compile(r"\[\[grade:([0-9.]+)\]\]")
QualityFn = Callable[[str, str], float]


def prompt_key(text: str) -> str:
    """The table key of a prompt: sha256 of the last user message's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text of the last user message of a chat request."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def judge_verdict(body: Mapping[str, Any]) -> str:
    """``A``, ``B`` or ``tie`` from the first two grade markers in the judge's request."""
    text = "\n".join(_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, Mapping))
    grades = [float(g) for g in GRADE.findall(text)]
    if len(grades) < 2:
        return "tie"
    a, b = grades[0], grades[1]
    return "A" if a > b else "B" if b > a else "tie"


def table_quality(table: Mapping[str, Mapping[str, float]], default: float = 0.0) -> QualityFn:
    """A quality function reading ``table[sha256(prompt)][model]``."""

    def quality(model: str, prompt: str) -> float:
        return float(table.get(prompt_key(prompt), {}).get(model, default))

    return quality


class GradedState:
    """What the fake has seen: requests per model, judge calls and their verdicts."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.verdicts: list[str] = []
        self.max_tokens: list[Any] = []  # each answered request's completion bound (None: none asked)


def build_app(
    quality: QualityFn, state: GradedState, judge_model: str = "judge", lengths: Mapping[str, int] | None = None
) -> Starlette:
    """The ASGI app: ``/v1/chat/completions`` and ``/v1/models``.

    ``lengths`` gives a model's answers a length in completion tokens (default 10): such an answer is
    the grade marker padded with words, cut at the request's ``max_tokens`` / ``max_completion_tokens``
    (then ``finish_reason: length``, as a real server), and its usage says what was written."""

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        model = str(body.get("model", ""))
        state.requests[model] += 1
        if model == judge_model:
            verdict = judge_verdict(body)
            state.verdicts.append(verdict)
            content = f"Verdict: {verdict}"
        else:
            grade = quality(model, last_user_text(body))
            content = f"Answer from {model}. [[grade:{grade:.2f}]]"
        state.max_tokens.append(body.get("max_completion_tokens", body.get("max_tokens")))
        completion, finish = 10, "stop"
        if lengths and model in lengths:
            bound = body.get("max_completion_tokens", body.get("max_tokens"))
            completion = lengths[model] if not isinstance(bound, int) else min(lengths[model], bound)
            finish = "length" if completion < lengths[model] else "stop"
            content += " word" * max(completion - 10, 0)
        return JSONResponse({
            "id": f"chatcmpl-graded-{state.requests.total()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 20, "completion_tokens": completion, "total_tokens": 20 + completion},
        })

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": []})

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ])


class GradedUpstream(LoopbackServer):
    """The graded fake on a loopback port (a uvicorn thread); ``state`` records what it saw."""

    def __init__(
        self, quality: QualityFn, judge_model: str = "judge", port: int | None = None,
        lengths: Mapping[str, int] | None = None,
    ) -> None:
        self.state = GradedState()
        super().__init__(build_app(quality, self.state, judge_model, lengths), port)


def main(argv: list[str] | None = None) -> int:
    """Serve the graded fake from an outcome table until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True, help="JSON: sha256(prompt) -> {model: quality}")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--judge-model", default="judge")
    args = parser.parse_args(argv)
    with open(args.table, "rb") as fh:
        table = orjson.loads(fh.read())
    app = build_app(table_quality(table), GradedState(), args.judge_model)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
