"""``pointsman train`` on large labelled files: wall time and peak memory at N rows.

For each size in ``--rows`` it writes a synthetic labelled JSONL file (varied prompts: math word problems,
code requests, summaries, translations, trivia, chat; a fifth as multi-turn ``messages`` with a system
prompt; a few repeated prompts; two models with a quality each that depends on the prompt, and costs),
then runs the real ``pointsman train --data file:... --encoders static --out REGISTRY`` as a subprocess
and reports its wall time and peak resident memory: the peak of the whole process tree's RSS (polled from
``/proc`` every 0.2 s) and the kernel's own high-water mark of the child (``wait4``'s ``ru_maxrss``).

The embedding cache of the checkout under test is used as it is; ``--cold`` salts the prompts with a
per-run word so every run encodes from scratch (the cache then keeps the vectors: see ``--keep``).
``--repo`` runs another checkout of Pointsman (e.g. a ``git worktree`` of an older commit) with this
venv, to compare before and after on the same machine.

    .venv/bin/python bench/train_scale.py [--rows 50000,500000] [--seed 0] [--repo PATH] [--cold] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _procs
from _args import int_list

RESULTS_DIR = _procs.BENCH_DIR / "results"
STRONG, WEAK = "big-model", "small-model"

_TOPICS = [
    "the French revolution",
    "photosynthesis",
    "black holes",
    "the stock market",
    "vaccines",
    "climate change",
    "the Roman empire",
    "neural networks",
    "supply chains",
    "jazz",
    "coral reefs",
    "quantum computing",
    "medieval castles",
    "the immune system",
    "volcanoes",
    "cryptography",
    "the printing press",
    "tea",
]
_LANGS = ["Python", "Rust", "Go", "TypeScript", "SQL", "Java", "C++", "Haskell", "bash"]
_CODE_TASKS = [
    "parses a CSV file and sums a column",
    "finds the longest palindromic substring",
    "implements an LRU cache",
    "retries an HTTP call with exponential backoff",
    "merges overlapping intervals",
    "validates an e-mail address",
    "computes a moving average",
    "serialises a binary tree",
    "rate-limits calls per user",
    "deduplicates a list keeping order",
]
_WORDS = (  # noqa: SIM905 (a word list reads better as prose)
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community "
    "name president team minute idea kid body information back parent face others level office door "
    "health person art war history party result change morning reason research girl guy moment air "
    "teacher force education"
).split()
_LANGUAGES = ["German", "Spanish", "Japanese", "French", "Portuguese", "Korean"]


def _filler(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def make_prompt(rng: random.Random) -> tuple[str, float]:
    """One prompt and its difficulty in [0, 1] (how much the strong model's answer is worth more)."""
    kind = rng.random()
    if kind < 0.2:
        a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 9)
        steps = rng.randint(1, 5)
        text = (
            f"A shop sells {a} items on Monday and {b} times as many on Tuesday; on each of the next {steps} "
            f"days sales drop by a factor of {c}. How many items were sold in total? Show your reasoning."
        )
        return text, 0.3 + 0.12 * steps
    if kind < 0.4:
        lang, task = rng.choice(_LANGS), rng.choice(_CODE_TASKS)
        extra = f" Constraints: {_filler(rng, 5, 40)}." if rng.random() < 0.5 else ""
        return f"Write a {lang} function that {task}.{extra}", 0.4 + 0.3 * (lang in ("Rust", "Haskell", "C++"))
    if kind < 0.55:
        body = _filler(rng, 40, 400)
        return f"Summarise the following text in three bullet points:\n\n{body}", 0.25 + len(body) / 8000
    if kind < 0.7:
        return f"Translate into {rng.choice(_LANGUAGES)}: {_filler(rng, 5, 60)}", 0.35
    if kind < 0.85:
        topic = rng.choice(_TOPICS)
        return (
            f"Explain {topic} to a {rng.choice(['child', 'student', 'expert'])} in {rng.randint(2, 9)} sentences.",
            0.2,
        )
    return f"hey, {_filler(rng, 2, 20)}?", 0.05


