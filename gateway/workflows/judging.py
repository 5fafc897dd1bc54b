"""A judge model scoring candidate answers: each one alone (``scored``) or each pair in both orders
(``pairwise``, the comparisons' method: a position bias cancels). Used by fusion's judge and ratings.

``scored``: the judge rates an answer 1-10 (``[[7]]``); the score is ``(rating - 1) / 9`` in [0, 1].
``pairwise``: for every pair, the judge is asked with the answers in both orders (win 1, tie 0.5,
loss 0, averaged); an answer's score is its mean over the pairs it was judged in. A judge call that
fails, or a verdict that cannot be read, leaves that score unknown (None) rather than guessing.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.compare import ANSWER_CHARS, DEFAULT_JUDGE_PROMPT, pair_scores, parse_verdict
from gateway.workflows.bodies import conversation_text, judge_request
from gateway.workflows.caps import CapReached
from gateway.workflows.outcome import Final
from gateway.workflows.runtime import Answer, Run

SCORED_MAX_TOKENS = 16
PAIRWISE_MAX_TOKENS = 32

DEFAULT_SCORE_PROMPT = """\
Please act as an impartial judge and evaluate the quality of the response an AI assistant gave to \
the conversation below. Consider helpfulness, correctness, relevance, depth and clarity; do not let \
the response's length influence you. Rate the response on a scale of 1 to 10 and output only your \
rating, strictly in this format: "[[rating]]", for example "[[5]]".

[Conversation]
{conversation}

[The assistant's response]
{answer}
[End of the assistant's response]"""

# A minus sign belongs to the number: "-5" or "[[-5]]" is an out-of-range rating (no score), not 5.
_BRACKETED = re.compile(r"\[\[\s*(-?\d+(?:\.\d+)?)\s*\]\]")
_RATING = re.compile(
    r"(?i:rating|score)[^\w-]{0,3}(-?\d+(?:\.\d+)?)|^[^\w-]*(-?\d+(?:\.\d+)?)\s*(?:/\s*10)?\W*$"
)


def parse_rating(text: str) -> float | None:
    """A 1-10 rating as a score in [0, 1]; None when the text holds no single clear rating."""
    bracketed = {float(m) for m in _BRACKETED.findall(text)}
    if len(bracketed) > 1:
        return None
    if bracketed:
        value = bracketed.pop()
    else:
        match = _RATING.search(text.strip())
        if match is None:
            return None
        value = float(match.group(1) or match.group(2))
    if not 1.0 <= value <= 10.0:
        return None
    return (value - 1.0) / 9.0


@dataclass(frozen=True, slots=True)
class Judgement:
    """Scores in [0, 1] (None: unknown), one per answer in the order given, and how they were made."""

    scores: list[float | None]
    mode: str
    judge: str

    def best(self) -> int | None:
        """Index of the highest score (the first on ties); None when no answer was scored."""
        known = [(score, -i) for i, score in enumerate(self.scores) if score is not None]
        return -max(known)[1] if known else None


def judged_final(run: Run, answers: Sequence[Answer], judgement: Judgement, extra: dict[str, Any]) -> Final:
    """The best-scored answer; when none was scored, the cap that stopped the judging, else the
    first answer, marked degraded."""
    best = judgement.best()
    if best is None:
        if run.capped is not None:
            raise CapReached(run.capped.cap, run.capped.detail)
        return Final(answer=answers[0], degraded="the judge scored no answer", extra=extra)
    return Final(answer=answers[best], extra=extra)


async def judge_answers(
    run: Run, judge: str, mode: str, prompt: str | None, answers: Sequence[Answer]
) -> Judgement:
    """Score ``answers`` with ``judge`` (sub-calls named ``judge``, at most the run's fan-out at once)."""
    conversation = conversation_text(run.body)
    if mode == "pairwise":
        return await _pairwise(run, judge, prompt or DEFAULT_JUDGE_PROMPT, conversation, answers)
    template = prompt or DEFAULT_SCORE_PROMPT
    calls = [
        run.call("judge", judge, judge_request(run.body, template.format(
            conversation=conversation, answer=answer.text[:ANSWER_CHARS]), SCORED_MAX_TOKENS), position=i)
        for i, answer in enumerate(answers)
    ]
    scores: list[float | None] = []
    for result in await run.settle(calls):
        score = parse_rating(result.text) if isinstance(result, Answer) else None
        if isinstance(result, Answer):
            result.call.confidence = score
        scores.append(score)
    return Judgement(scores, "scored", judge)


async def _pairwise(
    run: Run, judge: str, template: str, conversation: str, answers: Sequence[Answer]
) -> Judgement:
    pairs = list(itertools.combinations(range(len(answers)), 2))

    calls = []
    for a, b in pairs:
        for first, second in ((a, b), (b, a)):
            text = template.format(conversation=conversation, answer_a=answers[first].text[:ANSWER_CHARS],
                                   answer_b=answers[second].text[:ANSWER_CHARS])
            calls.append(run.call("judge", judge, judge_request(run.body, text, PAIRWISE_MAX_TOKENS), position=first))
    results = await run.settle(calls)
    totals = [0.0] * len(answers)
    counts = [0] * len(answers)
    for k, (a, b) in enumerate(pairs):
        one, two = results[2 * k], results[2 * k + 1]
        if not isinstance(one, Answer) or not isinstance(two, Answer):
            continue
        verdicts = parse_verdict(one.text), parse_verdict(two.text)
        if verdicts[0] is None or verdicts[1] is None:
            continue
        score = pair_scores(verdicts[0], verdicts[1])  # of answer a (A first, then B)
        totals[a] += score
        totals[b] += 1.0 - score
        counts[a] += 1
        counts[b] += 1
    scores = [totals[i] / counts[i] if counts[i] else None for i in range(len(answers))]
    return Judgement(scores, "pairwise", judge)
