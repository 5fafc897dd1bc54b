"""Routing quality on held-out prompts: RouteLLM pair routing and RouterBench multi-model choice.

One run prints the tables and writes ``bench/results/routing_quality.md`` plus PNG plots.

Part 1 — GPT-4-1106 (strong) vs Mixtral-8x7B (weak) on RouteLLM's MMLU, GSM8K and MT-bench, contaminated
prompts dropped. Every router is trained on the train split (calibrated on validation) and scored on
the test split only (split by prompt hash, so no test prompt influences training or any kNN index).
Metrics exactly as RouteLLM (evals/metrics.py): APGR, CPT(50%), CPT(80%) (strong-call share, %).
Rows: random, oracle, kNN gain rate on embeddings, every head candidate (both encoders), gradient
boosting (bench only), the shipped artifacts. Also: 5-fold cross-fitted APGR over all prompts (the
setting of the reference "MiniLM + logistic regression, 5-fold: 0.63") and a cross-data check
(trained on MMLU + GSM8K, tested on all of MT-bench).

Part 2 — RouterBench-train (11 models with per-call costs; bench only, never shipped): a held-out
split; the quality head the gateway serves (``evals.quality.train_quality``: per-model calibrated logistic
regressions on embedding + cheap features, what ``pointsman train --quality`` writes) and the policy "maximise predicted
quality - λ · normalised cost" (policies/utility.py's rule, cost predicted as the model's mean train
cost) swept over λ, against every single model and the oracle: plot + table of quality at equal cost
and cost at equal quality.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python bench/routing_quality.py [--encoders minilm,static] [--data DIR]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from classifiers.encoders import MINILM_RUNTIMES  # noqa: E402
from classifiers.heads import load_head  # noqa: E402
from evals.data import resolve_data_dir  # noqa: E402
from evals.data.split import DEFAULT_SEED, fold_of  # noqa: E402
from evals.dataset import MultiData, PairData, load_multi_data, load_pair_data, records_hash  # noqa: E402
from evals.difficulty import DEFAULT_CANDIDATES, Candidate, features_of, fit_candidate, gain_target  # noqa: E402
from evals.embeddings import get_encoder  # noqa: E402
from evals.metrics import (  # noqa: E402
    PairMetrics,
    cost_at_quality,
    evaluate_scores,
    oracle_curve,
    quality_at_cost,
    summarize,
)
from evals.train import ROUTERS_DIR  # noqa: E402

SPLIT_SEED = DEFAULT_SEED  # the same split the shipped artifacts were trained on
DATASETS = ("mmlu", "gsm8k", "mt_bench")
RESULTS = ROOT / "bench" / "results"


def knn_gain(data: PairData, train: np.ndarray, query: np.ndarray, k: int = 100) -> np.ndarray:
    """Mean gain (strong - weak) of the k most similar training prompts (the index holds train rows only)."""
    ref, gain = data.embeddings[train], gain_target(data)[train]
    out = np.empty(int(query.sum()) if query.dtype == bool else len(query))
    q = data.embeddings[query]
    for s in range(0, len(q), 1024):
        sims = q[s : s + 1024] @ ref.T
        idx = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        out[s : s + 1024] = gain[idx].mean(axis=1)
    return out


def _eval(scores: np.ndarray, data: PairData, rows: np.ndarray) -> dict[str, PairMetrics]:
    out = {}
    for ds in DATASETS:
        m = data.dataset[rows] == ds
        if m.sum() >= 10:
            out[ds] = evaluate_scores(scores[m], data.strong[rows][m], data.weak[rows][m])
    return out


def pair_part(data: PairData, seed: int, log: Any) -> dict[str, dict[str, PairMetrics]]:
    """Every router on the test split of one encoder's data; rows keyed by router name."""
    train, val, test = data.mask("train"), data.mask("val"), data.mask("test")
    rows: dict[str, dict[str, PairMetrics]] = {}
    enc = data.encoder_id
    rows[f"kNN gain rate k=100 [{enc}]"] = _eval(knn_gain(data, train, test), data, test)
    cands = [*DEFAULT_CANDIDATES, Candidate("gbm", {"max_iter": 200, "learning_rate": 0.05})]
    for cand in cands:
        t0 = time.perf_counter()
        fitted = fit_candidate(cand, data, train, seed)
        if fitted.head is not None:
            from classifiers.heads.fit import fit_calibration

            fit_calibration(fitted.head, features_of(data, cand)[val], data.needed[val])
        rows[f"{cand.name} [{enc}]"] = _eval(fitted.score(features_of(data, cand)[test]), data, test)
        log(f"  {cand.name} [{enc}] {time.perf_counter() - t0:.0f}s")
    art = ROUTERS_DIR / f"difficulty-gpt4-mixtral-{'minilm' if enc.startswith('minilm-l6') else 'static'}"
    if (art / "manifest.json").exists():
        head = load_head(art)
        idx = np.flatnonzero(train)
        same = head.manifest["data"]["train_sha256"] == records_hash(
            [data.records[i].prompt for i in idx], [int(data.needed[i]) for i in idx]
        )
        if head.manifest.get("encoder") == enc:
            # Guard against leakage: the artifact must have been trained on exactly this train split.
            tag = "" if same else " (TRAINED ON A DIFFERENT SPLIT: not held-out!)"
            rows[f"SHIPPED {art.name}: {head.manifest['metrics']['chosen']}{tag}"] = _eval(
                head.predict_proba(data.features[test])[:, 1], data, test
            )
    return rows


