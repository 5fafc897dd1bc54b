"""The per-model quality head behind the ``quality`` signal of ``multi_model`` routes.

``pointsman train --quality routerbench [--encoders static] [--out ./routers]`` fits, for every model
of RouterBench-train, a logistic regression of "this model answered correctly" on the features every
head scores (embedding + cheap text statistics, :func:`classifiers.heads.build_features`), calibrates
each one (Platt) on the validation split and measures it on the test split (a 70/10/20 split of
RouterBench-*train* by prompt hash; rows where a model's outcome is missing are skipped for that
model). The result is one ``multilabel`` head, ``quality-routerbench-<encoder>/`` (manifest.json +
weights.npz, numpy-only at serving time), whose labels are the RouterBench model names.

RouterBench declares no licence: such a head is for the user's own deployment. It is never written
into the package's artifact directory, and its manifest says where it came from and that it must not
be redistributed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.heads.fit import fit_calibration, fit_multilabel
from classifiers.heads.head import Head
from classifiers.provider import DEFAULT_ROUTERS_DIR, QUALITY_ARTIFACT
from evals.data.split import DEFAULT_FRACTIONS, DEFAULT_SEED
from evals.dataset import MultiData, load_multi_data, records_hash
from evals.train import created_at, feature_schema

LICENSE = "none declared upstream: do not redistribute"
SOURCES: dict[str, dict[str, Any]] = {
    "routerbench": {
        "name": "RouterBench 0-shot train subset (ARC-Challenge, MBPP, Winogrande; 11 models, per-call costs)",
        "url": "https://github.com/shuhao02/RouterDC",
        "commit": "0e63989c5bf4363330b8a4616386e3f7f116d9f8",
        "path": "datasets/routerbench_zs/*_train.csv",
        "upstream": "https://huggingface.co/datasets/withmartian/routerbench",
        "license": LICENSE,
    }
}
#: Where ``pointsman train --quality`` writes by default (relative to the working directory; gitignored).
DEFAULT_QUALITY_OUT = Path("routers")
# Strong regularisation wins on ~1,600 training prompts (static encoder, validation AUC 0.65 at
# C <= 0.003, 0.63 at 0.01, 0.60 at 0.1); smaller C also fits faster.
C_GRID: tuple[float, ...] = (0.0003, 0.001, 0.003, 0.01)
LAMBDAS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)

Log = Callable[[str], None]


def refuse_shipped_dir(out_dir: Path, shipped: Path = DEFAULT_ROUTERS_DIR) -> None:
    """Raise ``ValueError`` when ``out_dir`` is (inside) the package's shipped artifact directory."""
    out, root = Path(out_dir).resolve(), Path(shipped).resolve()
    if out == root or root in out.parents:
        raise ValueError(
            f"--out {out_dir} is the shipped artifact directory {shipped}: a quality head trained on "
            f"RouterBench ({LICENSE}) must not go into the package. Write it elsewhere "
            f"(default ./{DEFAULT_QUALITY_OUT}) and point classifiers.routers_dir at that directory."
        )


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve (NaN when ``y`` has one class only)."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y, dtype=bool)
    if y.all() or not y.any():
        return float("nan")
    return float(roc_auc_score(y, score))


def _mean_auc(head: Head, x: np.ndarray, quality: np.ndarray) -> float:
    proba = head.predict_proba(x)
    aucs = []
    for j in range(quality.shape[1]):
        known = ~np.isnan(quality[:, j])
        aucs.append(roc_auc(quality[known, j] > 0.5, proba[known, j]))
    return float(np.nanmean(aucs))


