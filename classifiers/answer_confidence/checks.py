"""Answer checks: fast, model-free features of an answer to a prompt (pure functions, microseconds each).

They look at the *form* of an answer, not at whether it is right: does it end in a clear final answer,
does the arithmetic it writes check out, does its final number follow from its own last calculation,
did it degenerate, refuse or hedge. None of them knows a benchmark's ids or gold answers; they are the
answer-side companions of :mod:`classifiers.heads.features`' prompt statistics, and the
answer-confidence head (:mod:`classifiers.answer_confidence.model`) scores them beside an embedding.

:data:`CHECKS` names and documents each one; :func:`answer_checks` returns them as a ``{name: value}``
dict and :func:`check_vector` as a list in :data:`CHECK_NAMES` order (the order stored in manifests).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from classifiers.answer_confidence._arith import equations, numbers_in, parse_number

# Name -> what it measures (every value is a float; flags are 0/1). The order is the feature order.
CHECKS: dict[str, str] = {
    "empty": "1 when the answer has no visible text (after stripping whitespace), else 0",
    "log_chars": "log(1 + characters of the answer)",
    "log_lines": "log(1 + non-empty lines of the answer)",
    "log_numbers": "log(1 + numbers written in the answer)",
    "final_form": (
        "1 when the answer states its result in a clear final form: '#### 42', '\\boxed{42}', "
        "'The (final) answer is 42', 'Answer: 42' (the last such statement wins)"
    ),
    "final_number": "1 when a final number could be read: from the final form, else the last number of the last line",
    "final_is_integer": "1 when the final number is a whole number (0 when there is none)",
    "final_in_prompt": (
        "1 when the final number also appears in the prompt (answers that echo a given often miss a step)"
    ),
    "final_is_last_result": (
        "1 when the final number equals the result of the last calculation the answer writes "
        "(consistency between the stated answer and the last computed value; 0 without calculations)"
    ),
    "final_among_results": "1 when the final number is the result of any calculation the answer writes",
    "final_log_ratio": (
        "log10 of |final number| over the largest number in the prompt, clipped to [-3, 3] (0 when either is missing "
        "or zero): answers orders of magnitude off the givens are suspicious"
    ),
    "final_conflict": "1 when final-form statements give different numbers (the answer changed its mind)",
    "log_equations": "log(1 + checkable 'a op b = c' steps: written text and <<a*b=c>> calculator annotations)",
    "equations_correct_share": "share of those steps whose result is right at its written precision (1 when none)",
    "equations_wrong": "log(1 + steps whose written result is wrong)",
    "no_equations": "1 when the answer writes no checkable step",
    "prompt_numbers_used": (
        "share of the prompt's distinct numbers (digits and number words such as 'three', 'half', 'twice') "
        "that the answer mentions (1 when the prompt has none): a solution that ignores a given often misses a step"
    ),
    "log_prompt_numbers": "log(1 + numbers in the prompt, digits and number words): how many givens there are",
    "log_prompt_word_numbers": "log(1 + number words in the prompt: 'three', 'half', 'twice', 'a dozen', ...)",
    "steps_per_given": "log(1 + checkable steps) - log(1 + prompt numbers): too few steps for the givens skips some",
    "relational_cues": (
        "log(1 + relational phrases in the prompt: 'more/less/fewer ... than', 'times', 'twice', 'half', "
        "'percent'/'%', 'ago', 'years old', 'remaining', 'average', 'ratio'): relations are where solutions slip"
    ),
    "new_numbers_share": "share of the answer's distinct numbers that are neither in the prompt nor computed by a step",
    "repetition": "share of the answer's lines (>= 8 characters) that repeat an earlier line: degeneration",
    "ngram_repetition": "1 - distinct/total over the answer's word 4-grams: loops and stutter",
    "hedges": "log(1 + hedging or self-correcting phrases: however, assuming, approximately, wait, actually, ...)",
    "refusal": "1 when the answer refuses or says the question cannot be answered",
    "rounding": "1 when the answer rounds or approximates (round, approximately, about, ~, ≈)",
    "truncated": "1 when the answer stops mid-sentence (no final form and no closing punctuation, or a dangling '=')",
    "answer_prompt_ratio": "log of (1 + answer characters) over (1 + prompt characters)",
}
CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)
# Longer texts are checked on their head and tail only (the final answer is at the end), bounding the cost.
MAX_CHARS = 8_000
_HEAD_CHARS = 2_000

# "#### 42": GSM8K's convention; "\boxed{42}": LaTeX; prose forms with an optional currency sign.
_FINAL_FORMS = (
    re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)"),
    re.compile(r"\\boxed\{\s*\\?\$?\s*(-?[\d,]*\.?\d+)"),
    re.compile(
        r"(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:|=)\s*(?:approximately\s+|about\s+)?\**\s*\$?\s*(-?[\d,]*\.?\d+)",
        re.IGNORECASE,
    ),
)
_HEDGES = re.compile(
    r"\b(?:however|assum(?:e|ing|ption)|approximately|roughly|probably|perhaps|maybe|might|unclear|"
    r"not sure|i think|seems|wait|actually|mistake|correction|re-?evaluat\w*|reconsider|let me re|"
    r"let's re|alternatively|but since|doesn't make sense|does not make sense|not possible|impossible)\b",
)
_REFUSAL = re.compile(
    r"\b(?:i(?:'m| am) sorry|i apologi[sz]e|i can(?:not|'t) (?:help|assist|answer|provide|determine)|"
    r"as an ai|cannot be determined|can't be determined|not enough information|insufficient information|"
    r"unable to (?:determine|answer|solve))",
)
_ROUNDING = re.compile(r"\b(?:round(?:ed|ing)?|approximately|about|nearly|almost)\b|[~≈]")
_SMALL_NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
)  # fmt: skip
NUMBER_WORDS: dict[str, float] = {
    **{w: float(i) for i, w in enumerate(_SMALL_NUMBER_WORDS)},
    "thirty": 30.0,
    "forty": 40.0,
    "fifty": 50.0,
    "sixty": 60.0,
    "seventy": 70.0,
    "eighty": 80.0,
    "ninety": 90.0,
    "hundred": 100.0,
    "thousand": 1000.0,
    "million": 1e6,
    "dozen": 12.0,
    "half": 0.5,
    "third": 1 / 3,
    "quarter": 0.25,
    "twice": 2.0,
    "double": 2.0,
    "triple": 3.0,
}
_NUMBER_WORD = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")\b")
_RELATIONS = re.compile(
    r"\b(?:more|less|fewer|greater|older|younger|taller|shorter)\s+than\b|"
    r"\b(?:times|twice|double|triple|half|third|quarter)\b|%|\bpercent|\b(?:ago|years old|age)\b|"
    r"\b(?:remaining|remainder|rest|left over|leftover)\b|\b(?:average|ratio)\b",
)


def _final_form(answer: str) -> tuple[float | None, int]:
    """The number of the last final-form statement, and how many distinct numbers such statements give."""
    found: list[tuple[int, float]] = []
    for pattern in _FINAL_FORMS:
        for m in pattern.finditer(answer):
            value = parse_number(m.group(1))
            if value is not None:
                found.append((m.start(), value))
    if not found:
        return None, 0
    found.sort()
    return found[-1][1], len({round(v, 6) for _, v in found})


def final_answer(answer: str) -> tuple[float | None, bool]:
    """The answer's final number and whether it came from a clear final form (else the last line's last number)."""
    return _final_answer(answer, _final_form(answer)[0])


def _final_answer(answer: str, value: float | None) -> tuple[float | None, bool]:
    if value is not None:
        return value, True
    lines = [line for line in answer.strip().splitlines() if line.strip()]
    for line in reversed(lines[-2:]):  # the last line, or the one before a closing remark
        nums = numbers_in(line)
        if nums:
            return nums[-1], False
    return None, False


def _same(a: float, b: float) -> bool:
    """Two numbers are the same value as written: within 0.005 (cents) or 0.1% of the larger."""
    d = a - b if a > b else b - a
    return d <= 0.005 + 1e-9 or d <= 1e-3 * max(a if a > 0 else -a, b if b > 0 else -b)


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return text[:_HEAD_CHARS] + "\n" + text[len(text) - (MAX_CHARS - _HEAD_CHARS - 1) :]


def answer_checks(prompt: str, answer: str) -> dict[str, float]:
    """Every check of :data:`CHECKS` for one (prompt, answer) pair, as ``{name: value}``.

    Texts longer than :data:`MAX_CHARS` are checked on their first 2,000 and last ~6,000 characters.
    """
    text = _bounded(answer.strip())
    prompt = _bounded(prompt)
    lower = text.lower()
    prompt_lower = prompt.lower()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    answer_numbers = numbers_in(text)
    prompt_digits = numbers_in(prompt)
    prompt_words = [NUMBER_WORDS[w] for w in _NUMBER_WORD.findall(prompt_lower)]
    prompt_numbers = prompt_digits + prompt_words
    steps = equations(text)
    results = [e.right for e in steps]
    wrong = sum(not e.correct for e in steps)
    form_value, distinct_finals = _final_form(text)
    final, from_form = _final_answer(text, form_value)

    def _in(value: float, pool: list[float]) -> bool:
        return any(_same(value, p) for p in pool)

    prompt_distinct = {round(p, 6) for p in prompt_numbers}
    answer_distinct = {round(a, 6) for a in answer_numbers}
    used = sum(1 for p in prompt_distinct if _in(p, answer_numbers))
    new = sum(1 for a in answer_distinct if not _in(a, prompt_numbers) and not _in(a, results))
    largest_given = max((abs(p) for p in prompt_digits), default=0.0)
    ratio = 0.0
    if final is not None and final != 0 and largest_given > 0:
        ratio = max(-3.0, min(3.0, math.log10(abs(final) / largest_given)))
    long_lines = [line for line in lines if len(line) >= 8]
    words = lower.split()
    grams = [tuple(words[i : i + 4]) for i in range(max(len(words) - 3, 0))]
    truncated = (not from_form and text[-1:] not in tuple(".!?)\"'*]}`")) or text.endswith("=")
    return {
        "empty": float(not text),
        "log_chars": math.log1p(len(text)),
        "log_lines": math.log1p(len(lines)),
        "log_numbers": math.log1p(len(answer_numbers)),
        "final_form": float(from_form),
        "final_number": float(final is not None),
        "final_is_integer": float(final is not None and float(final).is_integer()),
        "final_in_prompt": float(final is not None and _in(final, prompt_numbers)),
        "final_is_last_result": float(final is not None and bool(results) and _same(final, results[-1])),
        "final_among_results": float(final is not None and _in(final, results)),
        "final_log_ratio": ratio,
        "final_conflict": float(distinct_finals > 1),
        "log_equations": math.log1p(len(steps)),
        "equations_correct_share": 1.0 - wrong / len(steps) if steps else 1.0,
        "equations_wrong": math.log1p(wrong),
        "no_equations": float(not steps),
        "prompt_numbers_used": used / len(prompt_distinct) if prompt_distinct else 1.0,
        "log_prompt_numbers": math.log1p(len(prompt_numbers)),
        "log_prompt_word_numbers": math.log1p(len(prompt_words)),
        "steps_per_given": math.log1p(len(steps)) - math.log1p(len(prompt_numbers)),
        "relational_cues": math.log1p(len(_RELATIONS.findall(prompt_lower))),
        "new_numbers_share": new / len(answer_distinct) if answer_distinct else 0.0,
        "repetition": (len(long_lines) - len(set(long_lines))) / len(long_lines) if long_lines else 0.0,
        "ngram_repetition": 1.0 - len(set(grams)) / len(grams) if grams else 0.0,
        "hedges": math.log1p(len(_HEDGES.findall(lower))),
        "refusal": float(_REFUSAL.search(lower) is not None),
        "rounding": float(_ROUNDING.search(lower) is not None),
        "truncated": float(truncated),
        "answer_prompt_ratio": math.log1p(len(text)) - math.log1p(len(prompt)),
    }


def check_vector(prompt: str, answer: str) -> list[float]:
    """:func:`answer_checks` as a list in :data:`CHECK_NAMES` order (the head's feature order)."""
    values: Mapping[str, float] = answer_checks(prompt, answer)
    return [values[name] for name in CHECK_NAMES]
