"""Train the answer-confidence head on GSM8K responses: ``python -m evals.train_answer_confidence``.

Data: RouteLLM's ``gsm8k/gsm8k_responses.csv`` (Apache-2.0, vendorable with its NOTICE): per GSM8K test
question, Mixtral-8x7B's and GPT-4-1106's full responses and whether each was correct; contaminated
prompts dropped. Every (prompt, answer) pair is a row labelled good (correct) or bad. RouterBench is
never used here (no declared licence).

Model: a logistic regression over [embedding of ``answer_text(prompt, answer)``, answer checks]
(:mod:`classifiers.answer_confidence`), standardised, with two extra knobs: ``emb_weight`` scales the
embedding block after standardisation (a smaller weight = a stronger L2 penalty on it relative to the
checks; 0 drops it) and ``strong_weight`` is the sample weight of the strong model's answers (0: train
on the cheap model's answers only, the ones a cascade scores). Hyperparameters are chosen by the mean
AUC on the cheap model's answers in an inner 4-fold CV by prompt hash over the training prompts; Platt
calibration is fitted on the chosen configuration's inner out-of-fold scores.

Writes ``classifiers/artifacts/answer_confidence/<encoder>/`` (manifest.json + weights.npz) and, before
fitting the shipped head on all prompts, measures it by a 5-fold outer CV by prompt hash (selection
repeated inside each fold): the AUC per fold in the manifest is held-out.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.answer_confidence.checks import CHECK_NAMES, CHECKS
from classifiers.answer_confidence.model import (
    ANSWER_CHARS,
    ARTIFACTS_DIR,
    PROMPT_CHARS,
    TASK,
    answer_features,
    answer_text,
)
from classifiers.heads.fit import calibration_report
from classifiers.heads.head import Head
from evals.data import resolve_data_dir
from evals.data.routellm import STRONG, WEAK
from evals.data.split import fold_of
from evals.dataset import records_hash
from evals.embeddings import embed_texts, get_encoder, prompt_text
from evals.quality import roc_auc

LABELS = ("bad", "good")
OUTER_FOLDS = 5
INNER_FOLDS = 4
FOLD_SEED = 0  # the outer folds: fold_of(prompt, 5, 0), as bench/routing_quality.py's cross-fitting
INNER_SEED = 1  # inner folds: an independent hash of the same prompts
SOURCE = {
    "name": "RouteLLM evaluation data: GSM8K responses of GPT-4-1106 and Mixtral-8x7B with correctness",
    "url": "https://github.com/lm-sys/RouteLLM",
    "commit": "0b64fdafe049e596a3f5657c219329f24af24198",
    "path": "routellm/evals/gsm8k/gsm8k_responses.csv",
    "license": "Apache-2.0",
}


@dataclass(frozen=True)
class HeadConfig:
    """Hyperparameters of one answer-confidence head (see the module docstring)."""

    C: float
    emb_weight: float
    strong_weight: float
    use_checks: bool = True  # False: the embedding alone (an ablation; the checks' weights are zero)

    @property
    def name(self) -> str:
        """Readable id, e.g. ``logreg(C=0.1,emb=0.4,strong=0)``."""
        extra = "" if self.use_checks else ",no checks"
        return f"logreg(C={self.C:g},emb={self.emb_weight:g},strong={self.strong_weight:g}{extra})"


DEFAULT_GRID: tuple[HeadConfig, ...] = tuple(
    HeadConfig(c, e, s) for c in (0.01, 0.03, 0.1, 0.3) for e in (0.0, 0.15, 0.4) for s in (0.0, 0.5)
)


@dataclass(frozen=True)
class AnswerData:
    """GSM8K prompts with both models' answers and correctness (row-aligned, one row per prompt)."""

    prompts: list[str]
    weak_answers: list[str]
    strong_answers: list[str]
    weak_good: np.ndarray
    strong_good: np.ndarray

    def __len__(self) -> int:
        return len(self.prompts)

    def texts(self) -> list[str]:
        """The prompts in the serving text form (``conversation_text`` of a one-message request)."""
        return [prompt_text(p) for p in self.prompts]


def load_gsm8k_answers(data_dir: Path) -> AnswerData:
    """RouteLLM's GSM8K responses of both models, contaminated prompts dropped (file order kept)."""
    root = data_dir / "routellm" / "gsm8k"
    bad: set[str] = set()
    contaminated = root / "contaminated_prompts.jsonl"
    if contaminated.exists():
        with contaminated.open(encoding="utf-8") as fh:
            bad = {json.loads(line)["eval_prompt"] for line in fh if line.strip()}
    csv.field_size_limit(1 << 30)
    prompts, weak, strong, wg, sg = [], [], [], [], []
    with (root / "gsm8k_responses.csv").open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["prompt"] in bad:
                continue
            prompts.append(row["prompt"])
            weak.append(row[f"{WEAK}_response"])
            strong.append(row[f"{STRONG}_response"])
            wg.append(row[WEAK].strip().lower() in ("true", "1", "1.0"))
            sg.append(row[STRONG].strip().lower() in ("true", "1", "1.0"))
    return AnswerData(prompts, weak, strong, np.array(wg, dtype=int), np.array(sg, dtype=int))


