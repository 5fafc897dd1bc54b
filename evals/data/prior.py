"""The warm-start prior that ships with the package: a seeded sample of the bundled RouteLLM data.

``pointsman train --data file:... --out REGISTRY`` fits every pair's difficulty head with this sample
as a prior (:mod:`evals.retrain`, :class:`evals.pair_fit.PairPrior`). It ships inside the package so the
warm start is the same wherever Pointsman is installed, with or without the routing data directory
next to the checkout: 3,000 prompts drawn with seed 0 from RouteLLM's MMLU, GSM8K and MT-bench
outcomes of GPT-4-1106 and Mixtral-8x7B (Apache-2.0; see ``prior/NOTICE``), as
:func:`evals.labelled.load_routellm_rows` reads them (contaminated prompts dropped, MT-bench judge scores
mapped onto [0, 1]).

Rebuild it from the data directory (byte-for-byte reproducible)::

    python -m evals.data.prior [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evals.labelled import LabelledRequest

PRIOR_FILE = Path(__file__).resolve().parent / "prior" / "routellm-gpt4-mixtral.jsonl.gz"
#: Prompts in the shipped sample, and the seed that drew them.
PRIOR_ROWS = 3000
PRIOR_SEED = 0


def sample_rows(rows: Sequence[LabelledRequest], n: int, seed: int) -> list[LabelledRequest]:
    """A seeded sample of ``n`` rows in their original order (all of them when there are not more)."""
    if len(rows) <= n:
        return list(rows)
    keep = np.sort(np.random.default_rng(seed).choice(len(rows), n, replace=False))
    return [rows[i] for i in keep]


def build_prior_file(data_dir: Path, path: Path = PRIOR_FILE) -> int:
    """Write the shipped sample from the routing data directory; returns the number of rows."""
    from evals.labelled import load_routellm_rows

    rows = sample_rows(load_routellm_rows(data_dir), PRIOR_ROWS, PRIOR_SEED)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {"messages": r.messages, "scores": r.qualities, "source": r.source, "domain": r.domain},
            sort_keys=True, ensure_ascii=False,
        )
        for r in rows
    ]
    payload = ("\n".join(lines) + "\n").encode()
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:
        out.write(payload)
    return len(rows)


def load_prior_rows(path: Path = PRIOR_FILE) -> list[LabelledRequest]:
    """The shipped sample as labelled requests (raises ``FileNotFoundError`` on a broken install)."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            item = json.loads(line)
            rows.append(
                LabelledRequest(
                    messages=item["messages"],
                    qualities={k: float(v) for k, v in item["scores"].items()},
                    costs={},
                    source=item["source"],
                    domain=item.get("domain"),
                )
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Rebuild :data:`PRIOR_FILE` from the routing data directory."""
    from evals.data import resolve_data_dir

    parser = argparse.ArgumentParser(description="Rebuild the shipped warm-start prior sample.")
    parser.add_argument("--data-dir", default=None, help="routing data directory (default: the shared one)")
    args = parser.parse_args(argv)
    n = build_prior_file(resolve_data_dir(args.data_dir))
    print(f"{PRIOR_FILE}: {n} rows, {PRIOR_FILE.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
