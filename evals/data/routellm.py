"""Loaders for the RouteLLM evaluation data (GPT-4-1106 strong vs Mixtral-8x7B weak).

Layout and row counts: ``<data>/README.md``. Contaminated prompts (those also in RouteLLM's own training
data, listed in ``*/contaminated_prompts.jsonl`` by their ``eval_prompt``) are dropped, as RouteLLM's
``routellm/evals/benchmarks.py`` does.

Difficulty label ``strong_needed``:
- MMLU, GSM8K: the strong model is correct and the weak one is wrong.
- MT-bench: the strong model's mean judge score (both turns, 1-10) beats the weak one's by at least
  ``MT_BENCH_MARGIN`` points. A one-point margin ignores judge noise between near-equal answers.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from evals.data.domains import mmlu_domain, mt_bench_domain
from evals.data.records import PairRecord

STRONG = "gpt-4-1106-preview"
WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
MT_BENCH_MARGIN = 1.0

csv.field_size_limit(1 << 30)


def _contaminated(path: Path) -> set[str]:
    if not path.exists():
        return set()
    with path.open(encoding="utf-8") as fh:
        return {json.loads(line)["eval_prompt"] for line in fh if line.strip()}


def _bool(cell: str) -> float:
    return 1.0 if cell.strip().lower() in ("true", "1", "1.0") else 0.0


def load_mmlu(data_dir: Path, drop_contaminated: bool = True) -> list[PairRecord]:
    """All 57 MMLU subject files, in sorted subject order."""
    root = data_dir / "routellm" / "mmlu"
    bad = _contaminated(root / "contaminated_prompts.jsonl") if drop_contaminated else set()
    out: list[PairRecord] = []
    for path in sorted(root.glob("mmlu_*.csv")):
        subject = path.stem.removeprefix("mmlu_")
        with path.open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                prompt = row["prompt"]
                if prompt in bad:
                    continue
                s, w = _bool(row[STRONG]), _bool(row[WEAK])
                out.append(PairRecord(prompt, "mmlu", subject, mmlu_domain(subject), s, w, s > w))
    return out


def load_gsm8k(data_dir: Path, drop_contaminated: bool = True) -> list[PairRecord]:
    """GSM8K test questions with both models' correctness."""
    root = data_dir / "routellm" / "gsm8k"
    bad = _contaminated(root / "contaminated_prompts.jsonl") if drop_contaminated else set()
    out: list[PairRecord] = []
    with (root / "gsm8k_responses.csv").open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            prompt = row["prompt"]
            if prompt in bad:
                continue
            s, w = _bool(row[STRONG]), _bool(row[WEAK])
            out.append(PairRecord(prompt, "gsm8k", "gsm8k", "math", s, w, s > w))
    return out


def load_mt_bench(data_dir: Path, drop_contaminated: bool = True) -> list[PairRecord]:
    """MT-bench questions; quality is each model's mean judge score over both turns.

    A question is dropped when either of its turns is contaminated (as RouteLLM does).
    """
    root = data_dir / "routellm" / "mt_bench"
    bad = _contaminated(root / "contaminated_prompts.jsonl") if drop_contaminated else set()
    scores: dict[tuple[int, str], list[float]] = defaultdict(list)
    with (root / "judgements.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                j = json.loads(line)
                scores[(int(j["question_id"]), j["model"])].append(float(j["score"]))
    out: list[PairRecord] = []
    with (root / "question.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            q = json.loads(line)
            turns = tuple(q["turns"])
            if any(t in bad for t in turns):
                continue
            qid = int(q["question_id"])
            s_scores, w_scores = scores.get((qid, STRONG)), scores.get((qid, WEAK))
            if not s_scores or not w_scores:
                continue
            s, w = sum(s_scores) / len(s_scores), sum(w_scores) / len(w_scores)
            out.append(
                PairRecord(
                    turns[0],
                    "mt_bench",
                    q["category"],
                    mt_bench_domain(q["category"]),
                    s,
                    w,
                    s - w >= MT_BENCH_MARGIN,
                    turns,
                )
            )
    return out


def load_routellm(data_dir: Path, datasets: tuple[str, ...] = ("mmlu", "gsm8k", "mt_bench")) -> list[PairRecord]:
    """Concatenate the requested RouteLLM data sets."""
    loaders = {"mmlu": load_mmlu, "gsm8k": load_gsm8k, "mt_bench": load_mt_bench}
    out: list[PairRecord] = []
    for name in datasets:
        out.extend(loaders[name](data_dir))
    return out
