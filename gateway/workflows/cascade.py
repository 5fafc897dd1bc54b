"""Cascade: the cheapest stage answers first; while the answer's confidence is below the threshold,
the next stage answers instead.

Every stage but the last is buffered (non-streamed) and checked (:func:`check_stage`); the last one
answers as the client asked: streamed live when it streams. An answer with no usable confidence (no
logprobs came back, an unreadable verifier, a head that cannot score it) escalates unless
``on_missing: accept``. A stage that fails escalates too. When the last stage fails, or a cap stops
the escalation, the last checked answer is the best so far.
"""

from __future__ import annotations

from typing import Any

from classifiers.conversation import conversation_text
from gateway.workflows import bodies
from gateway.workflows.confidence import agreement, logprob_confidence, message_text, verifier_confidence
from gateway.workflows.outcome import Final
from gateway.workflows.runtime import Answer, Run, SubCallFailed
from policies.workflows import CascadeWorkflow, Stage

VERIFIER_MAX_TOKENS = 4
_INT64 = 2**63
VERIFIER_TOP_LOGPROBS = 5
DEFAULT_VERIFIER_PROMPT = """\
You check another assistant's answer.

[Conversation]
{conversation}

[Answer to check]
{answer}
[End of the answer]

Is the answer correct, and does it fully address the user's last message? Reply with one word: yes or no."""


async def run_cascade(run: Run) -> Final:
    """Run the cascade ``run.workflow`` (see the module docstring)."""
    workflow = run.workflow
    assert isinstance(workflow, CascadeWorkflow)
    last = len(workflow.stages) - 1
    for position, stage in enumerate(workflow.stages):
        if position == last:
            escalated = position > 0
            request = bodies.final(run.body, run.ask)
            if run.ask.stream:
                stream = await run.open_stream(stage.label, stage.model, request, position=position)
                return Final(stream=stream, escalated=escalated)
            return Final(answer=await run.call(stage.label, stage.model, request, position=position),
                         escalated=escalated)
        checked: Answer | None
        try:
            checked = await check_stage(run, workflow, stage, position)
        except SubCallFailed:
            checked = None  # a failed stage escalates: the next one may well answer
        if checked is not None:
            run.offer(checked)
            confidence = checked.call.confidence
            if confidence is None and workflow.confidence.on_missing == "accept":
                return Final(answer=checked, escalated=position > 0)
            if confidence is not None and confidence >= workflow.confidence.threshold:
                return Final(answer=checked, escalated=position > 0)
        run.escalations.append(workflow.stages[position + 1].label)
    raise AssertionError("a cascade has at least two stages")  # pragma: no cover


async def check_stage(run: Run, workflow: CascadeWorkflow, stage: Stage, position: int) -> Answer:
    """A checked stage's answer, its confidence set on its sub-call (None when it has none)."""
    settings = workflow.confidence
    source = settings.source
    if source == "agreement":
        return await _agreement(run, workflow, stage, position)
    request = bodies.buffered(run.body)
    if source == "logprobs":
        request = bodies.with_logprobs(request, 2)
    answer = await run.call(stage.label, stage.model, request, position=position)
    if source == "logprobs":
        answer.call.confidence = logprob_confidence(answer.completion, settings.stat)
    elif source == "head":
        head = run.runner.heads[workflow.name]
        # The head reads the conversation as the routing heads render it (its training data did too).
        answer.call.confidence = await head.score(conversation_text(run.body), answer.text)
    else:
        # The answer is here before its verdict: when a cap (steps, cost, max_seconds) stops the
        # verifier, the run ends with this answer, not with none (a 400/504 for a paid answer).
        run.offer(answer)
        answer.call.confidence = await _verify(run, workflow, answer)
    return answer