def crossfit_part(data: PairData, seed: int) -> dict[str, dict[str, PairMetrics]]:
    """5-fold cross-fitted scores over all prompts (every prompt scored by a model that did not see it)."""
    folds = np.array([fold_of(r.prompt, 5, seed) for r in data.records])
    out: dict[str, dict[str, PairMetrics]] = {}
    allrows = np.ones(len(data.records), dtype=bool)
    for cand in (
        Candidate("logreg", {"C": 0.003}, features="emb"),
        Candidate("grouped", {"tau": 0.02, "alpha": 3000.0}),
    ):
        scores = np.zeros(len(data.records))
        for f in range(5):
            fitted = fit_candidate(cand, data, folds != f, seed)
            scores[folds == f] = fitted.score(features_of(data, cand)[folds == f])
        out[f"{cand.name} 5-fold [{data.encoder_id}]"] = _eval(scores, data, allrows)
    return out


def crossdata_part(data: PairData, seed: int) -> dict[str, PairMetrics]:
    """Train on MMLU + GSM8K (all splits), test on every MT-bench question."""
    train = data.mask(dataset=("mmlu", "gsm8k"))
    mt = data.mask(dataset="mt_bench")
    out = {}
    for cand in (
        Candidate("ridge", {"alpha": 300.0}),
        Candidate("grouped", {"tau": 0.02, "alpha": 3000.0}),
        Candidate("grouped", {"gate": "logreg", "C": 10.0, "alpha": 3000.0}),
    ):
        s = fit_candidate(cand, data, train, seed).score(features_of(data, cand)[mt])
        out[f"{cand.name} [{data.encoder_id}]"] = evaluate_scores(s, data.strong[mt], data.weak[mt])
    out[f"kNN gain rate k=100 [{data.encoder_id}]"] = evaluate_scores(
        knn_gain(data, train, mt), data.strong[mt], data.weak[mt]
    )
    return out


def baselines(data: PairData) -> dict[str, dict[str, PairMetrics]]:
    """Random (seed 0, and the mean over 200 seeds: small test splits make one draw noisy) and oracle."""
    test = data.mask("test")
    rows = {"random (seed 0)": _eval(np.random.default_rng(0).random(int(test.sum())), data, test)}
    draws = [_eval(np.random.default_rng(s).random(int(test.sum())), data, test) for s in range(200)]
    rows["random (mean of 200 seeds)"] = {
        ds: PairMetrics(
            apgr=float(np.mean([d[ds].apgr for d in draws])),
            cpt50=float(np.mean([d[ds].cpt50 for d in draws])),
            cpt80=float(np.mean([d[ds].cpt80 for d in draws])),
            auc=float(np.mean([d[ds].auc for d in draws])),
            curve=draws[0][ds].curve,
        )
        for ds in draws[0]
    }
    orc = {}
    for ds in DATASETS:
        m = data.mask("test", ds)
        s, w = data.strong[m], data.weak[m]
        orc[ds] = summarize(oracle_curve(s, w), float(s.mean()), float(w.mean()))
    rows["oracle"] = orc
    return rows


# ------------------------------------------------------------------ RouterBench


