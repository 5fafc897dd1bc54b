"""Fusion: every candidate answers in parallel, then one answer is made of theirs.

Each candidate gets the client's request (buffered) and at most ``timeout`` seconds; a candidate
that fails or times out is recorded and skipped. With fewer than ``min_answers`` answers the request
fails (502, naming each failure). Then ``combine``:

- ``fuser``: mixture-of-agents. The fuser model gets the client's conversation with one extra system
  message holding the candidates' answers as references (``prompt``, default
  :data:`DEFAULT_FUSER_PROMPT`, the aggregate-and-synthesise prompt of Wang et al., 2024,
  "Mixture-of-Agents Enhances Large Language Model Capabilities") and writes the answer, streamed live
  when the client streams.
- ``judge``: a judge model scores the answers (``scored``) or compares every pair in both orders
  (``pairwise``), and the best one is the answer (:mod:`.judging`).

The best answer so far (for a cap or a failed fuser) is the first candidate, in configured order,
that answered.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.workflows import bodies
from gateway.workflows.caps import CapReached
from gateway.workflows.judging import judge_answers, judged_final
from gateway.workflows.outcome import Final
from gateway.workflows.runtime import Answer, Run, SubCallFailed, no_answer_error
from policies.workflows import FusionWorkflow, RatingsWorkflow

DEFAULT_FUSER_PROMPT = """\
You have been provided with a set of responses from various models to the latest user query. Your \
task is to synthesize these responses into a single, high-quality response. It is crucial to \
critically evaluate the information provided in these responses, recognizing that some of it may be \
biased or incorrect. Your response should not simply replicate the given answers but should offer a \
refined, accurate, and comprehensive reply to the instruction. Ensure your response is \
well-structured, coherent, and adheres to the highest standards of accuracy and reliability.

Responses from models:
{references}"""


async def fan_out(run: Run, workflow: FusionWorkflow | RatingsWorkflow) -> list[Answer]:
    """Every candidate's answer (in configured order; failed and timed-out ones left out), at least
    ``min_answers`` of them; raises 502 naming the failures otherwise (503 / 429 when every failed
    candidate found no healthy replica / saturated replicas: :func:`no_answer_error`), or, when
    every candidate's upstream refused the request (a 4xx), the first refusal, which the runner
    passes on as it came."""

    async def ask(position: int, model: str) -> Answer:
        answer = await run.call("candidate", model, bodies.buffered(run.body), position=position, label=model,
                                timeout=workflow.timeout)
        if run.best is None or answer.position < run.best.position:
            run.offer(answer)
        return answer

    results = await run.settle([ask(i, model) for i, model in enumerate(workflow.candidates)])
    answers = [result for result in results if isinstance(result, Answer)]
    if len(answers) >= workflow.min_answers:
        return answers
    if run.capped is not None:
        # A cap stopped candidates: the run ends with what it has, saying so.
        raise CapReached(run.capped.cap, run.capped.detail)
    refusals = [r for r in results if isinstance(r, SubCallFailed) and r.completed is not None]
    if not answers and refusals and len(refusals) == len(results):
        # Every candidate's upstream answered with an error of its own (a 4xx: the request is at
        # fault, so every path ended there): the client gets it as it came, as for a single call,
        # not a 502 that the SDK would retry into the same refusal.
        raise refusals[0]
    failed = "; ".join(
        f"{model}: {result}" for model, result in zip(workflow.candidates, results, strict=True)
        if not isinstance(result, Answer)
    )
    raise no_answer_error(
        f"workflow {workflow.model_name}: {len(answers)} of {len(workflow.candidates)} candidates answered, "
        f"{workflow.min_answers} needed ({failed})",
        [result.call for result in results if isinstance(result, SubCallFailed)],
    )


def references(answers: Sequence[Answer]) -> str:
    """The candidates' answers as the fuser reads them: numbered, in configured order."""
    return "\n\n".join(f"{k}. {answer.text}" for k, answer in enumerate(answers, 1))


async def run_fusion(run: Run) -> Final:
    """Run the fusion ``run.workflow`` (see the module docstring)."""
    workflow = run.workflow
    assert isinstance(workflow, FusionWorkflow)
    answers = await fan_out(run, workflow)
    combine = workflow.combine
    if combine.fuser is not None:
        system = (combine.prompt or DEFAULT_FUSER_PROMPT).format(references=references(answers))
        request = bodies.with_system(bodies.final(run.body, run.ask), system)
        position = len(workflow.candidates)
        if run.ask.stream:
            return Final(stream=await run.open_stream("fuser", combine.fuser, request, position=position))
        return Final(answer=await run.call("fuser", combine.fuser, request, position=position))
    assert combine.judge is not None
    judgement = await judge_answers(run, combine.judge, combine.mode, combine.prompt, answers)
    scores = [{"model": answer.label, "score": score} for answer, score in zip(answers, judgement.scores, strict=True)]
    return judged_final(run, answers, judgement, {"judge": {"model": combine.judge, "mode": combine.mode,
                                                            "scores": scores}})
