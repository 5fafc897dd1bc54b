"""Ratings: every candidate answers in parallel, a judge model (or a trained answer-confidence
head) scores every answer, the best one is returned with all the ratings, and the ratings are stored
as feedback so the eval loop learns.

The response carries ``pointsman.ratings``: ``[{model, score, rank}]`` in configured order (``score``
in [0, 1], None when the judge gave no usable verdict; ``rank`` 1 is the answer returned). Each
scored rating is also a feedback row on the request (``source: judge``, ``metric: quality``,
``model``: the candidate), queued with the decision record (never delaying the response), exactly
like route comparisons' judge feedback.
"""

from __future__ import annotations

import time
from typing import Any

from classifiers.conversation import conversation_text
from gateway.workflows.fusion import fan_out
from gateway.workflows.judging import Judgement, judge_answers, judged_final
from gateway.workflows.outcome import Final
from gateway.workflows.runtime import Answer, Run
from policies.workflows import RatingsWorkflow
from store.outcomes import JUDGE_SOURCE, QUALITY_METRIC
from store.records import FeedbackRecord


async def run_ratings(run: Run) -> Final:
    """Run the ratings workflow ``run.workflow`` (see the module docstring)."""
    workflow = run.workflow
    assert isinstance(workflow, RatingsWorkflow)
    answers = await fan_out(run, workflow)
    if workflow.judge is not None:
        judgement = await judge_answers(run, workflow.judge, workflow.mode, workflow.prompt, answers)
    else:  # the trained head: no sub-call, the conversation as the routing heads render it
        head = run.runner.heads[workflow.name]
        scores = await head.score_many(conversation_text(run.body), [answer.text for answer in answers])
        judgement = Judgement(scores, "head", "answer-confidence head")
    ratings = _ratings(answers, judgement)
    _store(run, workflow, answers, judgement)
    return judged_final(run, answers, judgement, {"ratings": ratings})


def _ratings(answers: list[Answer], judgement: Judgement) -> list[dict[str, Any]]:
    order = sorted(
        (i for i, score in enumerate(judgement.scores) if score is not None),
        key=lambda i: (-(judgement.scores[i] or 0.0), i),
    )
    rank = {i: r for r, i in enumerate(order, 1)}
    return [
        {"model": answer.call.answered or answer.label, "score": None if score is None else round(score, 4),
         "rank": rank.get(i), "judge": judgement.judge, "mode": judgement.mode}
        for i, (answer, score) in enumerate(zip(answers, judgement.scores, strict=True))
    ]


def _store(run: Run, workflow: RatingsWorkflow, answers: list[Answer], judgement: Judgement) -> None:
    trace = run.trace
    now = time.time()
    for answer, score in zip(answers, judgement.scores, strict=True):
        if score is None:
            continue
        run.runner.recorder.record_feedback(FeedbackRecord(
            request_id=trace.request_id, score=score, metric=QUALITY_METRIC, source=JUDGE_SOURCE,
            model=answer.call.answered or answer.label, tenant=trace.tenant, created_at=now,
            issued_at=trace.created_at,
            metadata={"workflow": workflow.name, "judge": judgement.judge, "mode": judgement.mode,
                      "candidates": [a.call.answered or a.label for a in answers], "subcall": answer.call.index},
        ))