@dataclass(frozen=True)
class AnswerFeatures:
    """Feature matrices of every prompt's weak and strong answer (rows aligned with :class:`AnswerData`)."""

    weak: np.ndarray
    strong: np.ndarray
    dim: int  # embedding columns come first
    encoder_id: str


def featurize(encoder: Any, data: AnswerData, progress: bool = True) -> AnswerFeatures:
    """Embed ``answer_text`` of every pair (cached on disk by ``evals.embeddings``) and add the checks."""
    texts = data.texts()
    out = []
    for answers in (data.weak_answers, data.strong_answers):
        pairs = list(zip(texts, answers, strict=True))
        emb = embed_texts(encoder, [answer_text(p, a) for p, a in pairs], progress=progress)
        out.append(answer_features(emb, pairs))
    return AnswerFeatures(out[0], out[1], int(encoder.dim), str(encoder.id))


def fit_answer_head(x: np.ndarray, y: np.ndarray, weight: np.ndarray, dim: int, cfg: HeadConfig, seed: int = 0) -> Head:
    """Fit one uncalibrated logistic-regression head; the embedding block (first ``dim`` columns) is scaled
    by ``cfg.emb_weight`` after standardisation (folded into the head's ``scale``)."""
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-8] = 1.0
    coef = np.zeros((1, x.shape[1]), dtype=np.float32)
    if not cfg.use_checks and cfg.emb_weight <= 0:
        raise ValueError("a head needs the embedding (emb_weight > 0) or the checks (use_checks)")
    first = 0 if cfg.emb_weight > 0 else dim
    cols = np.arange(first, x.shape[1] if cfg.use_checks else dim)
    if cfg.emb_weight > 0:
        scale[:dim] = scale[:dim] / cfg.emb_weight
    z = (x[:, cols] - mean[cols]) / scale[cols]
    model = LogisticRegression(C=cfg.C, max_iter=5000, random_state=seed).fit(z, y, sample_weight=weight)
    coef[0, cols] = model.coef_[0]
    return Head(
        kind="logreg",
        labels=LABELS,
        params={"mean": mean, "scale": scale, "coef": coef, "intercept": model.intercept_.astype(np.float64)},
        config={"n_classes": 2, "C": cfg.C, "emb_weight": cfg.emb_weight, "strong_weight": cfg.strong_weight},
    )


