"""What the client receives from a workflow: one OpenAI chat completion (JSON, or SSE when it
streams), whichever sub-calls made it.

- ``model`` is what the answering model's backend reported (as for any proxied request); the
  ``x-pointsman-model`` header is its configured name, ``x-pointsman-workflow`` the workflow
  (``cascade/<name>``), ``x-pointsman-stage`` the answering stage as ``<position>:<name>`` (the
  stage's index in ``stages``, the step's in ``steps``, the candidate's in ``candidates``; a fuser is
  at position ``len(candidates)``), and ``x-pointsman-capped`` the cap that ended the run, if any.
- ``usage`` is the total over every sub-call (judges, verifiers and samples included): the tokens
  the request cost. The per-sub-call breakdown is in the ``pointsman`` extension field (``steps``).
- ``logprobs`` that the gateway asked for on the client's behalf are removed (and ``top_logprobs``
  trimmed to what the client asked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.forward import OpenedStream
from gateway.usage import SSEUsageScanner, cost_usd, token_count
from gateway.workflows.bodies import ClientAsk
from gateway.workflows.outcome import Final, Totals, describe, finish, run_outcome
from gateway.workflows.runtime import Answer, Run
from gateway.workflows.sse import LiveRewriter, render

Headers = list[tuple[bytes, bytes]]


def restore_logprobs(completion: dict[str, Any], ask: ClientAsk) -> None:
    """Undo the gateway's own logprob request in ``completion`` (in place): none when the client
    asked for none, at most ``top_logprobs`` alternatives per token when it asked for fewer."""
    choices = completion.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict) or choice.get("logprobs") is None:
            continue
        if not ask.logprobs:
            choice["logprobs"] = None
            continue
        keep = ask.top_logprobs or 0
        logprobs = choice["logprobs"]
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("top_logprobs"), list):
                entry["top_logprobs"] = entry["top_logprobs"][:keep]


def client_completion(answer: Answer, run: Run, final: Final) -> dict[str, Any]:
    """The answering sub-call's completion as the client gets it: one choice, the workflow's usage
    totals, logprobs as the client asked, and the ``pointsman`` extension."""
    completion = orjson.loads(orjson.dumps(answer.completion))  # a copy: the answer stays as it came
    choices = completion.get("choices")
    if isinstance(choices, list) and choices:
        first = dict(choices[0])
        first["index"] = 0
        completion["choices"] = [first]
    restore_logprobs(completion, run.ask)
    completion["usage"] = Totals.of(run.calls).usage()
    completion["pointsman"] = describe(run, final)
    return completion


@dataclass(slots=True)
class WorkflowDone:
    """A finished (or final-stage-opened) run and what the service needs to answer with it."""

    run: Run
    final: Final

    @property
    def opened(self) -> OpenedStream | None:
        """The final stage's stream, when it streams live."""
        return self.final.stream.opened if self.final.stream is not None else None

    def headers(self) -> Headers:
        """``x-pointsman-workflow``, ``x-pointsman-stage`` and (when a cap ended it) ``-capped``."""
        out: Headers = [(b"x-pointsman-workflow", self.run.workflow.model_name.encode())]
        answering = self.final.answering
        if answering is not None:
            out.append((b"x-pointsman-stage", f"{answering.position}:{answering.label}".encode()))
        if self.run.capped is not None:
            out.append((b"x-pointsman-capped", self.run.capped.cap.encode()))
        return out

    def body(self) -> tuple[int, bytes, str, bytes]:
        """(status, body, content type, the answer as JSON) of a buffered answer; an upstream answer
        passed on as-is keeps its status and body. Finishes the record's workflow part."""
        final, run = self.final, self.run
        if final.passthrough is not None:
            completed = final.passthrough
            finish(run, final, run.trace, run.runner.metrics, outcome="failed")
            return completed.status, completed.body, completed.content_type, completed.body
        assert final.answer is not None
        completion = client_completion(final.answer, run, final)
        finish(run, final, run.trace, run.runner.metrics, outcome=run_outcome(run, final))
        as_json = orjson.dumps(completion)
        if run.ask.stream:
            return 200, render(completion, include_usage=run.ask.include_usage), "text/event-stream", as_json
        return 200, as_json, "application/json", as_json

    def rewriter(self) -> LiveRewriter:
        """The live final stage's stream rewriter (usage totals and the extension put in)."""
        stream = self.final.stream
        assert stream is not None
        run = self.run

        def close(usage: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
            call = stream.call
            if isinstance(usage, Mapping):  # the stage's own usage, before the stream's end settles it
                prompt = token_count(usage.get("prompt_tokens"))
                completion = token_count(usage.get("completion_tokens"))
                call.prompt_tokens = prompt if prompt is not None else call.prompt_tokens
                call.completion_tokens = completion if completion is not None else call.completion_tokens
                call.cost_usd = cost_usd(stream.opened.target.model, call.prompt_tokens, call.completion_tokens)
            return Totals.of(run.calls).usage(), describe(run, self.final)

        return LiveRewriter(client_usage=run.ask.include_usage, close=close)

    def finish_stream(self, scanner: SSEUsageScanner) -> None:
        """The live final stage's stream ended: settle it and finish the record's workflow part."""
        stream, run = self.final.stream, self.run
        assert stream is not None
        trace = run.trace
        run.finish_stream(stream, scanner, trace.outcome)
        outcome = run_outcome(run, self.final) if trace.outcome == "ok" else (
            "cancelled" if trace.outcome == "client_disconnected" else "failed")
        finish(run, self.final, trace, run.runner.metrics, outcome=outcome)
