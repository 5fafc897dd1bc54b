"""Task/domain labels derived from the data sets' own metadata (MMLU subjects, MT-bench categories, tasks).

The label set is deliberately small so a head trained on a few thousand prompts can separate it.
"""

from __future__ import annotations

from classifiers.signals import DOMAIN_LABELS

DOMAINS: tuple[str, ...] = DOMAIN_LABELS

_MMLU_MATH = {
    "abstract_algebra",
    "college_mathematics",
    "elementary_mathematics",
    "high_school_mathematics",
    "high_school_statistics",
    "econometrics",
    "college_physics",
    "high_school_physics",
    "college_chemistry",
    "high_school_chemistry",
}
_MMLU_CODE = {"college_computer_science", "high_school_computer_science", "machine_learning", "computer_security"}
_MMLU_REASONING = {"formal_logic", "logical_fallacies", "moral_scenarios"}

# MT-bench categories (question.jsonl) -> domain.
_MT_BENCH = {
    "writing": "writing",
    "roleplay": "chat",
    "reasoning": "reasoning",
    "math": "math",
    "coding": "code",
    "extraction": "extraction",
    "stem": "knowledge",
    "humanities": "knowledge",
}

# RouterBench tasks -> domain: ARC is grade-school science knowledge, Winogrande is commonsense reasoning.
_ROUTERBENCH = {"arc-challenge": "knowledge", "mbpp": "code", "winogrande": "reasoning"}


def mmlu_domain(subject: str) -> str:
    """Map an MMLU subject (file stem without ``mmlu_``) to a domain."""
    if subject in _MMLU_MATH:
        return "math"
    if subject in _MMLU_CODE:
        return "code"
    if subject in _MMLU_REASONING:
        return "reasoning"
    return "knowledge"


def mt_bench_domain(category: str) -> str:
    """Map an MT-bench category to a domain."""
    return _MT_BENCH.get(category, "chat")


def routerbench_domain(task: str) -> str:
    """Map a RouterBench ``eval_name`` to a domain."""
    return _ROUTERBENCH.get(task, "knowledge")
