"""Loader for the RouterBench 0-shot train subset (11 models with per-call costs).

Development and benchmarking only: the data has no declared license and must never be vendored or used
for artifacts the product ships (see ``<data>/README.md``).
"""

from __future__ import annotations

import ast
import csv
import math
from pathlib import Path

from evals.data.domains import routerbench_domain
from evals.data.records import MultiModelRecord

FILES = ("arc_challenge_train.csv", "mbpp_train.csv", "winograde_train.csv")
_NON_MODEL = {"", "sample_id", "prompt", "eval_name", "oracle_model_to_route_to"}

csv.field_size_limit(1 << 30)


def _float(cell: str | None) -> float:
    if cell is None or cell.strip() == "":
        return math.nan
    try:
        return float(cell)
    except ValueError:
        return math.nan


def load_routerbench(data_dir: Path) -> list[MultiModelRecord]:
    """All rows of the three train files; the prompt is ``ast.literal_eval(cell)[0]``; empty cells are NaN."""
    root = data_dir / "routerbench-train"
    out: list[MultiModelRecord] = []
    for name in FILES:
        with (root / name).open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            fields = reader.fieldnames or []
            models = [f for f in fields if f not in _NON_MODEL and "|" not in f]
            for row in reader:
                prompt = ast.literal_eval(row["prompt"])[0]
                task = row["eval_name"]
                out.append(
                    MultiModelRecord(
                        prompt=prompt,
                        task=task,
                        domain=routerbench_domain(task),
                        sample_id=row["sample_id"],
                        quality={m: _float(row[m]) for m in models},
                        cost={m: _float(row.get(f"{m}|total_cost")) for m in models},
                    )
                )
    return out
