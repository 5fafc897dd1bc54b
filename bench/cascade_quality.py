"""Cascade quality on held-out prompts: the cheap model answers first, an answer-confidence score decides
whether to escalate to the strong model. Compared in the same run with pre-answer routing and baselines.

GSM8K (RouteLLM's responses of Mixtral-8x7B = weak and GPT-4-1106 = strong, contaminated prompts dropped):
5 folds by prompt hash; every head and router is refitted per fold on the other four, and every
hyperparameter (the head's C / embedding weight / strong-answer weight, the router's alpha, the combined
policy's band) is chosen by an inner 4-fold CV inside the training folds. Out-of-fold scores are pooled into
one quality-vs-cost curve per policy.

Costs: tokens = characters / 4 (no GPT-4 or Mixtral tokenizer offline), GPT-4-1106 $10 / $30 and
Mixtral-8x7B $0.6 / $0.6 per million input / output tokens; every call made is paid, prompt tokens
included: a cascade pays the weak call on every prompt and the strong call on escalated ones.

Policies: always-weak, always-strong, random mix; pre-answer routers (logistic regression on the prompt
embedding, the reference kind; the shipped difficulty head's kind, grouped, trained on all RouteLLM data
outside the test fold; ridge on the gain on GSM8K); the cascade on the answer-confidence head (plus
ablations: checks only, embedding only); combined policies (the router sends its top share of prompts
straight to the strong model and the rest are cascaded; the share is chosen in the training folds;
fixed shares shown too); a stacked escalation score (ridge on logit answer confidence + router score,
fitted on inner out-of-fold scores); the oracle cascade as a bound. Reported: cost (share of always-strong's)
to reach 80%, 95% and 100% of the strong model's quality, with paired bootstrap 95% CIs over prompts
(1,000 resamples), the head's held-out AUC per fold, curves as PNG, Markdown + JSON in
``bench/results/cascade_quality/``.

RouterBench-train (mixtral-8x7b-chat vs gpt-4-1106-preview, real per-call costs; ARC, MBPP, Winogrande) is
a development check only: reported separately and never used by any shipped artifact.

Run: ``nice -n 5 .venv/bin/python bench/cascade_quality.py [--encoder static|minilm] [--data DIR]``
(static ~10 min on 2 shared cores, minilm adds ~10 min of encoding the first time).
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from classifiers.heads.features import build_features  # noqa: E402
from classifiers.heads.head import apply_calibration  # noqa: E402
from evals.cascade import (  # noqa: E402
    GPT4_1106_PRICES,
    MIXTRAL_8X7B_PRICES,
    PairTable,
    PolicySpec,
    apply_escalation_stack,
    bootstrap_costs,
    choose_direct_share,
    direct_mask,
    estimate_tokens,
    fit_escalation_stack,
    share_threshold,
    summarize_costs,
)
from evals.data import resolve_data_dir  # noqa: E402
from evals.data.split import fold_of  # noqa: E402
from evals.embeddings import embed_prompts, get_encoder, prompt_text  # noqa: E402
from evals.metrics import evaluate_scores, percentile_ci  # noqa: E402
from evals.quality import roc_auc  # noqa: E402
from evals.report import jsonable  # noqa: E402
from evals.train_answer_confidence import (  # noqa: E402
    INNER_FOLDS,
    INNER_SEED,
    OUTER_FOLDS,
    AnswerData,
    AnswerFeatures,
    HeadConfig,
    cross_validate,
    featurize,
    fit_answer_head,
    load_gsm8k_answers,
    outer_folds,
    training_rows,
)

RESULTS = ROOT / "bench" / "results" / "cascade_quality"
TARGETS = (0.8, 0.95, 1.0)
DIRECT_SHARES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4)
RIDGE_ALPHAS = (1000.0, 3000.0, 10000.0)
CHECKS_ONLY = HeadConfig(C=0.1, emb_weight=0.0, strong_weight=0.0)
EMBEDDING_ONLY = HeadConfig(C=0.01, emb_weight=1.0, strong_weight=0.0, use_checks=False)
ROUTERBENCH_WEAK = "mistralai/mixtral-8x7b-chat"
ROUTERBENCH_STRONG = "gpt-4-1106-preview"
ROUTERBENCH_FILES = ("arc_challenge_train.csv", "mbpp_train.csv", "winograde_train.csv")

Progress = Callable[[Iterable[Any]], Iterable[Any]]
ROUTER_REF = "pre-answer router: logreg on prompt embedding"
CASCADE = "cascade: answer-confidence head"
COMBINED = "combined: router's top share direct (chosen in training folds) + cascade"
STACKED = "combined: stacked escalation (logit confidence + router)"
HEADLINE = (CASCADE, COMBINED)
HEADLINE_DIFFERENCES = (
    (CASCADE, ROUTER_REF),
    (COMBINED, ROUTER_REF),
    (COMBINED, CASCADE),
    (STACKED, CASCADE),
    ("cascade: checks only", CASCADE),
)


def _progress(desc: str, total: int | None = None) -> Progress:
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, total=total, leave=False, file=sys.stderr)


def _cost95(summary: dict[str, Any], name: str) -> float:
    return float(summary[name]["0.95"]["relative_cost"])


def _logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
    return np.asarray(np.log(q / (1 - q)), dtype=float)


# ------------------------------------------------------------------ pre-answer routers


def _standardise(x_train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    mean, scale = x_train.mean(axis=0), x_train.std(axis=0)
    scale[scale < 1e-8] = 1.0
    return [(x_train - mean) / scale, *[(o - mean) / scale for o in others]]


def logreg_router(
    x: np.ndarray, needed: np.ndarray, train: np.ndarray, score: np.ndarray, c: float = 0.003
) -> np.ndarray:
    """Logistic regression on ``strong_needed`` (evals.difficulty's ``logreg(C=0.003)[emb]`` candidate)."""
    from sklearn.linear_model import LogisticRegression

    if needed[train].min() == needed[train].max():
        return np.full(int(score.sum()), float(needed[train].mean()))
    a, b = _standardise(x[train], x[score])
    return np.asarray(LogisticRegression(C=c, max_iter=3000).fit(a, needed[train]).predict_proba(b)[:, 1])


def ridge_router(x: np.ndarray, gain: np.ndarray, train: np.ndarray, score: np.ndarray, alpha: float) -> np.ndarray:
    """Ridge regression on the gain strong - weak (evals.difficulty's ``ridge`` candidate); higher = strong."""
    from sklearn.linear_model import Ridge

    a, b = _standardise(x[train], x[score])
    return np.asarray(Ridge(alpha=alpha).fit(a, gain[train]).predict(b))


@dataclass
class RouterFold:
    """The combined policy's router in one outer fold: its alpha, test scores and inner out-of-fold scores."""

    alpha: float
    inner: np.ndarray  # NaN outside the fold's training rows


def ridge_router_cv(
    x: np.ndarray, gain: np.ndarray, qs: np.ndarray, qw: np.ndarray, folds: np.ndarray, inner: np.ndarray
) -> tuple[np.ndarray, list[RouterFold]]:
    """Out-of-fold ridge-router scores with alpha chosen per outer fold by inner-CV APGR."""
    n = len(gain)
    oof = np.zeros(n)
    per_fold: list[RouterFold] = []
    for f in range(OUTER_FOLDS):
        train = folds != f
        best: tuple[float, float, np.ndarray] | None = None
        for alpha in RIDGE_ALPHAS:
            sc = np.full(n, np.nan)
            for g in range(INNER_FOLDS):
                tr, te = train & (inner != g), train & (inner == g)
                sc[te] = ridge_router(x, gain, tr, te, alpha)
            apgr = evaluate_scores(sc[train], qs[train], qw[train]).apgr
            if best is None or apgr > best[0]:
                best = (apgr, alpha, sc)
        assert best is not None
        oof[folds == f] = ridge_router(x, gain, train, folds == f, best[1])
        per_fold.append(RouterFold(best[1], best[2]))
    return oof, per_fold


def grouped_router_oof(data_dir: Path, encoder: Any, prompts: Sequence[str], log: Callable[[str], None]) -> np.ndarray:
    """The shipped difficulty head's kind (grouped, centroid gate tau=0.02) trained per fold on every RouteLLM
    prompt (MMLU, GSM8K, MT-bench) outside the test fold; out-of-fold scores of ``prompts`` (GSM8K)."""
    from evals.data.split import DEFAULT_SEED
    from evals.dataset import load_pair_data
    from evals.difficulty import Candidate, features_of, fit_candidate

    data = load_pair_data(data_dir, encoder, DEFAULT_SEED, progress=True)
    folds = np.array([fold_of(r.prompt, OUTER_FOLDS, 0) for r in data.records])
    cand = Candidate("grouped", {"tau": 0.02, "alpha": 3000.0})
    gsm = data.dataset == "gsm8k"
    index = {r.prompt: i for i, r in enumerate(data.records) if r.dataset == "gsm8k"}
    scores = np.zeros(len(data.records))
    for f in _progress("grouped router folds")(range(OUTER_FOLDS)):
        fitted = fit_candidate(cand, data, folds != f, 0)
        rows = gsm & (folds == f)
        scores[rows] = fitted.score(features_of(data, cand)[rows])
    log(f"  grouped router: trained on {len(data.records)} RouteLLM prompts per fold (minus the test fold)")
    return np.array([scores[index[p]] for p in prompts])


# ------------------------------------------------------------------ one evaluation (GSM8K or RouterBench)


@dataclass
class Experiment:
    """Everything one data set's evaluation needs (rows aligned)."""

    name: str
    data: AnswerData
    feats: AnswerFeatures
    prompt_emb: np.ndarray
    prompt_x: np.ndarray  # embedding + cheap prompt statistics
    table: PairTable
    extra_routers: dict[str, np.ndarray] = field(default_factory=dict)
    zero_shot_conf: dict[str, np.ndarray] = field(default_factory=dict)


def _fixed_head_oof(exp: Experiment, cfg: HeadConfig, folds: np.ndarray) -> tuple[np.ndarray, list[float]]:
    oof = np.zeros(len(exp.data))
    aucs = []
    for f in range(OUTER_FOLDS):
        train, test = folds != f, folds == f
        x, y, w = training_rows(exp.feats, exp.data, train, cfg.strong_weight)
        head = fit_answer_head(x, y, w, exp.feats.dim, cfg)
        oof[test] = head.raw_proba(exp.feats.weak[test])[:, 1]
        aucs.append(roc_auc(exp.data.weak_good[test], oof[test]))
    return oof, aucs


def run(exp: Experiment, draws: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Fit every policy's scores out of fold, then curves, costs with bootstrap CIs and AUCs."""
    data, table = exp.data, exp.table
    n = len(data)
    folds = outer_folds(data)
    inner = np.array([fold_of(p, INNER_FOLDS, INNER_SEED) for p in data.prompts])
    qs, qw = data.strong_good.astype(float), data.weak_good.astype(float)
    gain = qs - qw
    needed = ((qs > 0.5) & (qw < 0.5)).astype(int)

    log(f"[{exp.name}] answer-confidence head: 5 outer folds, inner selection")
    t0 = time.perf_counter()
    cv, conf, _, fitted = cross_validate(exp.feats, data, log=log, progress=_progress)
    per_fold_auc = [r["weak_auc"] for r in cv["per_fold"]]
    log(f"  head done in {time.perf_counter() - t0:.0f}s; held-out weak AUC per fold {per_fold_auc}")
    ablations: dict[str, dict[str, Any]] = {}
    ablation_scores: dict[str, np.ndarray] = {}
    for label, cfg in (("checks only", CHECKS_ONLY), ("embedding of prompt+answer only", EMBEDDING_ONLY)):
        oof, aucs = _fixed_head_oof(exp, cfg, folds)
        ablation_scores[label] = oof
        ablations[label] = {
            "config": cfg.name,
            "weak_auc_per_fold": [round(a, 4) for a in aucs],
            "weak_auc_pooled": round(roc_auc(data.weak_good, oof), 4),
        }
        log(f"  ablation {label}: AUC per fold {ablations[label]['weak_auc_per_fold']}")

    log(f"[{exp.name}] pre-answer routers")
    router_ref = np.zeros(n)
    for f in range(OUTER_FOLDS):
        router_ref[folds == f] = logreg_router(exp.prompt_emb, needed, folds != f, folds == f)
    router_c, router_folds = ridge_router_cv(exp.prompt_x, gain, qs, qw, folds, inner)

    # Combined policies: every choice made on the training folds' inner out-of-fold scores.
    direct = np.zeros(n, dtype=bool)
    stacked = np.zeros(n)
    stacked_direct = np.zeros(n, dtype=bool)
    choices = []
    for f in range(OUTER_FOLDS):
        train, test = folds != f, folds == f
        head = fitted[f].head
        conf_inner = apply_calibration(
            np.column_stack([1 - fitted[f].selection.oof_weak, fitted[f].selection.oof_weak]), head.calibration
        )[:, 1]
        sub = table.take(train)
        r_in, c_in = router_folds[f].inner[train], conf_inner[train]
        share, costs = choose_direct_share(sub, r_in, 1 - c_in, DIRECT_SHARES, 0.95)
        threshold = share_threshold(r_in, share)
        direct[test] = direct_mask(router_c[test], threshold)
        feats_in = np.column_stack([_logit(c_in), r_in])
        mean, sd = feats_in.mean(axis=0), feats_in.std(axis=0) + 1e-12
        weights = fit_escalation_stack((feats_in - mean) / sd, sub)
        feats_test = (np.column_stack([_logit(conf[test]), router_c[test]]) - mean) / sd
        stacked[test] = apply_escalation_stack(feats_test, weights)
        st_in = apply_escalation_stack((feats_in - mean) / sd, weights)
        st_share, st_costs = choose_direct_share(sub, r_in, st_in, DIRECT_SHARES, 0.95)
        stacked_direct[test] = direct_mask(router_c[test], share_threshold(r_in, st_share))
        choices.append(
            {
                "fold": f,
                "router_alpha": router_folds[f].alpha,
                "direct_share": share,
                "inner_cost_at_95_by_share": {f"{k:g}": round(v, 4) for k, v in costs.items()},
                "stack_weights(logit conf, router, intercept)": [round(float(w), 4) for w in weights],
                "stacked_direct_share": st_share,
                "stacked_inner_cost_at_95_by_share": {f"{k:g}": round(v, 4) for k, v in st_costs.items()},
            }
        )
    log(f"  combined choices per fold: direct share {[c['direct_share'] for c in choices]}")

    policies: list[PolicySpec] = [
        PolicySpec("random mix (always-weak / always-strong)", "mix"),
        PolicySpec(ROUTER_REF, "route", router_ref),
        *[PolicySpec(f"pre-answer router: {k}", "route", v) for k, v in exp.extra_routers.items()],
        PolicySpec("pre-answer router: ridge on gain (combined's router)", "route", router_c),
        PolicySpec(CASCADE, "cascade", 1 - conf),
        *[PolicySpec(f"cascade: {k}", "cascade", 1 - v) for k, v in ablation_scores.items()],
        *[PolicySpec(f"cascade: {k}", "cascade", 1 - v) for k, v in exp.zero_shot_conf.items()],
        PolicySpec(COMBINED, "cascade", 1 - conf, direct),
        PolicySpec(STACKED, "cascade", stacked),
        PolicySpec(
            "combined: stacked escalation + direct share (chosen in training folds)", "cascade", stacked, stacked_direct
        ),
    ]
    realized = {COMBINED: float(direct.mean()), "stacked + direct share": float(stacked_direct.mean())}
    fixed_band = []
    for share in (0.1, 0.2, 0.3):
        mask = np.zeros(n, dtype=bool)
        for f in range(OUTER_FOLDS):
            train, test = folds != f, folds == f
            mask[test] = direct_mask(router_c[test], share_threshold(router_folds[f].inner[train], share))
        realized[f"fixed {share:g}"] = float(mask.mean())
        fixed_band.append(
            PolicySpec(
                f"combined, fixed direct share {share:g} (not selected: transparency)", "cascade", 1 - conf, mask
            )
        )
    oracle = PolicySpec("oracle cascade (escalates exactly the prompts it gains on: a bound)", "cascade", gain)
    all_policies = [*policies, *fixed_band, oracle]

    log(f"[{exp.name}] bootstrap ({draws} resamples)")
    boot = bootstrap_costs(table, all_policies, TARGETS, draws, seed, progress=_progress("bootstrap", draws))
    summary = summarize_costs(table, all_policies, boot, TARGETS)
    learned = [p.name for p in policies if p.kind != "mix"]
    # Descriptive only: taking the minimum over rows is a choice made on the test folds.
    lowest = min(learned, key=lambda k: _cost95(summary, k))
    diffs = {}
    for a, b in HEADLINE_DIFFERENCES:
        if a in boot and b in boot:
            lo, hi = percentile_ci(boot[a][0.95] - boot[b][0.95])
            diffs[f"{a} minus {b}"] = {"point": _cost95(summary, a) - _cost95(summary, b), "ci95": [lo, hi]}
    curves = {p.name: p.curve(table) for p in all_policies}
    weak_mean, strong_mean = float(qw.mean()), float(qs.mean())
    return {
        "name": exp.name,
        "prompts": n,
        "always_weak": {"quality": weak_mean, "relative_cost": float(table.weak_cost.mean() / table.strong_mean_cost)},
        "always_strong": {"quality": strong_mean, "relative_cost": 1.0},
        "weak_or_strong_right": float(np.maximum(qs, qw).mean()),
        "head": cv,
        "ablations": ablations,
        "zero_shot_auc": {k: round(roc_auc(data.weak_good, v), 4) for k, v in exp.zero_shot_conf.items()},
        "router_apgr": {
            "logreg on prompt embedding": round(evaluate_scores(router_ref, qs, qw).apgr, 4),
            **{k: round(evaluate_scores(v, qs, qw).apgr, 4) for k, v in exp.extra_routers.items()},
            "ridge on gain": round(evaluate_scores(router_c, qs, qw).apgr, 4),
        },
        "combined_choices": choices,
        "realized_direct_share": realized,
        "costs": summary,
        "headline": [h for h in HEADLINE if h in summary],
        "lowest_at_95_descriptive": lowest,
        "differences_at_95": diffs,
        "_curves": {
            k: {
                "relative_cost": (c.cost / table.strong_mean_cost).tolist(),
                "quality_share": (c.quality / strong_mean).tolist(),
            }
            for k, c in curves.items()
        },
    }


# ------------------------------------------------------------------ data sets


def gsm8k_experiment(data_dir: Path, encoder: Any, grouped: bool, log: Callable[[str], None]) -> Experiment:
    """RouteLLM's GSM8K responses with token-estimated costs."""
    data = load_gsm8k_answers(data_dir)
    feats = featurize(encoder, data)
    emb = embed_prompts(encoder, data.prompts)
    x = build_features(emb, [prompt_text(p) for p in data.prompts])
    ptok = np.array([estimate_tokens(p) for p in data.prompts])
    table = PairTable(
        strong_quality=data.strong_good.astype(float),
        weak_quality=data.weak_good.astype(float),
        strong_cost=GPT4_1106_PRICES.call_cost(ptok, [estimate_tokens(a) for a in data.strong_answers]),
        weak_cost=MIXTRAL_8X7B_PRICES.call_cost(ptok, [estimate_tokens(a) for a in data.weak_answers]),
    )
    extra = {}
    if grouped:
        extra["grouped, shipped kind (all RouteLLM data)"] = grouped_router_oof(data_dir, encoder, data.prompts, log)
    return Experiment("gsm8k", data, feats, emb, x, table, extra)


def _response(cell: str) -> str:
    try:
        value = ast.literal_eval(cell)
    except (ValueError, SyntaxError):
        return cell
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value)


def routerbench_experiment(data_dir: Path, encoder: Any, gsm8k_head: Any) -> Experiment:
    """RouterBench-train, mixtral-8x7b-chat vs gpt-4-1106-preview, rows where both outcomes are known.
    Development only (no declared licence): nothing from it is shipped."""
    csv.field_size_limit(1 << 30)
    prompts, weak, strong, wg, sg, wc, sc = [], [], [], [], [], [], []
    for name in ROUTERBENCH_FILES:
        with (data_dir / "routerbench-train" / name).open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                try:
                    q_w, q_s = float(row[ROUTERBENCH_WEAK]), float(row[ROUTERBENCH_STRONG])
                    c_w, c_s = (
                        float(row[f"{ROUTERBENCH_WEAK}|total_cost"]),
                        float(row[f"{ROUTERBENCH_STRONG}|total_cost"]),
                    )
                except (KeyError, ValueError):
                    continue
                if any(math.isnan(v) for v in (q_w, q_s, c_w, c_s)):
                    continue
                prompts.append(ast.literal_eval(row["prompt"])[0])
                weak.append(_response(row[f"{ROUTERBENCH_WEAK}|model_response"]))
                strong.append(_response(row[f"{ROUTERBENCH_STRONG}|model_response"]))
                wg.append(int(q_w >= 0.5))
                sg.append(int(q_s >= 0.5))
                wc.append(c_w)
                sc.append(c_s)
    data = AnswerData(prompts, weak, strong, np.array(wg), np.array(sg))
    feats = featurize(encoder, data)
    emb = embed_prompts(encoder, prompts)
    x = build_features(emb, [prompt_text(p) for p in prompts])
    table = PairTable(np.array(sg, dtype=float), np.array(wg, dtype=float), np.array(sc), np.array(wc))
    zero = {}
    if gsm8k_head is not None:
        zero["GSM8K-trained head, zero-shot"] = gsm8k_head.predict_proba(feats.weak)[:, 1]
    return Experiment("routerbench-train (development only)", data, feats, emb, x, table, {}, zero)


# ------------------------------------------------------------------ output


def _pct(v: float) -> str:
    return "n/a" if not np.isfinite(v) else f"{100 * v:.1f}%"


def markdown(res: dict[str, Any], encoder_id: str) -> list[str]:
    """The report section of one data set."""
    lines = [
        f"## {res['name']} ({res['prompts']} prompts, encoder {encoder_id})",
        "",
        f"Always-weak quality {res['always_weak']['quality']:.3f} at {_pct(res['always_weak']['relative_cost'])} of "
        f"always-strong's cost; always-strong {res['always_strong']['quality']:.3f}; either model right "
        f"{res['weak_or_strong_right']:.3f} (the cascade's ceiling).",
        "",
        "Cost as a share of always-strong's cost (every call counted) to reach a share of the strong model's "
        "quality; [95% bootstrap CI over prompts]; '(n/a)' = never reached.",
        "",
        "| policy | " + " | ".join(f"{int(100 * t)}% of strong quality" for t in TARGETS) + " |",
        "|---|" + "---:|" * len(TARGETS),
    ]
    for name, per in res["costs"].items():
        cells = []
        for t in TARGETS:
            c = per[f"{t:g}"]
            lo, hi = c["ci95"]
            mark = "**" if name in res["headline"] and t == 0.95 else ""
            cells.append(f"{mark}{_pct(c['relative_cost'])}{mark} [{_pct(lo)}, {_pct(hi)}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    head = res["head"]
    lines += [
        "",
        "Headline policies (bold; fixed before looking at the test folds): "
        + "; ".join(
            f"{h}: {_pct(res['costs'][h]['0.95']['relative_cost'])} at 95% "
            f"(CI upper bound {_pct(res['costs'][h]['0.95']['ci95'][1])})"
            for h in res["headline"]
        )
        + f". Lowest row at 95% (descriptive, chosen on the test folds): {res['lowest_at_95_descriptive']}.",
        "Paired differences in cost at 95% (share of always-strong's cost; bootstrap 95% CI):",
        *[
            f"- {k}: {100 * v['point']:+.1f} points [{100 * v['ci95'][0]:+.1f}, {100 * v['ci95'][1]:+.1f}]"
            for k, v in res["differences_at_95"].items()
        ],
        "",
        "Answer-confidence head, held-out AUC on the weak model's answers per fold: "
        + ", ".join(f"{r['weak_auc']:.3f} ({r['chosen']})" for r in head["per_fold"])
        + f"; pooled {head['weak_auc_pooled']:.3f}; on the strong model's answers (pooled) "
        f"{head['strong_auc_pooled']:.3f}; calibration on weak answers ECE {head['calibration_weak']['ece']:.3f}, "
        f"Brier {head['calibration_weak']['brier']:.3f}.",
        "Ablations (fixed hyperparameters): "
        + "; ".join(
            f"{k} AUC per fold {v['weak_auc_per_fold']} (pooled {v['weak_auc_pooled']})"
            for k, v in res["ablations"].items()
        )
        + ".",
    ]
    if res["zero_shot_auc"]:
        lines.append("Zero-shot: " + "; ".join(f"{k} AUC {v}" for k, v in res["zero_shot_auc"].items()) + ".")
    lines.append(
        "Pre-answer routers' APGR (pooled out-of-fold): "
        + ", ".join(f"{k} {v:.3f}" for k, v in res["router_apgr"].items())
        + "."
    )
    lines.append(
        "Combined policy choices per fold (direct share chosen on inner out-of-fold scores at the 95% target): "
        + ", ".join(f"{c['direct_share']:g}" for c in res["combined_choices"])
        + "; stacked: "
        + ", ".join(f"{c['stacked_direct_share']:g}" for c in res["combined_choices"])
        + ". Realized share of prompts sent straight to the strong model: "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in res["realized_direct_share"].items())
        + "."
    )
    return [*lines, ""]


def plot(res: dict[str, Any], path: Path) -> None:
    """Quality (share of strong) vs cost (share of always-strong's) per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.5))
    for name, c in res["_curves"].items():
        if "fixed direct share" in name:
            continue
        x, y = 100 * np.array(c["relative_cost"]), 100 * np.array(c["quality_share"])
        order = np.argsort(x, kind="stable")
        style = ":" if name.startswith(("oracle", "random")) else "-"
        ax.plot(x[order], y[order], style, lw=1.6 if name in res["headline"] else 1.0, label=name)
    ax.scatter(
        [100 * res["always_weak"]["relative_cost"], 100],
        [100 * res["always_weak"]["quality"] / res["always_strong"]["quality"], 100],
        color="k",
        zorder=5,
    )
    for t in TARGETS[:2]:
        ax.axhline(100 * t, color="grey", ls="--", lw=0.7)
    ax.axvline(60, color="red", ls="--", lw=0.7)
    ax.set(
        xlabel="cost, % of always-strong (every call counted)",
        ylabel="quality, % of the strong model's",
        title=f"{res['name']}: held-out quality vs cost ({res['prompts']} prompts)",
        xlim=(0, 110),
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_rich(lines: list[str]) -> None:
    """Render the Markdown report with rich when available."""
    try:
        from rich.console import Console
        from rich.markdown import Markdown

        Console(width=200).print(Markdown("\n".join(lines)))
    except ImportError:
        print("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the GSM8K evaluation and the RouterBench development check; write the report."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--encoder", default="static", choices=("static", "minilm"))
    parser.add_argument("--data", help="data directory (default: POINTSMAN_DATA_DIR or ../shared/data)")
    parser.add_argument("--draws", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument(
        "--no-grouped", action="store_true", help="skip the grouped router (embeds all RouteLLM prompts)"
    )
    parser.add_argument("--no-routerbench", action="store_true", help="skip the RouterBench development check")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    data_dir = resolve_data_dir(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    encoder = get_encoder(args.encoder)
    results = [run(gsm8k_experiment(data_dir, encoder, not args.no_grouped, log), args.draws, args.seed, log)]
    if not args.no_routerbench and (data_dir / "routerbench-train").is_dir():
        from evals.train_answer_confidence import fit_selected

        gsm = load_gsm8k_answers(data_dir)
        log("[routerbench] the GSM8K head fitted on every GSM8K prompt (for the zero-shot check)")
        full = fit_selected(featurize(encoder, gsm, progress=False), gsm, np.ones(len(gsm), dtype=bool)).head
        results.append(run(routerbench_experiment(data_dir, encoder, full), args.draws, args.seed, log))
    md = [
        f"# Cascade quality ({args.encoder} encoder)",
        "",
        "Held-out only: 5 folds by prompt hash, heads and routers refitted per fold, hyperparameters and the "
        "combined policy's band chosen by inner CV inside the training folds; out-of-fold scores pooled. Costs: "
        "tokens = characters / 4; GPT-4-1106 $10/$30, Mixtral-8x7B $0.6/$0.6 per Mtok (RouterBench: its own "
        "per-call costs); prompt tokens counted on every call, a cascade's weak call always paid. "
        "Generated by `bench/cascade_quality.py`.",
        "",
    ]
    for res in results:
        md += markdown(res, encoder.id)
        if res["name"].startswith("routerbench"):
            md.insert(
                len(md) - 1, "Development only: RouterBench declares no licence; nothing built from it is shipped."
            )
        stem = f"{res['name'].split()[0]}_{args.encoder}"
        plot(res, out / f"{stem}.png")
        md.append(f"Plot: `{stem}.png`.")
        md.append("")
    md.append(f"Run time {time.perf_counter() - t_start:.0f}s.")
    (out / f"cascade_quality_{args.encoder}.md").write_text("\n".join(md) + "\n")
    payload = {"encoder": encoder.id, "targets": list(TARGETS), "draws": args.draws, "results": results}
    (out / f"cascade_quality_{args.encoder}.json").write_text(json.dumps(jsonable(payload, digits=5), indent=1) + "\n")
    print_rich(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