async def _verify(run: Run, workflow: CascadeWorkflow, answer: Answer) -> float | None:
    """P(yes) of the verifier asked about ``answer``; None when it cannot be told (or it failed)."""
    verifier = workflow.confidence.verifier
    assert verifier is not None  # the schema requires it for source verifier
    prompt = (verifier.prompt or DEFAULT_VERIFIER_PROMPT).format(
        conversation=bodies.conversation_text(run.body), answer=answer.text
    )
    request = bodies.with_logprobs(bodies.judge_request(run.body, prompt, VERIFIER_MAX_TOKENS), VERIFIER_TOP_LOGPROBS)
    try:
        verdict = await run.call("verifier", verifier.model, request, position=answer.position)
    except SubCallFailed:
        return None
    verdict.call.confidence = verifier_confidence(verdict.completion)
    return verdict.call.confidence


async def _agreement(run: Run, workflow: CascadeWorkflow, stage: Stage, position: int) -> Answer:
    """``samples`` answers of the stage; the first of the majority answers, the majority's share is
    its confidence. One call with ``n`` first (when ``use_n``): the choices a backend did not return
    are asked for as parallel single calls."""
    settings = workflow.confidence
    wanted = settings.samples
    base = bodies.buffered(run.body, temperature=settings.temperature)
    samples: list[tuple[Answer, int]] = []  # (sub-call's answer, index of its choice)
    if settings.use_n:
        try:
            first = await run.call("sample", stage.model, {**base, "n": wanted}, position=position, label=stage.label)
        except SubCallFailed as exc:
            if not _refused(exc):
                raise
            # A backend that refuses ``n`` (a 4xx: the embedded local model, many small servers) did
            # not return the choices: ask for them one at a time, as for a backend that ignores it.
        else:
            samples += [(first, i) for i in range(min(_choices(first), wanted))]
    missing = wanted - len(samples)
    if missing > 0:
        # A sample is here before the others: when a cap (max_seconds, steps, cost) stops the top-up,
        # the run ends with it, not with none (a 504 for a paid answer).
        usable = next((i for answer, i in samples if _choice_text(answer, i).strip()), None)
        if usable is not None:
            run.offer(_only_choice(samples[0][0], usable))
        results = await run.settle([
            run.call("sample", stage.model, _nth_sample(base, len(samples) + i), position=position, label=stage.label)
            for i in range(missing)
        ])
        samples += [(result, 0) for result in results if isinstance(result, Answer)]
    if not samples:
        raise SubCallFailed(run.calls[-1], f"{stage.label}: no sample answered")
    texts = [_choice_text(answer, i) for answer, i in samples]
    agreed = agreement(texts)
    winner, choice = samples[agreed[0] if agreed is not None else 0]
    chosen = _only_choice(winner, choice)
    chosen.call.confidence = None if agreed is None else agreed[1]
    return chosen


def _refused(failure: SubCallFailed) -> bool:
    """Whether the upstream refused the call itself (a 4xx other than a rate limit), as a backend
    that does not take ``n`` > 1 does."""
    completed = failure.completed
    return completed is not None and 400 <= completed.status < 500 and completed.status != 429


def _nth_sample(body: dict[str, Any], index: int) -> dict[str, Any]:
    """Sample ``index``'s body: with a client ``seed``, each parallel sample gets its own (seed + index),
    so the samples stay reproducible but are not one answer repeated (identical samples would always
    agree: confidence 1 whatever the model knows)."""
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and index > 0:
        # Wrapped into the signed 64-bit range upstreams take: a seed at its top plus an index is
        # no seed they accept, and past 2**64 no JSON integer the gateway can write.
        return {**body, "seed": (seed + index + _INT64) % (2 * _INT64) - _INT64}
    return body


def _choices(answer: Answer) -> int:
    choices = answer.completion.get("choices")
    return len(choices) if isinstance(choices, list) else 0


def _choice_text(answer: Answer, index: int) -> str:
    """The text of choice ``index`` of an answer (tool calls rendered)."""
    choices = answer.completion.get("choices")
    if not isinstance(choices, list) or index >= len(choices):
        return ""
    return message_text({"choices": [choices[index]]})


def _only_choice(answer: Answer, index: int) -> Answer:
    """``answer`` reduced to its choice ``index`` (a sample answered with several choices)."""
    if index == 0 and _choices(answer) == 1:
        return answer
    choices = answer.completion["choices"]
    completion = {**answer.completion, "choices": [{**choices[index], "index": 0}]}
    return Answer(answer.call, completion, answer.target, answer.position, answer.label)