def multi_part(md: MultiData, seed: int) -> dict[str, Any]:
    """The served quality head (evals.quality: fitted on train, C and calibration on validation); λ sweep on
    test rows without missing cells."""
    from evals.quality import train_quality

    head = train_quality(md, seed, progress=False, log=lambda _line: None)
    train = md.mask("train")
    test = md.mask("test") & ~np.isnan(md.quality).any(axis=1)
    pred = head.predict_proba(md.features[test])
    mean_cost = np.nanmean(md.cost[train], axis=0)
    norm = mean_cost / mean_cost.max()
    q_true, c_true = md.quality[test], md.cost[test]
    # 1e6: pure cost minimisation, so both curves reach the cheapest model.
    lams = np.concatenate([[0.0], np.geomspace(1e-3, 10, 60), [1e6]])
    policy, oracle = [], []
    for lam in lams:
        pick = np.argmax(pred - lam * norm, axis=1)
        r = np.arange(len(pick))
        policy.append((float(c_true[r, pick].mean()), float(q_true[r, pick].mean()), float(lam)))
        opick = np.argmax(q_true - lam * c_true / c_true.max(), axis=1)
        oracle.append((float(c_true[r, opick].mean()), float(q_true[r, opick].mean()), float(lam)))
    singles = {m: (float(c_true[:, j].mean()), float(q_true[:, j].mean())) for j, m in enumerate(md.models)}
    pc, pq = [p[0] for p in policy], [p[1] for p in policy]
    oc, oq = [p[0] for p in oracle], [p[1] for p in oracle]
    table = []
    for m, (c, q) in sorted(singles.items(), key=lambda kv: kv[1][0]):
        table.append(
            {
                "model": m,
                "cost": c,
                "quality": q,
                "policy_quality_at_cost": quality_at_cost(pc, pq, c),
                "policy_cost_at_quality": cost_at_quality(pc, pq, q),
                "oracle_quality_at_cost": quality_at_cost(oc, oq, c),
                "oracle_cost_at_quality": cost_at_quality(oc, oq, q),
            }
        )
    return {
        "policy": policy,
        "oracle": oracle,
        "singles": singles,
        "table": table,
        "n_test": int(test.sum()),
        "n_train": int(train.sum()),
        "encoder": md.encoder_id,
    }


# ------------------------------------------------------------------ output


def _fmt(m: PairMetrics | None) -> tuple[str, str, str]:
    if m is None:
        return ("", "", "")
    # evals.metrics.cpt is NaN where the curve never reaches the target (or strong == weak): "n/a", not "nan%".
    return (f"{m.apgr:.3f}", _pct(m.cpt50), _pct(m.cpt80))


