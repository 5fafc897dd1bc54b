"""Typed records for the routing data sets."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PairRecord:
    """One prompt with the outcome of the strong and the weak model of a routed pair.

    ``strong_quality``/``weak_quality`` are 0/1 correctness (MMLU, GSM8K) or the mean GPT-4 judge score
    over both turns (MT-bench, 1-10). ``strong_needed`` is the difficulty label; see ``routellm.py``.
    """

    prompt: str
    dataset: str  # "mmlu" | "gsm8k" | "mt_bench"
    group: str  # MMLU subject, "gsm8k", or the MT-bench category
    domain: str  # task/domain label (see domains.py)
    strong_quality: float
    weak_quality: float
    strong_needed: bool
    turns: tuple[str, ...] = field(default=())  # MT-bench: every user turn; routing uses the first only


@dataclass(frozen=True)
class MultiModelRecord:
    """One RouterBench prompt with per-model quality (NaN when missing) and per-call cost in USD."""

    prompt: str
    task: str  # "arc-challenge" | "mbpp" | "winogrande"
    domain: str
    sample_id: str
    quality: dict[str, float]
    cost: dict[str, float]
