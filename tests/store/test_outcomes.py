"""One reading of a request's feedback about its served answer, shared by off-policy evaluation, the
experiment monitor and the A/B report: they may accept different evidence, never read it differently."""

from __future__ import annotations

from evals.ab.data import served_quality
from evals.offpolicy import served_outcome
from gateway.experiments.monitor import request_outcome
from store.outcomes import served_feedback
from store.records import DecisionRecord, FeedbackRecord, LoggedRequest


def fb(score: float, source: str = "user", metric: str = "quality", model: str = "") -> FeedbackRecord:
    return FeedbackRecord(request_id="r", score=score, metric=metric, source=source, model=model)


def logged(served: str, *feedback: FeedbackRecord) -> LoggedRequest:
    record = DecisionRecord(request_id="r", created_at=0.0, endpoint="chat.completions", route="auto",
                            requested_model="auto", model=served)
    return LoggedRequest(record, None, list(feedback))


# A comparison on a request "big" answered: the judge scored both candidates, a user rated the answer
# by naming its model, and the user's re-ask fired an implicit signal.
COMPARED = (
    fb(1.0, source="judge", model="big"),
    fb(0.0, source="judge", model="small"),
    fb(0.5, source="user", model="big"),
    fb(0.0, source="implicit", metric="reask"),
)


def test_rows_about_the_served_answer_are_those_naming_no_model_or_the_served_one() -> None:
    read = served_feedback(COMPARED, "big", "quality")
    assert read.explicit == 0.5 and read.judge == 1.0 and read.implicit_signals == {"reask"}
    # Served "small": the judge's 0 and nothing explicit (the user named "big").
    read = served_feedback(COMPARED, "small", "quality")
    assert read.explicit is None and read.judge == 0.0
    # Another metric: explicit and judge rows under it only; the re-ask still fired.
    read = served_feedback([*COMPARED, fb(0.2, metric="helpfulness")], "big", "helpfulness")
    assert read.explicit == 0.2 and read.judge is None and read.implicit_failure
    assert read.outcome("helpfulness", use_judge=True) == (0.2, "explicit")
    # An implicit signal stands in for quality (and a metric named like it), not for other metrics.
    only_implicit = served_feedback([fb(0.0, source="implicit", metric="reask")], "big", "helpfulness")
    assert only_implicit.outcome("helpfulness", use_judge=True) is None
    assert only_implicit.outcome("quality", use_judge=True) == (0.0, "implicit")
    assert only_implicit.outcome("reask", use_judge=True) == (0.0, "implicit")


def test_the_three_consumers_agree_on_the_same_rows() -> None:
    assert served_outcome("big", COMPARED) == (0.5, "explicit")
    assert request_outcome(logged("big", *COMPARED), "quality") == 0.5
    assert served_quality(COMPARED, "quality", "big") == {"explicit": 0.5, "judge": 1.0, "implicit": 0.0}
    # Without the user's rating: off-policy never takes the judge (it feeds the direct estimator),
    # the monitor does, and the A/B report shows it as its own group.
    no_user = [COMPARED[0], COMPARED[1], COMPARED[3]]
    assert served_outcome("big", no_user) == (0.0, "implicit")
    assert request_outcome(logged("big", *no_user), "quality") == 1.0
    # The judge's score of the served model counts in the A/B report's judge group (it was dropped
    # there before: the report read only rows with no model, which comparisons never write).
    assert served_quality(no_user, "quality", "big") == {"judge": 1.0, "implicit": 0.0}