def _pct(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{100 * share:.1f}%"


def pair_table(title: str, rows: dict[str, dict[str, PairMetrics]], datasets: Sequence[str]) -> list[str]:
    """Markdown lines of one pair-routing table."""
    head = "| router | " + " | ".join(f"{d} APGR | {d} CPT50 | {d} CPT80" for d in datasets) + " |"
    lines = [f"### {title}", "", head, "|" + "---|" * (1 + 3 * len(datasets))]
    for name, per in rows.items():
        cells = [c for d in datasets for c in _fmt(per.get(d))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def print_rich(md_lines: list[str]) -> None:
    """Render the markdown report with rich when available."""
    try:
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=200).print(Markdown("\n".join(md_lines)))
    except ImportError:
        print("\n".join(md_lines))


def plot_pair(data: PairData, curves: dict[str, tuple[np.ndarray, dict[str, PairMetrics]]], path: Path) -> None:
    """PGR vs strong-call share on the test split, one panel per data set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DATASETS), figsize=(6 * len(DATASETS), 5))
    for ax, ds in zip(axes, DATASETS, strict=True):
        m = data.mask("test", ds)
        s, w = float(data.strong[m].mean()), float(data.weak[m].mean())
        for name, (_, per) in curves.items():
            if ds not in per:
                continue
            pts = sorted(per[ds].curve, key=lambda p: p.strong_share)
            ax.plot(
                [100 * p.strong_share for p in pts],
                [(p.quality - w) / (s - w) for p in pts],
                marker=".",
                label=f"{name} ({per[ds].apgr:.2f})",
            )
        ax.axhline(1.0, color="red", ls="--", lw=0.8)
        ax.axhline(0.0, color="grey", ls="--", lw=0.8)
        ax.set(title=f"{ds} (test, n={int(m.sum())})", xlabel="strong model calls (%)", ylabel="PGR")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_multi(res: dict[str, Any], path: Path) -> None:
    """RouterBench cost-quality frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    pc = sorted(res["policy"])
    oc = sorted(res["oracle"])
    ax.plot(
        [p[0] for p in pc], [p[1] for p in pc], marker=".", label=f"Pointsman policy (q̂ − λ·cost) [{res['encoder']}]"
    )
    ax.plot([p[0] for p in oc], [p[1] for p in oc], marker=".", ls=":", label="oracle")
    for m, (c, q) in res["singles"].items():
        ax.scatter([c], [q], marker="x")
        ax.annotate(m.split("/")[-1], (c, q), fontsize=7)
    ax.set_xscale("log")
    ax.set(
        xlabel="mean cost per prompt (USD, log)",
        ylabel="mean quality",
        title=f"RouterBench-train held-out (n={res['n_test']})",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run everything and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data")
    parser.add_argument("--encoders", default="minilm,static")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument(
        "--minilm-runtime",
        default="auto",
        choices=MINILM_RUNTIMES,
        help="MiniLM runtime for embedding the data (default: auto, what the gateway serves with on this CPU)",
    )
    parser.add_argument(
        "--minilm-dtype", default="auto", choices=("auto", "float32", "bfloat16"), help="MiniLM dtype (default: auto)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    data_dir = resolve_data_dir(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    held: dict[str, dict[str, PairMetrics]] = {}
    cross: dict[str, dict[str, PairMetrics]] = {}
    mtcross: dict[str, dict[str, PairMetrics]] = {}
    multis = []
    first: PairData | None = None
    minilm_variant = "n/a (not run)"
    for name in [e.strip() for e in args.encoders.split(",") if e.strip()]:
        log(f"[{name}] embeddings")
        enc = get_encoder(name, runtime=args.minilm_runtime, dtype=args.minilm_dtype)
        if name == "minilm":
            minilm_variant = f"{type(enc).__name__} ({getattr(enc, 'dtype', 'float32')})"
        data = load_pair_data(data_dir, enc, SPLIT_SEED, progress=True)
        if first is None:
            first = data
            held.update(baselines(data))
        held.update(pair_part(data, args.seed, log))
        cross.update(crossfit_part(data, args.seed))
        mtcross.update({k: {"mt_bench": v} for k, v in crossdata_part(data, args.seed).items()})
        multis.append(multi_part(load_multi_data(data_dir, enc, SPLIT_SEED, progress=True), args.seed))
    assert first is not None
    n = {ds: int(first.mask("test", ds).sum()) for ds in DATASETS}
    md = [
        "# Routing quality (held-out)",
        "",
        f"GPT-4-1106 vs Mixtral-8x7B, RouteLLM data, contaminated prompts dropped. Test split sizes: {n} "
        "(MT-bench's test split is tiny: read its columns as anecdotes). CPT = strong-call share needed. "
        f"MiniLM embedded with {minilm_variant}.",
        "",
        *pair_table("Test split (train on train, calibrate on validation)", held, DATASETS),
        *pair_table(
            "5-fold cross-fitted over all prompts (comparable with the reference: MiniLM + LR, 0.63)", cross, DATASETS
        ),
        *pair_table("Cross-data: trained on MMLU + GSM8K, tested on all MT-bench questions", mtcross, ("mt_bench",)),
    ]
    for res in multis:
        md += [
            f"### RouterBench-train held-out: multi-model policy [{res['encoder']}] "
            f"(train {res['n_train']} / test {res['n_test']} prompts without missing cells; the served quality head)",
            "",
            "| model | cost/prompt | quality | policy quality at that cost | policy cost at that quality | "
            "oracle quality at that cost | oracle cost at that quality |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in res["table"]:
            f = lambda v, d=4: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"  # noqa: E731
            md.append(
                f"| {r['model']} | ${r['cost']:.6f} | {f(r['quality'], 3)} | {f(r['policy_quality_at_cost'], 3)} | "
                f"${f(r['policy_cost_at_quality'], 6)} | {f(r['oracle_quality_at_cost'], 3)} | "
                f"${f(r['oracle_cost_at_quality'], 6)} |"
            )
        md.append("")
        plot_multi(res, out / f"routerbench_frontier_{res['encoder']}.png")
    curves = {
        k: (np.zeros(0), v)
        for k, v in held.items()
        if k.startswith(("random", "oracle", "kNN", "SHIPPED", "logreg(C=0.003)"))
    }
    plot_pair(first, curves, out / "routing_quality_pgr.png")
    md += [
        "Plots: `routing_quality_pgr.png`, `routerbench_frontier_*.png`. "
        f"Run time {time.perf_counter() - t_start:.0f}s.",
        "",
    ]
    (out / "routing_quality.md").write_text("\n".join(md))
    print_rich(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
