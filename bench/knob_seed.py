"""How close a ``target_strong_share`` knob on a freshly trained router gets to its target before any
live traffic: the window seeded from the pair head's recorded score spread (``score_quantiles``, written
by ``pointsman train``) against the unseeded knob's ``1 - target`` threshold.

Per random half of RouterBench-train's GPT-4 vs Mixtral prompts (ARC-challenge, MBPP, Winogrande): the
half is written as a labelled file and trained with the product's command (``pointsman train --data
file:... --encoders static --out REGISTRY``); the other half is decided by a routing brain over that
registry, as ``POST /v1/route`` decides, with ``min_samples`` above the number of held-out prompts so
every decision uses the start-up threshold. Reported per target: the held-out strong-call share with
the seed and with ``1 - target`` (mean and range over the halves). Bench only: RouterBench has no
licence, nothing from it is shipped.

    .venv/bin/python bench/knob_seed.py [--splits 3] [--targets 0.1,0.3,0.5]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import csv
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._args import float_list
from evals.data import resolve_data_dir
from gateway.cli import main as pointsman
from policies.brain import build_brain, explain_request, parse_routing_config

STRONG, WEAK = "gpt-4-1106-preview", "mistralai/mixtral-8x7b-chat"
TASKS = ("arc_challenge", "mbpp", "winograde")


def load_pairs(data_dir: Path) -> list[dict[str, Any]]:
    """Every RouterBench-train prompt with both models' quality, as labelled-file rows."""
    rows = []
    for task in TASKS:
        with (data_dir / "routerbench-train" / f"{task}_train.csv").open(encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                if r[STRONG] == "" or r[WEAK] == "":
                    continue
                prompt = ast.literal_eval(r["prompt"])[0]
                rows.append({"prompt": prompt, "scores": {STRONG: float(r[STRONG]), WEAK: float(r[WEAK])}})
    return rows


def routing_config(registry: Path, target: float, min_samples: int) -> dict[str, Any]:
    return {
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [STRONG, WEAK]}],
        "routes": [{"name": "auto", "cost_quality": {
            "strong": STRONG, "weak": WEAK, "target_strong_share": target,
            "min_samples": min_samples, "window": min_samples,
        }}],
        "classifiers": {"encoder": "static", "routers_dir": str(registry)},
    }


async def strong_share(registry: Path, prompts: Sequence[str], target: float, *, seeded: bool) -> float:
    """The share of ``prompts`` the start-up threshold sends to the strong model."""
    config = routing_config(registry, target, min_samples=len(prompts) + 1000)
    brain = build_brain(parse_routing_config(config, env={}), sticky=False, explore=False)
    await brain.start()
    try:
        policy: Any = brain.policy("auto")
        if not seeded:  # what the knob did before the seed: 1 - target until min_samples scores
            policy.knob.replace([])
        threshold, source = policy.knob.threshold()
        expected = "calibrated" if seeded else "uncalibrated"
        assert source == expected, f"expected a {expected} start-up threshold, got {source}"
        strong = 0
        for text in prompts:
            body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
            explanation = await explain_request(brain, "auto", body)
            strong += explanation["knob"]["score"] >= threshold
        return strong / len(prompts)
    finally:
        await brain.close()


def run(data_dir: Path, splits: int, targets: Sequence[float]) -> dict[str, Any]:
    rows = load_pairs(data_dir)
    results: dict[float, dict[str, list[float]]] = {t: {"seeded": [], "unseeded": []} for t in targets}
    for split in range(splits):
        order = list(range(len(rows)))
        random.Random(split).shuffle(order)
        half = len(rows) // 2
        train, held = [rows[i] for i in order[:half]], [rows[i] for i in order[half:]]
        with tempfile.TemporaryDirectory() as tmp:
            labels = Path(tmp) / "labels.jsonl"
            labels.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
            registry = Path(tmp) / "routers"
            code = pointsman(["train", "--data", f"file:{labels}", "--encoders", "static", "--out", str(registry),
                              "--no-progress"])
            if code != 0:
                raise SystemExit(f"pointsman train failed ({code})")
            prompts = [r["prompt"] for r in held]
            for target in targets:
                for seeded in (True, False):
                    share = asyncio.run(strong_share(registry, prompts, target, seeded=seeded))
                    results[target]["seeded" if seeded else "unseeded"].append(share)
        print(f"split {split}: " + ", ".join(
            f"target {t:g}: seeded {results[t]['seeded'][-1]:.3f}, 1 - target {results[t]['unseeded'][-1]:.3f}"
            for t in targets), file=sys.stderr)
    return {"prompts": len(rows), "splits": splits, "results": results}


def report(out: dict[str, Any]) -> str:
    lines = [
        f"{out['prompts']} GPT-4 vs Mixtral prompts, {out['splits']} random halves (train on one, decide the other)",
        "",
        "| target strong share | seeded from score_quantiles: held-out share (mean, range) "
        "| unseeded (1 - target): held-out share (mean, range) |",
        "|---:|---|---|",
    ]
    for target, r in out["results"].items():
        cells = []
        for key in ("seeded", "unseeded"):
            v = np.array(r[key])
            cells.append(f"{v.mean():.3f} ({v.min():.3f}-{v.max():.3f})")
        lines.append(f"| {target:g} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=3)
    # [0, 1]: what a route's target_strong_share takes.
    parser.add_argument("--targets", type=float_list(minimum=0, maximum=1), default="0.1,0.3,0.5")
    parser.add_argument("--data-dir", help="the shared data directory (default: $POINTSMAN_DATA_DIR or ../shared/data)")
    args = parser.parse_args(argv)
    targets = args.targets
    print(report(run(resolve_data_dir(args.data_dir), args.splits, targets)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