def per_model_metrics(proba: np.ndarray, quality: np.ndarray, models: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Held-out AUC, accuracy (at 0.5), Brier score and the majority-class accuracy, per model."""
    out: dict[str, dict[str, Any]] = {}
    for j, model in enumerate(models):
        known = ~np.isnan(quality[:, j])
        y, p = quality[known, j] > 0.5, proba[known, j]
        base = float(y.mean()) if len(y) else float("nan")
        out[model] = {
            "auc": round(roc_auc(y, p), 4),
            "accuracy": round(float(np.mean((p >= 0.5) == y)), 4),
            "majority_accuracy": round(max(base, 1 - base), 4),
            "brier": round(float(np.mean((p - y) ** 2)), 4),
            "mean_predicted": round(float(p.mean()), 4),
            "base_rate": round(base, 4),
            "n": int(known.sum()),
        }
    return out


def policy_metrics(
    pred: np.ndarray,
    quality: np.ndarray,
    cost: np.ndarray,
    price: np.ndarray,
    models: Sequence[str],
    lambdas: Sequence[float] = LAMBDAS,
) -> dict[str, Any]:
    """Replay ``multi_model``'s rule (argmax of predicted quality - λ · price / max price) on complete rows.

    ``price`` is each model's mean cost per call on the train rows, standing in for the configured
    per-token prices the gateway normalises the same way. Returns mean true quality and cost per λ, the
    share of calls per model, the best single model costing no more (``best_single_at_cost``), each
    single model, and the oracle (the cheapest model that answered well).
    """
    norm = price / price.max()
    rows = np.arange(len(pred))
    single_quality, single_cost = quality.mean(axis=0), cost.mean(axis=0)
    at: dict[str, Any] = {}
    for lam in lambdas:
        pick = np.argmax(pred - lam * norm, axis=1)
        counts = np.bincount(pick, minlength=len(models))
        mean_cost = float(cost[rows, pick].mean())
        affordable = np.flatnonzero(single_cost <= mean_cost)
        best_single = affordable[np.argmax(single_quality[affordable])] if len(affordable) else None
        at[f"{lam:g}"] = {
            "quality": round(float(quality[rows, pick].mean()), 4),
            "cost_usd": float(f"{mean_cost:.4g}"),
            "best_single_at_cost": None if best_single is None else {
                "model": models[best_single], "quality": round(float(single_quality[best_single]), 4)
            },
            "calls": {models[j]: round(float(c / len(pick)), 3) for j, c in enumerate(counts) if c},
        }
    singles = {
        m: {"quality": round(float(quality[:, j].mean()), 4), "cost_usd": float(f"{cost[:, j].mean():.4g}")}
        for j, m in enumerate(models)
    }
    # Oracle: the cheapest model that answered well, else the cheapest model.
    correct_cost = np.where(quality > 0.5, cost, np.inf)
    best = np.where(np.isfinite(correct_cost.min(axis=1)), correct_cost.argmin(axis=1), cost.argmin(axis=1))
    return {
        "rule": "argmax_m predicted_quality[m] - lambda * mean_train_cost[m] / max_m mean_train_cost",
        "rows": len(pred),
        "at_lambda": at,
        "single_models": singles,
        "oracle": {
            "quality": round(float(quality[rows, best].mean()), 4),
            "cost_usd": float(f"{cost[rows, best].mean():.4g}"),
        },
    }


def train_quality(
    data: MultiData,
    seed: int = 0,
    *,
    c_grid: Sequence[float] = C_GRID,
    lambdas: Sequence[float] = LAMBDAS,
    progress: bool = True,
    log: Log = print,
) -> Head:
    """Fit on train (C chosen by mean validation AUC), calibrate on validation, measure on test."""
    from tqdm import tqdm

    train, val, test = data.mask("train"), data.mask("val"), data.mask("test")
    x, q, models = data.features, data.quality, data.models
    best: tuple[float, Head, float] | None = None
    tried: dict[str, float] = {}
    for c in c_grid:
        t0 = time.perf_counter()
        bar = tqdm(range(len(models)), desc=f"quality heads C={c:g}", unit="model", disable=not progress)
        head = fit_multilabel(x[train], q[train], models, C=c, seed=seed, progress=bar)
        auc = _mean_auc(head, x[val], q[val])
        tried[f"C={c:g}"] = round(auc, 4)
        log(f"  C={c:g}: mean validation AUC {auc:.3f} ({time.perf_counter() - t0:.1f}s)")
        if best is None or auc > best[0]:
            best = (auc, head, c)
    assert best is not None, "empty C grid"
    head, chosen_c = best[1], best[2]
    fit_calibration(head, x[val], q[val])
    proba = head.predict_proba(x[test])
    per_model = per_model_metrics(proba, q[test], models)
    price = np.nanmean(data.cost[train], axis=0)
    complete = ~np.isnan(q[test]).any(axis=1)
    policy = policy_metrics(proba[complete], q[test][complete], data.cost[test][complete], price, models, lambdas)
    test_aucs = [m["auc"] for m in per_model.values()]
    metrics = {
        "selection": "C of the per-model logistic regressions by mean validation AUC; test untouched",
        "validation_mean_auc": tried,
        "chosen_C": chosen_c,
        "test_mean_auc": round(float(np.nanmean(test_aucs)), 4),
        "test_per_model": per_model,
        "test_policy": policy,
    }
    log(f"  chosen C={chosen_c:g}: mean test AUC {metrics['test_mean_auc']:.3f}")
    idx = np.flatnonzero(train)
    head.manifest = {
        "name": QUALITY_ARTIFACT.format(source="routerbench", encoder=_encoder_name(data.encoder_id)),
        "task": "quality",
        "signal": "quality",
        "description": "P(the model answers this conversation well), per model: RouterBench 0/1 quality",
        "label_definition": (
            "label = a RouterBench model; positive = its 0/1 quality cell is 1; "
            "rows where that model's cell is empty are skipped for that model"
        ),
        "license": LICENSE,
        "redistributable": False,
        "encoder": data.encoder_id,
        "feature_schema": feature_schema(data.encoder_id, int(data.embeddings.shape[1]), cheap=True),
        "data": {
            "sources": [SOURCES["routerbench"]],
            "license": LICENSE,
            "datasets": sorted(set(data.task.tolist())),
            "split": {"by": "sha256(seed, prompt)", "seed": DEFAULT_SEED, "fractions": list(DEFAULT_FRACTIONS),
                      "note": "a split of RouterBench-train; RouterBench's own test split is not used"},
            "rows": {sp: int(data.mask(sp).sum()) for sp in ("train", "val", "test")},
            "known_train_rows_per_model": {
                m: int((~np.isnan(q[train, j])).sum()) for j, m in enumerate(models)
            },
            "train_sha256": records_hash(
                [data.records[i].prompt for i in idx], [tuple(float(v) for v in q[i]) for i in idx]
            ),
        },
        "model_costs": {
            "unit": "USD per call, mean over the train rows (usable as multi_model.costs)",
            "values": {m: float(f"{c:.4g}") for m, c in zip(models, price, strict=True)},
        },
        "metrics": metrics,
        "created_at": created_at(),
    }
    return head


def build_quality(
    data_dir: Path,
    encoders: Sequence[str],
    out_dir: Path,
    seed: int,
    *,
    c_grid: Sequence[float] = C_GRID,
    progress: bool = True,
    log: Log = print,
) -> dict[str, Any]:
    """Train and write ``quality-routerbench-<encoder>`` for each encoder; returns metrics by artifact path."""
    from evals.embeddings import get_encoder

    refuse_shipped_dir(out_dir)
    report: dict[str, Any] = {}
    for name in encoders:
        t0 = time.perf_counter()
        log(f"[{name}] loading encoder and embedding the RouterBench-train prompts")
        data = load_multi_data(data_dir, get_encoder(name), DEFAULT_SEED, progress=progress)
        log(f"[{name}] quality head: {len(data.models)} models, {len(data.records)} prompts")
        head = train_quality(data, seed, c_grid=c_grid, progress=progress, log=log)
        path = head.save(out_dir / QUALITY_ARTIFACT.format(source="routerbench", encoder=name))
        report[str(path)] = head.manifest["metrics"]
        log(f"[{name}] wrote {path} in {time.perf_counter() - t0:.0f}s")
    return report


def summary(metrics: dict[str, Any]) -> list[str]:
    """Human-readable lines of one artifact's held-out metrics."""
    lines = [f"  {'model':36s} {'AUC':>6s} {'acc':>6s} {'majority':>8s}"]
    for model, m in metrics["test_per_model"].items():
        lines.append(f"  {model:36s} {m['auc']:6.3f} {m['accuracy']:6.3f} {m['majority_accuracy']:8.3f}")
    policy = metrics["test_policy"]
    lines.append(f"  multi_model policy on {policy['rows']} complete test prompts:")
    for lam, point in policy["at_lambda"].items():
        single = point["best_single_at_cost"]
        versus = f" (best single model at that cost: {single['model']} {single['quality']:.3f})" if single else ""
        lines.append(
            f"    lambda {lam:>5s}: quality {point['quality']:.3f}, cost ${point['cost_usd']:.6f}/prompt{versus}"
        )
    oracle = policy["oracle"]
    lines.append(f"    oracle      : quality {oracle['quality']:.3f}, cost ${oracle['cost_usd']:.6f}/prompt")
    return lines


def _encoder_name(encoder_id: str) -> str:
    return "static" if encoder_id.startswith("minilm-static") else "minilm"