def training_rows(
    feats: AnswerFeatures, data: AnswerData, rows: np.ndarray, strong_weight: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels and sample weights of the weak answers of ``rows`` (boolean mask), plus the strong
    answers at ``strong_weight`` when it is positive."""
    xs, ys, ws = [feats.weak[rows]], [data.weak_good[rows]], [np.ones(int(rows.sum()))]
    if strong_weight > 0:
        xs.append(feats.strong[rows])
        ys.append(data.strong_good[rows])
        ws.append(np.full(int(rows.sum()), strong_weight))
    return np.vstack(xs), np.concatenate(ys), np.concatenate(ws)


@dataclass
class Selection:
    """The chosen configuration, every configuration's inner-CV AUC, and the chosen one's inner
    out-of-fold raw P(good) of the weak answers (NaN outside the training rows)."""

    config: HeadConfig
    inner_auc: dict[str, float]
    oof_weak: np.ndarray
    oof_strong: np.ndarray


def select_config(
    feats: AnswerFeatures,
    data: AnswerData,
    rows: np.ndarray,
    grid: Sequence[HeadConfig] = DEFAULT_GRID,
    seed: int = 0,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> Selection:
    """Inner CV over ``rows``: the configuration with the best mean AUC on the cheap model's answers."""
    inner = np.array([fold_of(p, INNER_FOLDS, INNER_SEED) for p in data.prompts])
    aucs: dict[str, float] = {}
    oofs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    loop: Iterable[HeadConfig] = grid if progress is None else progress(grid)
    for cfg in loop:
        ow, os_ = np.full(len(data), np.nan), np.full(len(data), np.nan)
        per = []
        for g in range(INNER_FOLDS):
            tr, te = rows & (inner != g), rows & (inner == g)
            x, y, w = training_rows(feats, data, tr, cfg.strong_weight)
            head = fit_answer_head(x, y, w, feats.dim, cfg, seed)
            ow[te] = head.raw_proba(feats.weak[te])[:, 1]
            os_[te] = head.raw_proba(feats.strong[te])[:, 1]
            per.append(roc_auc(data.weak_good[te], ow[te]))
        aucs[cfg.name] = float(np.nanmean(per))
        oofs[cfg.name] = (ow, os_)
    best = max(grid, key=lambda c: aucs[c.name])
    return Selection(best, aucs, *oofs[best.name])


def _platt(raw: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    p = np.clip(raw, 1e-7, 1 - 1e-7)
    lr = LogisticRegression(C=1e4, max_iter=1000).fit(np.log(p / (1 - p)).reshape(-1, 1), y)
    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    return {"method": "platt", "a": a, "b": b} if a > 0 else {"method": "none"}


@dataclass
class FittedHead:
    """A selected, fitted and calibrated head with its selection record."""

    head: Head
    selection: Selection


def fit_selected(
    feats: AnswerFeatures,
    data: AnswerData,
    rows: np.ndarray,
    grid: Sequence[HeadConfig] = DEFAULT_GRID,
    seed: int = 0,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> FittedHead:
    """Select by inner CV on ``rows``, refit the chosen configuration on all of ``rows``, calibrate (Platt)
    on its inner out-of-fold scores of the rows it trains on."""
    sel = select_config(feats, data, rows, grid, seed, progress)
    x, y, w = training_rows(feats, data, rows, sel.config.strong_weight)
    head = fit_answer_head(x, y, w, feats.dim, sel.config, seed)
    raw = [sel.oof_weak[rows]]
    ys = [data.weak_good[rows]]
    if sel.config.strong_weight > 0:
        raw.append(sel.oof_strong[rows])
        ys.append(data.strong_good[rows])
    head.calibration = _platt(np.concatenate(raw), np.concatenate(ys))
    return FittedHead(head, sel)


def outer_folds(data: AnswerData) -> np.ndarray:
    """The 5 outer folds by prompt hash (``fold_of(prompt, 5, 0)``)."""
    return np.array([fold_of(p, OUTER_FOLDS, FOLD_SEED) for p in data.prompts])


def cross_validate(
    feats: AnswerFeatures,
    data: AnswerData,
    grid: Sequence[HeadConfig] = DEFAULT_GRID,
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: Callable[[str], Callable[[Iterable[Any]], Iterable[Any]]] | None = None,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, list[FittedHead]]:
    """5-fold outer CV of the whole procedure (selection inside each fold): held-out AUCs, calibration and
    the out-of-fold calibrated P(good) of every weak and strong answer. ``progress(label)`` may return a
    wrapper (e.g. tqdm) for each fold's loop over the grid."""
    folds = outer_folds(data)
    ow, os_ = np.zeros(len(data)), np.zeros(len(data))
    fitted: list[FittedHead] = []
    per_fold = []
    for f in range(OUTER_FOLDS):
        fh = fit_selected(feats, data, folds != f, grid, seed, progress(f"fold {f} grid") if progress else None)
        te = folds == f
        ow[te] = fh.head.predict_proba(feats.weak[te])[:, 1]
        os_[te] = fh.head.predict_proba(feats.strong[te])[:, 1]
        per_fold.append(
            {
                "fold": f,
                "chosen": fh.selection.config.name,
                "weak_auc": round(roc_auc(data.weak_good[te], ow[te]), 4),
                "strong_auc": round(roc_auc(data.strong_good[te], os_[te]), 4),
                "prompts": int(te.sum()),
            }
        )
        fitted.append(fh)
        log(f"  fold {f}: {per_fold[-1]}")
    both_y = np.concatenate([data.weak_good, data.strong_good])
    both_p = np.concatenate([ow, os_])
    metrics = {
        "method": "5-fold CV by prompt hash; hyperparameters chosen by inner 4-fold CV inside each training fold",
        "per_fold": per_fold,
        "weak_auc_mean": round(float(np.mean([r["weak_auc"] for r in per_fold])), 4),
        "weak_auc_pooled": round(roc_auc(data.weak_good, ow), 4),
        "strong_auc_pooled": round(roc_auc(data.strong_good, os_), 4),
        "calibration_weak": {
            k: round(v, 4) for k, v in calibration_report(np.column_stack([1 - ow, ow]), data.weak_good).items()
        },
        "calibration_both": {
            k: round(v, 4) for k, v in calibration_report(np.column_stack([1 - both_p, both_p]), both_y).items()
        },
    }
    return metrics, ow, os_, fitted


def build(encoder_name: str, data_dir: Path, out_dir: Path, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Measure by outer CV, then fit on every prompt and write the artifact; returns its manifest."""
    from evals.train import created_at

    t0 = time.perf_counter()
    encoder = get_encoder(encoder_name)
    data = load_gsm8k_answers(data_dir)
    feats = featurize(encoder, data, progress=progress)
    print(f"[{encoder_name}] {len(data)} prompts x 2 answers; outer CV", flush=True)
    cv, _, _, _ = cross_validate(feats, data, seed=seed)
    print(f"[{encoder_name}] held-out weak-answer AUC {cv['weak_auc_mean']} (mean of folds); final fit", flush=True)
    rows = np.ones(len(data), dtype=bool)
    fh = fit_selected(feats, data, rows, seed=seed)
    head = fh.head
    cfg = fh.selection.config
    used = [*zip(data.prompts, data.weak_answers, data.weak_good.tolist(), strict=True)]
    if cfg.strong_weight > 0:
        used += [*zip(data.prompts, data.strong_answers, data.strong_good.tolist(), strict=True)]
    head.manifest = {
        "name": f"answer-confidence-{encoder_name}",
        "task": TASK,
        "description": "P(answer is good | prompt, answer): a cascade escalates to the strong model when it is low",
        "positive_label": "good",
        "label_definition": "the answer's final number matched GSM8K's reference (RouteLLM's correctness column)",
        "encoder": feats.encoder_id,
        "encoder_name": encoder_name,
        "feature_schema": {
            "text": f"classifiers.answer_confidence.answer_text(prompt, answer) (prompt <= {PROMPT_CHARS} chars, "
            f"answer <= {ANSWER_CHARS} chars); prompt = classifiers.conversation.conversation_text(body)",
            "embedding": {"encoder": feats.encoder_id, "dim": feats.dim, "normalised": True},
            "checks": list(CHECK_NAMES),
            "check_definitions": CHECKS,
            "order": "embedding then checks (classifiers.answer_confidence.answer_features)",
        },
        "data": {
            "sources": [SOURCE],
            "contaminated_prompts": "dropped (routellm/gsm8k/contaminated_prompts.jsonl)",
            "prompts": len(data),
            "rows": len(used),
            "models": {"weak": WEAK, "strong": STRONG},
            "train_sha256": records_hash([f"{p}\x00{a}" for p, a, _ in used], [y for _, _, y in used]),
            "routerbench": "not used",
        },
        "metrics": {
            "cv": cv,
            "selection": {
                "chosen": cfg.name,
                "criterion": "mean inner 4-fold CV AUC on the weak model's answers",
                "inner_auc": {k: round(v, 4) for k, v in fh.selection.inner_auc.items()},
            },
        },
        "created_at": created_at(),
    }
    path = head.save(out_dir / encoder_name)
    print(f"[{encoder_name}] chose {cfg.name}; wrote {path} in {time.perf_counter() - t0:.0f}s", flush=True)
    return head.manifest


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (``pointsman train-answer-confidence``)."""
    parser = argparse.ArgumentParser(
        prog="pointsman train-answer-confidence",
        description="Train the answer-confidence head (P(answer good | prompt, answer)) on RouteLLM's GSM8K "
        "responses and write it as manifest.json + weights.npz.",
    )
    parser.add_argument("--encoder", default="static", help="static | minilm | all (default static)")
    parser.add_argument("--data", help="data directory (default: POINTSMAN_DATA_DIR or ../shared/data)")
    parser.add_argument("--out", default=str(ARTIFACTS_DIR), help=f"output directory (default {ARTIFACTS_DIR})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    names = ["static", "minilm"] if args.encoder == "all" else [args.encoder]
    data_dir = resolve_data_dir(args.data)
    if not (data_dir / "routellm" / "gsm8k" / "gsm8k_responses.csv").exists():
        print(f"error: no routellm/gsm8k/gsm8k_responses.csv under {data_dir}", file=sys.stderr)
        return 2
    for name in names:
        manifest = build(name, data_dir, Path(args.out), args.seed, progress=not args.no_progress)
        cv = manifest["metrics"]["cv"]
        print(
            f"  {name}: held-out AUC on the weak model's answers {cv['weak_auc_mean']} "
            f"(per fold {[r['weak_auc'] for r in cv['per_fold']]}), chosen {manifest['metrics']['selection']['chosen']}"
        )
    return 0


__all__ = [
    "DEFAULT_GRID",
    "AnswerData",
    "AnswerFeatures",
    "FittedHead",
    "HeadConfig",
    "Selection",
    "build",
    "cross_validate",
    "featurize",
    "fit_answer_head",
    "fit_selected",
    "load_gsm8k_answers",
    "main",
    "outer_folds",
    "select_config",
    "training_rows",
]


if __name__ == "__main__":
    raise SystemExit(main())
