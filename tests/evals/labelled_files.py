"""Labelled request files whose per-model quality depends on the prompt in a known way.

Two kinds of prompt: arithmetic/algebra word problems ("math") and short friendly writing requests
("chat"). With ``relation="math-needs-strong"`` the strong model answers both kinds well and the weak
model fails the math ones; ``relation="chat-needs-strong"`` is the opposite (a router trained on it
routes the wrong prompts). ``noise`` flips a share of the weak model's outcomes. Everything is seeded,
so a file is the same bytes on every run.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

STRONG = "big-model"
WEAK = "small-model"
TWIN = "twin-model"  # see with_twin
NAMES = ("Anna", "Ben", "Chloe", "Dev", "Emma", "Farid", "Gina", "Hugo", "Ines", "Jon")
TOPICS = ("birthday", "new job", "wedding", "graduation", "holiday", "promotion", "house move", "retirement")


def prompts(seed: int, n: int) -> list[tuple[str, bool]]:
    """``n`` (prompt, is_math) pairs, half of each kind on average."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            a, b, c = rng.randint(10, 999), rng.randint(10, 999), rng.randint(2, 99)
            text = rng.choice(
                [
                    f"Compute {a} * {b} - {c} and show each step.",
                    f"Solve for x: {a}x + {b} = {c}. Give x as a fraction.",
                    f"What is the remainder when {a * b} is divided by {c}?",
                    f"If a train travels {a} km in {c} hours, what is its average speed in m/s?",
                ]
            )
            out.append((text, True))
        else:
            text = rng.choice(
                [
                    f"Write a short friendly note to {rng.choice(NAMES)} about their {rng.choice(TOPICS)}.",
                    f"Say hello to {rng.choice(NAMES)} in a cheerful way.",
                    f"Suggest a title for a blog post about my {rng.choice(TOPICS)}.",
                    f"Give me three synonyms for happy, for a card about a {rng.choice(TOPICS)}.",
                ]
            )
            out.append((text, False))
    return out


def rows(
    seed: int,
    n: int,
    *,
    relation: str = "math-needs-strong",
    noise: float = 0.05,
    models: tuple[str, str] = (STRONG, WEAK),
) -> list[dict[str, Any]]:
    """JSON-shaped labelled rows (``prompt``, ``scores``, ``costs``)."""
    rng = random.Random(seed + 10_000)
    strong, weak = models
    out = []
    for text, is_math in prompts(seed, n):
        needs_strong = is_math if relation == "math-needs-strong" else not is_math
        weak_q = 0.0 if needs_strong else 1.0
        if rng.random() < noise:
            weak_q = 1.0 - weak_q
        out.append({"prompt": text, "scores": {strong: 1.0, weak: weak_q}, "costs": {strong: 0.01, weak: 0.0005}})
    return out


def with_twin(items: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Add a third model, ``TWIN``: the weak one with a tenth of its outcomes flipped both ways, so the
    weak-vs-twin pair's mean quality gap is about zero (the near-tie a multi-model labelled file holds)."""
    rng = random.Random(seed)
    out = []
    for r in items:
        weak_q = r["scores"][WEAK]
        twin_q = 1.0 - weak_q if rng.random() < 0.1 else weak_q
        out.append({**r, "scores": {**r["scores"], TWIN: twin_q}, "costs": {**r["costs"], TWIN: 0.0004}})
    return out


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    """One JSON object per line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def write_csv(path: Path, items: list[dict[str, Any]]) -> Path:
    """The documented CSV form: prompt, score:<model>..., cost:<model>..., weight."""
    models = sorted({m for r in items for m in r["scores"]})
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", *[f"score:{m}" for m in models], *[f"cost:{m}" for m in models], "weight"])
        for r in items:
            w.writerow(
                [
                    r["prompt"],
                    *["" if r["scores"].get(m) is None else r["scores"][m] for m in models],
                    *[r.get("costs", {}).get(m, "") for m in models],
                    r.get("weight", 1.0),
                ]
            )
    return path
