"""Answer confidence for cascades: model-free answer checks and P(answer is good | prompt, answer).

- :mod:`classifiers.answer_confidence.checks`: fast, documented checks of an answer's form (final-answer
  form, whether its own arithmetic checks out, consistency of the final number with its last calculation,
  degeneration, refusal, hedging, ...). Pure functions, no model.
- :class:`AnswerConfidence`: the trained head over an encoder embedding of the (prompt, answer) text plus the
  checks. ``AnswerConfidence.load()`` loads the bundled ``static`` artifact; ``score(prompt, answer)``
  returns P(answer is good) in [0, 1].

Usage (a cascade step in the gateway)::

    conf = AnswerConfidence.load(encoder=shared_static_encoder)   # or .load() to build its own encoder
    prompt = conversation_text(body)                               # classifiers.conversation
    if conf.score(prompt, cheap_answer) < threshold:
        ...  # escalate to the strong model
"""

from classifiers.answer_confidence.checks import CHECK_NAMES, CHECKS, answer_checks, check_vector, final_answer
from classifiers.answer_confidence.model import (
    ARTIFACTS_DIR,
    DEFAULT_ENCODER,
    TASK,
    AnswerConfidence,
    answer_features,
    answer_text,
)

__all__ = [
    "ARTIFACTS_DIR",
    "CHECKS",
    "CHECK_NAMES",
    "DEFAULT_ENCODER",
    "TASK",
    "AnswerConfidence",
    "answer_checks",
    "answer_features",
    "answer_text",
    "check_vector",
    "final_answer",
]