def make_row(rng: random.Random, salt: str) -> dict[str, Any]:
    """One labelled request (the README's JSONL format)."""
    prompt, difficulty = make_prompt(rng)
    prompt = f"{prompt} {salt}".rstrip()
    p_strong = min(0.97, 0.55 + 0.4 * difficulty)
    p_weak = max(0.03, 0.95 - 0.9 * difficulty)
    if rng.random() < 0.3:  # graded (a judge's 1-10 mapped onto [0, 1]) rather than correct/incorrect
        scores: dict[str, Any] = {
            STRONG: round(min(1.0, max(0.0, rng.gauss(p_strong, 0.2))), 3),
            WEAK: round(min(1.0, max(0.0, rng.gauss(p_weak, 0.2))), 3),
        }
    else:
        scores = {STRONG: rng.random() < p_strong, WEAK: rng.random() < p_weak}
    tokens = len(prompt) // 4 + 200
    row: dict[str, Any] = {"scores": scores, "costs": {STRONG: round(tokens * 3e-5, 6), WEAK: round(tokens * 2e-6, 7)}}
    if rng.random() < 0.2:
        row["messages"] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": _filler(rng, 3, 15)},
            {"role": "assistant", "content": _filler(rng, 5, 30)},
            {"role": "user", "content": prompt},
        ]
    else:
        row["prompt"] = prompt
    return row


def write_file(path: Path, rows: int, seed: int, salt: str) -> None:
    """``rows`` labelled requests as JSONL; about 3% repeat an earlier prompt (re-judged traffic)."""
    rng = random.Random(seed)
    recent: list[dict[str, Any]] = []
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(rows):
            if recent and rng.random() < 0.03:
                row = dict(rng.choice(recent))
                row["scores"] = {m: (not q) if isinstance(q, bool) else q for m, q in row["scores"].items()}
            else:
                row = make_row(rng, salt)
                if len(recent) < 1000:
                    recent.append(row)
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def run_train(repo: Path, data: Path, out: Path, log: Path, extra: list[str]) -> dict[str, Any]:
    """Run ``pointsman train`` from ``repo`` with this interpreter; wall time and peak RSS."""
    cmd = [
        sys.executable,
        "-m",
        "gateway.cli",
        "train",
        "--data",
        f"file:{data}",
        "--encoders",
        "static",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    env = {"PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.monotonic()
    proc = _procs.start(cmd, log, env=env, cwd=repo)
    peak_tree = 0
    status = None
    while status is None:
        peak_tree = max(peak_tree, _tree_rss(proc.pid))
        pid, status_code, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status = status_code
            break
        time.sleep(0.2)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    maxrss_mb = usage.ru_maxrss / 1024  # KiB on Linux
    return {
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_tree_rss_mb": round(peak_tree / 2**20),
        "child_maxrss_mb": round(maxrss_mb),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
    }


def _tree_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and its descendants now."""
    page = resource.getpagesize()
    total = 0
    for member in _procs.tree_pids(pid):
        try:
            total += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def main() -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=int_list(minimum=100),
        default=[50_000, 500_000],
        help="comma-separated sizes of the labelled file (default 50000,500000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    parser.add_argument("--repo", type=Path, default=_procs.REPO_ROOT, help="the Pointsman checkout to run")
    parser.add_argument("--cold", action="store_true", help="salt the prompts so no embedding is cached")
    parser.add_argument("--keep", action="store_true", help="keep the data files, registries and logs")
    parser.add_argument("--train-args", default="", help="more arguments for pointsman train, space-separated")
    args = parser.parse_args()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="train-scale-"))
    salt = f"(ref {int(time.time() * 1000) % 10**9})" if args.cold else ""
    results = []
    print(f"repo {args.repo.resolve()}, {_procs.cpu_count()} cores ({_procs.cpu_model()}), work dir {work}")
    print(f"{'rows':>9} {'file MB':>8} {'wall s':>8} {'CPU s':>8} {'peak RSS MB (tree)':>19} {'maxrss MB':>10}")
    try:
        for n in args.rows:
            data = work / f"labels-{n}.jsonl"
            write_file(data, n, args.seed, salt)
            log = work / f"train-{n}.log"
            res = run_train(args.repo.resolve(), data, work / f"registry-{n}", log, args.train_args.split())
            res.update(rows=n, file_mb=round(data.stat().st_size / 2**20, 1))
            results.append(res)
            print(
                f"{n:>9} {res['file_mb']:>8} {res['wall_s']:>8} {res['cpu_s']:>8} {res['peak_tree_rss_mb']:>19} "
                f"{res['child_maxrss_mb']:>10}" + ("" if res["exit"] == 0 else f"  FAILED (exit {res['exit']}, {log})"),
                flush=True,
            )
            if not args.keep:
                data.unlink()
    finally:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = RESULTS_DIR / f"train_scale-{stamp}.json"
        out.write_text(
            json.dumps({"repo": str(args.repo.resolve()), "cold": args.cold, "results": results}, indent=2) + "\n"
        )
        print(f"results: {out}" + (f"; files kept in {work}" if args.keep else ""))
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
