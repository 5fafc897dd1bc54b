"""What one request's feedback says about the answer it was served: one reading for every consumer.

Off-policy evaluation (``evals.offpolicy``), the live experiment monitor (``gateway.experiments.monitor``)
and the A/B report (``evals.ab.data``) all ask the same question of a request's feedback rows; they
differ only in which evidence they accept, not in what counts as evidence:

- *about the served answer*: a row whose ``model`` is empty or names the model that answered (a
  comparison's row about another candidate is not);
- *explicit*: sources :data:`EXPLICIT_SOURCES` (``user``, ``rule``, ``import``) under the metric;
- *judge*: source ``judge`` under the metric (a comparison's score of the served model, or a client's);
- *implicit failure*: a row the gateway recorded itself (``source: implicit``: a re-ask, a regeneration,
  a truncated answer, an upstream error), only ever written as a failure (score 0). It speaks to the
  metric ``quality`` and to a metric named like the signal.

Adaptive allocation reads the same outcome aggregated per arm by the store, in SQL
(:func:`store.experiment_sql.outcomes_sql`, which spells :func:`served_feedback` and
``outcome(metric, use_judge=True)`` out per request): a change here must be made there too (the store
tests compare the two on SQLite and PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from store.records import FeedbackRecord

#: Feedback sources that score the served answer directly.
EXPLICIT_SOURCES: tuple[str, ...] = ("user", "rule", "import")
JUDGE_SOURCE = "judge"
#: The gateway's own signals (re-ask, regenerate, finish_length, upstream_error).
IMPLICIT_SOURCE = "implicit"
#: What an implicit signal scores the answer: it is only ever recorded as a failure.
IMPLICIT_SCORE = 0.0
#: The metric implicit signals speak to whatever their own names.
QUALITY_METRIC = "quality"


@dataclass(frozen=True)
class ServedFeedback:
    """One request's feedback about its served answer under one metric."""

    explicit: float | None  # mean of the explicit rows; None without any
    judge: float | None  # mean of the judge rows; None without any
    implicit_signals: frozenset[str]  # metrics (signal names) of the implicit failure rows

    @property
    def implicit_failure(self) -> bool:
        """Whether any implicit failure signal fired on the answer (whatever the metric)."""
        return bool(self.implicit_signals)

    def outcome(self, metric: str, *, use_judge: bool) -> tuple[float, str] | None:
        """The answer's outcome and its kind (``explicit`` | ``judge`` | ``implicit``), in that order, or None.

        ``use_judge`` False leaves judge rows out (off-policy evaluation: judge comparisons feed the direct
        estimator instead). An implicit signal counts for ``quality`` and for a metric named like it.
        """
        if self.explicit is not None:
            return self.explicit, "explicit"
        if use_judge and self.judge is not None:
            return self.judge, "judge"
        if (metric == QUALITY_METRIC and self.implicit_signals) or metric in self.implicit_signals:
            return IMPLICIT_SCORE, "implicit"
        return None


def served_feedback(feedback: Iterable[FeedbackRecord], served_model: str | None, metric: str) -> ServedFeedback:
    """Read ``feedback`` (one request's rows) for what it says about the answer ``served_model`` gave."""
    about_served = ("", served_model or "")
    explicit: list[float] = []
    judged: list[float] = []
    implicit: set[str] = set()
    for fb in feedback:
        if (fb.model or "") not in about_served:
            continue  # a comparison's row about another candidate's answer
        if fb.source == IMPLICIT_SOURCE:
            if fb.score < 1.0:
                implicit.add(fb.metric)
        elif fb.metric != metric:
            continue
        elif fb.source in EXPLICIT_SOURCES:
            explicit.append(float(fb.score))
        elif fb.source == JUDGE_SOURCE:
            judged.append(float(fb.score))
    return ServedFeedback(
        explicit=sum(explicit) / len(explicit) if explicit else None,
        judge=sum(judged) / len(judged) if judged else None,
        implicit_signals=frozenset(implicit),
    )
