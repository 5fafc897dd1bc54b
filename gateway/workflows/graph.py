"""Graph workflows: a bounded DAG of templated steps (draft -> critique -> revise; plan -> solve ->
check), validated acyclic at start-up (:class:`policies.workflows.GraphWorkflow`).

A step starts once every step in its ``after`` has answered; steps that are ready together run in
parallel (at most ``caps.max_fanout`` at once). Its request is its ``prompt`` rendered with
``{conversation}``, ``{input}`` (the last user message) and ``{<step>}`` (that step's answer) as one
user message after its optional ``system`` message — or, without a prompt, the client's conversation
itself — with the client's sampling fields. The ``output`` step, which every other step leads to,
answers the client (streamed live when the client streams). A failed step ends the run: with the
latest completed step's answer when there is one (marked degraded), else an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gateway.workflows import bodies
from gateway.workflows.outcome import Final
from gateway.workflows.runtime import Answer, Run
from policies.workflows import GraphStep, GraphWorkflow


def step_request(run: Run, step: GraphStep, answers: Mapping[str, Answer], *, output: bool) -> dict[str, Any]:
    """What ``step`` sends, given the answers of the steps before it."""
    streamed = output and run.ask.stream
    if step.prompt is None:
        request = bodies.final(run.body, run.ask) if output else bodies.buffered(run.body)
        if step.system:
            request = bodies.with_system(request, step.system)
    else:
        values = {"conversation": bodies.conversation_text(run.body), "input": bodies.last_user_text(run.body)}
        values.update({name: answer.text for name, answer in answers.items()})
        request = bodies.templated(run.body, step.prompt.format(**values), system=step.system, keep_format=output)
        if streamed:
            request = bodies.final(request, run.ask)
    if step.max_tokens is not None:
        key = "max_completion_tokens" if "max_completion_tokens" in request else "max_tokens"
        request[key] = step.max_tokens
    return request


async def run_graph(run: Run) -> Final:
    """Run the graph workflow ``run.workflow`` (see the module docstring)."""
    workflow = run.workflow
    assert isinstance(workflow, GraphWorkflow)
    position = {step.name: i for i, step in enumerate(workflow.steps)}
    answers: dict[str, Answer] = {}
    running: dict[asyncio.Task[Answer], str] = {}
    try:
        while True:
            busy = set(running.values())
            for step in workflow.steps:
                if step.name in answers or step.name in busy or not set(step.after) <= answers.keys():
                    continue
                if step.name == workflow.output:  # every other step leads here: nothing else is running
                    return await _output(run, step, answers, position[step.name])
                request = step_request(run, step, answers, output=False)
                task = asyncio.create_task(run.call(step.name, step.model, request, position=position[step.name]))
                running[task] = step.name
            done, _pending = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            failure: BaseException | None = None
            for task in done:  # record every answer that arrived before acting on a failure
                name = running.pop(task)
                if task.exception() is not None:
                    failure = failure or task.exception()
                    continue
                answers[name] = task.result()
                run.offer(answers[name])  # the latest completed step is the best so far
            if failure is not None:
                raise failure
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


async def _output(run: Run, step: GraphStep, answers: Mapping[str, Answer], position: int) -> Final:
    request = step_request(run, step, answers, output=True)
    if run.ask.stream:
        return Final(stream=await run.open_stream(step.name, step.model, request, position=position))
    answer = await run.call(step.name, step.model, request, position=position)
    run.offer(answer)
    return Final(answer=answer)
