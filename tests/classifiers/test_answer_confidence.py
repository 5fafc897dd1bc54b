"""Answer checks on hand-written answers, the safe arithmetic evaluator, and the bundled answer-confidence head."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from classifiers.answer_confidence import (
    ARTIFACTS_DIR,
    CHECK_NAMES,
    CHECKS,
    AnswerConfidence,
    answer_checks,
    answer_text,
    check_vector,
    final_answer,
)
from classifiers.answer_confidence._arith import equations, evaluate, numbers_in, parse_number

PROMPT = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
    "How much in dollars does she make every day at the farmers' market?"
)
GOOD = (
    "Janet eats 3 eggs and bakes with 4, so she uses 3 + 4 = <<3+4=7>>7 eggs a day.\n"
    "She sells 16 - 7 = <<16-7=9>>9 eggs.\n"
    "At $2 each she makes 9 * 2 = $<<9*2=18>>18 every day.\n"
    "#### 18"
)
WRONG_ARITHMETIC = "She uses 3 + 4 = 8 eggs.\nShe sells 16 - 8 = 9 eggs.\nShe makes 9 * 2 = $17.\n#### 17"


# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("3 + 4 * 2", 11.0),
        ("(3 + 4) * 2", 14.0),
        ("2^3", 8.0),
        ("2 ** 3", 8.0),
        ("-5 + 3", -2.0),
        ("$1,200 / 4", 300.0),
        ("50% * 80", 40.0),
        ("3 x 60", 180.0),
        ("12 ÷ 4 × 3", 9.0),
    ],
)
def test_evaluate(expr: str, value: float) -> None:
    assert evaluate(expr) == pytest.approx(value)


@pytest.mark.parametrize("expr", ["1 / 0", "2 ^ 1000", "__import__('os')", "3 +", "(3 + 4", "", "abc"])
def test_evaluate_refuses_what_is_not_arithmetic(expr: str) -> None:
    assert evaluate(expr) is None


def test_numbers() -> None:
    assert parse_number("$1,000.50") == 1000.5
    assert parse_number("-2") == -2.0
    assert parse_number("12 apples") is None
    # A minus sign counts only when attached; "3-4" is a range or a subtraction, not -4.
    assert numbers_in("I have -5 and 3-4 and $1,000.50.") == [-5.0, 3.0, 4.0, 1000.5]


def test_equations_read_prose_chains_and_calculator_annotations() -> None:
    steps = equations("So 2 + 1/2 = 5/2 = <<5/2=2.5>>2.5 bolts. Then 3 * 4 = 13, and 16, so 3 + 4 = 7.")
    assert [(s.left, s.right, s.correct) for s in steps] == [
        (2.5, 2.5, True),  # 2 + 1/2 = 5/2
        (2.5, 2.5, True),  # <<5/2=2.5>>
        (12.0, 13.0, False),
        (7.0, 7.0, True),  # "16, so" is not part of the calculation
    ]
    # Rounded results are right at their written precision; restated numbers are not steps.
    assert [s.correct for s in equations("10/3 = 3.33 and 2/3 = 0.7")] == [True, True]
    assert equations("13 = 13 and 60 minutes = 1 hour") == []


# ------------------------------------------------------------------ checks


def test_checks_are_documented_and_ordered() -> None:
    assert list(CHECKS) == list(CHECK_NAMES)
    assert all(isinstance(v, str) and v for v in CHECKS.values())
    assert len(check_vector(PROMPT, GOOD)) == len(CHECK_NAMES)


def test_correct_arithmetic() -> None:
    c = answer_checks(PROMPT, GOOD)
    assert c["equations_correct_share"] == 1.0
    assert c["equations_wrong"] == 0.0
    assert c["no_equations"] == 0.0
    assert c["final_form"] == 1.0
    assert c["final_is_integer"] == 1.0
    assert c["final_is_last_result"] == 1.0
    assert c["final_among_results"] == 1.0
    assert c["final_in_prompt"] == 0.0
    assert c["truncated"] == 0.0
    assert c["empty"] == 0.0
    # 16, 2 and the number words "three" and "four" are all used by the answer.
    assert c["prompt_numbers_used"] == 1.0


def test_wrong_arithmetic() -> None:
    c = answer_checks(PROMPT, WRONG_ARITHMETIC)
    # 3 + 4 = 8 (wrong), 16 - 8 = 9 (wrong), 9 * 2 = 17 (wrong).
    assert c["equations_correct_share"] == 0.0
    assert c["equations_wrong"] == pytest.approx(np.log1p(3))
    assert c["final_is_last_result"] == 1.0  # consistent with its own (wrong) last step


@pytest.mark.parametrize(
    ("answer", "value", "form"),
    [
        ("... so the total is 42.\n#### 42", 42.0, True),
        ("Therefore, the answer is $1,200.", 1200.0, True),
        ("The final answer is: 7.5", 7.5, True),
        ("Answer: -3", -3.0, True),
        ("We get $\\boxed{56}$.", 56.0, True),
        ("She has 3 + 4 = 7 apples left.", 7.0, False),
        ("No numbers here.", None, False),
    ],
)
def test_final_answer_forms(answer: str, value: float | None, form: bool) -> None:
    assert final_answer(answer) == (value, form)


def test_final_answer_that_contradicts_the_last_step() -> None:
    answer = "2 + 1/2 = 5/2 = 2.5 bolts.\nHowever, you can't have half a bolt, so it takes 3.\n#### 3"
    c = answer_checks("A robe takes 2 bolts of blue fiber and half that much white fiber. How many in total?", answer)
    assert c["final_is_last_result"] == 0.0
    assert c["final_among_results"] == 0.0
    assert c["hedges"] > 0


def test_empty_answer() -> None:
    for empty in ("", "   \n  "):
        c = answer_checks(PROMPT, empty)
        assert c["empty"] == 1.0
        assert c["final_number"] == 0.0
        assert c["truncated"] == 1.0
        assert c["log_chars"] == 0.0


def test_degeneration_refusal_and_truncation() -> None:
    loop = "\n".join(["She sells the eggs at the market."] * 6)
    assert answer_checks(PROMPT, loop)["repetition"] == pytest.approx(5 / 6)
    assert answer_checks(PROMPT, "the eggs the eggs the eggs the eggs the eggs")["ngram_repetition"] > 0.5
    assert answer_checks(PROMPT, "I'm sorry, I cannot help with that.")["refusal"] == 1.0
    assert answer_checks(PROMPT, "She sells 16 - 7 =")["truncated"] == 1.0
    assert answer_checks(PROMPT, "She makes about $18.")["rounding"] == 1.0


# ------------------------------------------------------------------ the bundled head


@pytest.fixture(scope="module")
def confidence() -> AnswerConfidence:
    return AnswerConfidence.load()


def test_bundled_artifact_loads(confidence: AnswerConfidence) -> None:
    manifest = json.loads((ARTIFACTS_DIR / "static" / "manifest.json").read_text())
    assert manifest["task"] == "answer_confidence"
    assert confidence.encoder_id == manifest["encoder"] == "minilm-static-256"
    assert manifest["feature_schema"]["checks"] == list(CHECK_NAMES)
    assert manifest["data"]["routerbench"] == "not used"
    assert (ARTIFACTS_DIR / "NOTICE").is_file()


def test_ranks_a_good_answer_above_degenerate_ones(confidence: AnswerConfidence) -> None:
    degenerate = [
        WRONG_ARITHMETIC,
        "\n".join(["Janet has 16 eggs."] * 10),
        "the the the the the the the the the the the the",
        "She sells 16 - 3 = 13 eggs, then 13 -",
        "I'm sorry, but I cannot determine that.",
        "",
    ]
    good = confidence.score(PROMPT, GOOD)
    assert 0.0 <= good <= 1.0
    assert good > 0.6
    scores = confidence.score_many([(PROMPT, d) for d in degenerate])
    assert scores.shape == (len(degenerate),)
    assert (scores < good).all(), scores
    assert (scores < 0.35).all(), scores
    assert confidence.score(PROMPT, "") == 0.0


def test_score_many_matches_score(confidence: AnswerConfidence) -> None:
    pairs = [(PROMPT, GOOD), (PROMPT, WRONG_ARITHMETIC)]
    assert confidence.score_many(pairs).tolist() == pytest.approx([confidence.score(p, a) for p, a in pairs])
    assert confidence.score_many([]).shape == (0,)


class _OtherEncoder:
    id = "some-other-encoder"
    dim = 256

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.zeros((len(texts), self.dim), dtype=np.float32)


def test_load_checks_the_encoder_and_the_path(confidence: AnswerConfidence, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trained with encoder"):
        AnswerConfidence.load(encoder=_OtherEncoder())
    # An already loaded encoder with the right id is used as is.
    again = AnswerConfidence.load(ARTIFACTS_DIR / "static", encoder=confidence.encoder)
    assert again.encoder is confidence.encoder
    with pytest.raises(FileNotFoundError):
        AnswerConfidence.load(tmp_path)


def test_answer_text_keeps_the_end_of_long_answers() -> None:
    text = answer_text("q" * 5000, "step\n" * 1000 + "#### 42")
    assert text.endswith("#### 42")
    assert len(text) <= 800 + 1200 + len("\n\n[answer] ")


def test_a_root_of_a_negative_number_is_no_checkable_step_and_no_error(confidence: AnswerConfidence) -> None:
    """'(-8)^(1/3) = -2' is how an answer writes a cube root; Python's power of a negative base to a fraction
    is a complex number, which made the check raise, so the cascade's head scored nothing (it escalated)
    and a ratings workflow lost the scores of every answer scored with this one."""
    assert evaluate("(-8)^(1/3)") is None
    assert evaluate("(-8)^2") == 64.0
    answer = "The cube root is (-8)^(1/3) = -2, and 2 + 3 = 5. The answer is -2."
    checks = answer_checks("What is the cube root of -8?", answer)
    assert checks["log_equations"] == pytest.approx(np.log1p(1))  # only 2 + 3 = 5 is checked
    assert checks["equations_wrong"] == 0.0
    scores = confidence.score_many([("What is the cube root of -8?", answer), (PROMPT, GOOD)])
    assert np.isfinite(scores).all()
