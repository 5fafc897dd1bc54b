"""Build the default router artifacts reproducibly: ``python -m evals.train`` (wired to ``pointsman train``).

For each encoder ("minilm", "static") it writes into ``classifiers/artifacts/routers/``:
- ``difficulty-gpt4-mixtral-<encoder>/``: P(strong model needed) for GPT-4-1106 vs Mixtral-8x7B.
- ``domain-<encoder>/``: task/domain (math, code, reasoning, knowledge, writing, chat, extraction).

Only RouteLLM data is used (vendorable, Apache-2.0); RouterBench never goes into a shipped artifact.
Fixed seeds, a split by prompt hash (70/10/20 train/validation/test), contaminated prompts dropped.
Embeddings are cached under ``.cache/embeddings/`` so a re-run only refits the heads.

``--quality routerbench`` instead trains the per-model quality head for ``multi_model`` routes
(:mod:`evals.quality`) into ``--out`` (default ``./routers``; the shipped directory is refused because
RouterBench declares no licence).

``--data bundled | logs:STORE_URL | file:PATH | DIR`` (repeatable) with ``--out REGISTRY`` trains from
labelled requests into a new version of a router registry instead (:mod:`evals.retrain`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.heads.features import CHEAP_FEATURE_NAMES, build_features
from classifiers.heads.fit import calibration_report, fit_calibration, fit_head
from classifiers.heads.head import Head
from evals.data import DOMAINS, STRONG, WEAK, resolve_data_dir, split_of
from evals.data.paths import REPO_ROOT
from evals.data.routellm import MT_BENCH_MARGIN
from evals.data.split import DEFAULT_FRACTIONS, DEFAULT_SEED
from evals.dataset import PairData, load_pair_data, records_hash
from evals.difficulty import (
    DEFAULT_CANDIDATES,
    Candidate,
    apgr_by_dataset,
    cross_validated_scores,
    features_of,
    fit_candidate,
)
from evals.embeddings import embed_prompts, get_encoder, prompt_text
from evals.holdout import holdout_fraction
from evals.trained_rows import write_bundled_trained_rows

ROUTERS_DIR = REPO_ROOT / "classifiers" / "artifacts" / "routers"
ENCODERS = ("minilm", "static")
SOURCES = [
    {
        "name": "RouteLLM evaluation data (MMLU, GSM8K, MT-bench; GPT-4-1106 vs Mixtral-8x7B)",
        "url": "https://github.com/lm-sys/RouteLLM",
        "commit": "0b64fdafe049e596a3f5657c219329f24af24198",
        "path": "routellm/evals/",
        "license": "Apache-2.0",
    }
]


def created_at() -> str:
    """UTC timestamp for an artifact manifest (``$SOURCE_DATE_EPOCH`` when set)."""
    # SOURCE_DATE_EPOCH pins the timestamp for byte-identical rebuilds.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.fromtimestamp(int(epoch), UTC) if epoch else datetime.now(UTC)
    return when.replace(microsecond=0).isoformat()


def feature_schema(encoder_id: str, dim: int, cheap: bool) -> dict[str, Any]:
    """The manifest's description of the feature vector a head scores (serving rebuilds it from this)."""
    return {
        "text": "classifiers.conversation.conversation_text(body, max_chars=2000)",
        "embedding": {"encoder": encoder_id, "dim": dim, "normalised": True},
        "cheap": list(CHEAP_FEATURE_NAMES) if cheap else [],
        "order": "embedding then cheap (classifiers.heads.build_features)",
    }


def _split_counts(data: PairData) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for ds in ("mmlu", "gsm8k", "mt_bench"):
        out[ds] = {sp: int(data.mask(sp, ds).sum()) for sp in ("train", "val", "test")}
    return out


def select_difficulty(
    data: PairData, candidates: Sequence[Candidate], seed: int, log: Any = print
) -> tuple[Candidate, dict[str, dict[str, float]]]:
    """Pick the candidate with the best mean cross-validated APGR on MMLU and GSM8K (train+val only)."""
    rows = data.split != "test"
    results: dict[str, dict[str, float]] = {}
    best: tuple[float, Candidate] | None = None
    for cand in candidates:
        t0 = time.perf_counter()
        oof = cross_validated_scores(cand, data, rows, seed)
        per = apgr_by_dataset(oof, data, rows)
        mean = float(np.mean([per["mmlu"], per["gsm8k"]]))
        results[cand.name] = {**{f"cv_apgr_{k}": round(v, 4) for k, v in per.items()}, "cv_apgr_mean": round(mean, 4)}
        log(
            f"  {cand.name:34s} cv APGR mmlu {per['mmlu']:.3f} gsm8k {per['gsm8k']:.3f}"
            f" ({time.perf_counter() - t0:.0f}s)"
        )
        if cand.exportable and cand.kind != "knn" and (best is None or mean > best[0]):
            best = (mean, cand)
    assert best is not None, "no exportable candidate"
    return best[1], results


def train_difficulty(
    data: PairData, dim: int, seed: int, candidates: Sequence[Candidate], log: Any = print
) -> tuple[Head, dict[str, Any]]:
    """Select, fit on train, calibrate on validation, and measure on test."""
    chosen, cv = select_difficulty(data, candidates, seed, log)
    train, val, test = data.mask("train"), data.mask("val"), data.mask("test")
    fitted = fit_candidate(chosen, data, train, seed)
    head = fitted.head
    assert head is not None
    x = features_of(data, chosen)
    calib = fit_calibration(head, x[val], data.needed[val])
    proba_test = head.predict_proba(x[test])
    metrics = {
        "selection": "5-fold CV APGR (mean of MMLU and GSM8K) on train+val; test untouched",
        "candidates": cv,
        "chosen": chosen.name,
        "test_apgr": {k: round(v, 4) for k, v in apgr_by_dataset(proba_test[:, 1], data, test).items()},
        "test_calibration": {k: round(v, 4) for k, v in calibration_report(proba_test, data.needed[test]).items()},
        "val_apgr": {k: round(v, 4) for k, v in apgr_by_dataset(head.predict_proba(x[val])[:, 1], data, val).items()},
        "cv_all_apgr": cv_all_prompts(chosen, data, seed),
    }
    log(f"  chosen {chosen.name}: test APGR {metrics['test_apgr']}, calibration {calib}")
    log(f"  5-fold CV APGR over all prompts: {metrics['cv_all_apgr']}")
    head.manifest = {
        "name": f"difficulty-gpt4-mixtral-{data.encoder_id}",
        "task": "difficulty",
        "description": "P(strong model needed) for GPT-4-1106 (strong) vs Mixtral-8x7B (weak)",
        "model_pair": {"strong": STRONG, "weak": WEAK},
        "positive_label": "strong_needed",
        "label_definition": (
            "MMLU/GSM8K: strong correct and weak wrong; MT-bench: mean strong judge score exceeds the weak "
            f"one by >= {MT_BENCH_MARGIN} (ridge candidates regress the gain strong - weak instead)"
        ),
        "encoder": data.encoder_id,
        "feature_schema": feature_schema(data.encoder_id, dim, chosen.features == "emb+cheap"),
        "data": _data_block(data, train, chosen),
        "metrics": metrics,
        "created_at": created_at(),
    }
    return head, metrics


def cv_all_prompts(cand: Candidate, data: PairData, seed: int, resamples: int = 1000) -> dict[str, Any]:
    """The in-distribution figure: 5-fold cross-validated APGR over *all* prompts (every split), per
    data set, with a bootstrap 95% CI over prompts.

    The single 20% test split is too small to resolve differences of a few hundredths; every prompt
    scored once by a model that did not see it is five times the evidence. ``cand`` was chosen by CV
    on train+val, so the figure carries a little selection optimism (said in the manifest).
    """
    from evals.retrain import bootstrap_apgr

    rows = np.ones(len(data.records), dtype=bool)
    oof = cross_validated_scores(cand, data, rows, seed)
    out: dict[str, Any] = {"method": "5-fold CV over every split (folds by prompt hash), bootstrap 95% CI; "
                           "the candidate was selected by CV on train+val"}
    for name in ("mmlu", "gsm8k"):
        m = data.dataset == name
        apgr = apgr_by_dataset(oof, data, rows, datasets=(name,)).get(name)
        if apgr is None:
            continue
        lo, hi = bootstrap_apgr(oof[m], data.strong[m], data.weak[m], resamples=resamples, seed=seed)
        out[name] = {"apgr": round(apgr, 4), "ci95": [round(lo, 4), round(hi, 4)], "prompts": int(m.sum())}
    return out


def _data_block(data: PairData, train: np.ndarray, chosen: Candidate | None) -> dict[str, Any]:
    idx = np.flatnonzero(train)
    return {
        "sources": SOURCES,
        "datasets": ["mmlu", "gsm8k", "mt_bench"],
        "contaminated_prompts": "dropped (routellm/*/contaminated_prompts.jsonl)",
        "split": {"by": "sha256(seed, prompt)", "seed": DEFAULT_SEED, "fractions": list(DEFAULT_FRACTIONS)},
        "rows": _split_counts(data),
        "train_sha256": records_hash([data.records[i].prompt for i in idx], [int(data.needed[i]) for i in idx]),
    }


def train_domain(data: PairData, encoder: Any, seed: int, log: Any = print) -> tuple[Head, dict[str, Any]]:
    """Multiclass domain head (logistic regression, class-balanced weights, temperature-calibrated).

    MT-bench contributes both turns of each question (same split as its first turn) because its
    categories are the only source of writing/chat/extraction examples.
    """
    texts, labels, splits = [], [], []
    for r in data.records:
        sp = split_of(r.prompt, DEFAULT_SEED)
        for t in r.turns or (r.prompt,):
            texts.append(t)
            labels.append(DOMAINS.index(r.domain))
            splits.append(sp)
    y, sp_arr = np.array(labels), np.array(splits)
    emb = embed_prompts(encoder, texts)
    x = build_features(emb, [prompt_text(t) for t in texts])
    train, val, test = sp_arr == "train", sp_arr == "val", sp_arr == "test"
    counts = np.bincount(y[train], minlength=len(DOMAINS)).astype(float)
    weights = (len(y[train]) / (len(DOMAINS) * np.maximum(counts, 1)))[y[train]]
    best: tuple[float, Head, float] | None = None
    tried = {}
    for c in (0.1, 1.0):
        head, _ = fit_head("logreg", x[train], y[train], DOMAINS, seed=seed, C=c, sample_weight=weights)
        pred = head.raw_proba(x[val]).argmax(axis=1)
        bal = float(np.mean([np.mean(pred[y[val] == k] == k) for k in range(len(DOMAINS)) if (y[val] == k).any()]))
        tried[f"logreg(C={c})"] = round(bal, 4)
        log(f"  domain logreg C={c}: val balanced accuracy {bal:.3f}")
        if best is None or bal > best[0]:
            best = (bal, head, c)
    assert best is not None
    head = best[1]
    fit_calibration(head, x[val], y[val])
    proba = head.predict_proba(x[test])
    pred = proba.argmax(axis=1)
    per_class = {
        DOMAINS[k]: round(float(np.mean(pred[y[test] == k] == k)), 4)
        for k in range(len(DOMAINS))
        if (y[test] == k).any()
    }
    metrics = {
        "val_balanced_accuracy": tried,
        "test_accuracy": round(float(np.mean(pred == y[test])), 4),
        "test_recall_per_class": per_class,
        "test_calibration": {k: round(v, 4) for k, v in calibration_report(proba, y[test]).items()},
        "train_counts": {DOMAINS[k]: int(counts[k]) for k in range(len(DOMAINS))},
    }
    log(f"  domain: test accuracy {metrics['test_accuracy']}, recall {per_class}")
    head.manifest = {
        "name": f"domain-{data.encoder_id}",
        "task": "domain",
        "description": "task/domain of the conversation",
        "label_definition": "evals/data/domains.py: MMLU subjects, GSM8K -> math, MT-bench categories",
        "encoder": data.encoder_id,
        "feature_schema": feature_schema(data.encoder_id, emb.shape[1], True),
        "data": {
            "sources": SOURCES,
            "datasets": ["mmlu", "gsm8k", "mt_bench"],
            "contaminated_prompts": "dropped",
            "split": {"by": "sha256(seed, prompt)", "seed": DEFAULT_SEED, "fractions": list(DEFAULT_FRACTIONS)},
            "train_sha256": records_hash([t for t, m in zip(texts, train, strict=True) if m], list(y[train])),
        },
        "metrics": metrics,
        "created_at": created_at(),
    }
    return head, metrics


def build(
    data_dir: Path, encoders: Sequence[str], out_dir: Path, seed: int, candidates: Sequence[Candidate]
) -> dict[str, Any]:
    """Train and write every default artifact; returns the metrics per artifact."""
    report: dict[str, Any] = {}
    for name in encoders:
        t0 = time.perf_counter()
        print(f"[{name}] loading encoder and embedding the RouteLLM prompts", flush=True)
        encoder = get_encoder(name)
        # The split seed is fixed (DEFAULT_SEED): ``seed`` only seeds the models and the CV folds.
        data = load_pair_data(data_dir, encoder, DEFAULT_SEED)
        print(f"[{name}] difficulty head: model selection", flush=True)
        head, metrics = train_difficulty(data, encoder.dim, seed, candidates)
        path = head.save(out_dir / f"difficulty-gpt4-mixtral-{name}")
        report[path.name] = metrics
        print(f"[{name}] domain head", flush=True)
        dhead, dmetrics = train_domain(data, encoder, seed)
        dpath = dhead.save(out_dir / f"domain-{name}")
        report[dpath.name] = dmetrics
        print(f"[{name}] wrote {path} and {dpath} in {time.perf_counter() - t0:.0f}s", flush=True)
    # Which prompts these heads learnt from: pointsman eval leaves them out of --data bundled.
    write_bundled_trained_rows(out_dir, data_dir)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="pointsman train",
        description="Train router heads: from labelled requests (--data bundled|logs:URL|file:PATH|DIR) into a new "
        "version of a router registry (--out REGISTRY), or rebuild the shipped router artifacts (no --data, or "
        "one shared data directory).",
    )
    parser.add_argument(
        "--data",
        action="append",
        metavar="SRC",
        help="training data, repeatable: bundled | logs:STORE_URL | file:PATH (JSONL or CSV) | DIR. "
        "Without --data, or with one shared data directory (DIR/routellm), the shipped router artifacts "
        "are rebuilt from it (default: $POINTSMAN_DATA_DIR or <repo>/../shared/data)",
    )
    parser.add_argument("--encoders", default=None, help="comma-separated: minilm,static (default both; "
                        "with labelled --data: static)")
    parser.add_argument(
        "--out",
        help="labelled --data: the router registry to add a version to (created when new); otherwise the "
        "artifact directory (default: the shipped classifiers/artifacts/routers/; with --quality ./routers)",
    )
    parser.add_argument("--seed", type=seed_value, default=0,
                        help=f"model seed, 0 to {MAX_SEED} (the split seed is fixed)")
    parser.add_argument("--strong", help="labelled --data: the pair's strong model (default: higher mean quality)")
    parser.add_argument("--weak", help="labelled --data: the pair's weak model")
    parser.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="labelled --data: use the RouteLLM sample shipped in the package (3,000 prompts, GPT-4 vs "
        "Mixtral) as a prior at reduced weight (for any pair); default: on (+0.03-0.05 APGR at 50-800 "
        "labelled requests on out-of-distribution traffic, bench/adaptation.py); --no-warm-start: off",
    )
    parser.add_argument("--prior-weight", type=float, metavar="W",
                        help="with --warm-start: the prior's total weight relative to the new data's")
    parser.add_argument("--folds", type=int, default=5, help="labelled --data: cross-validation folds (default 5)")
    parser.add_argument(
        "--quality",
        choices=("routerbench",),
        help="train only the per-model quality head (signal 'quality' for multi_model routes) from "
        "<data>/routerbench-train into --out/quality-routerbench-<encoder>/; for your own deployment only: "
        "RouterBench declares no licence, so the shipped artifact directory is refused",
    )
    parser.add_argument(
        "--holdout", type=holdout_fraction, metavar="FRACTION",
        help="labelled --data: keep this fraction of the requests (by a hash of each prompt) out of training, "
        "for pointsman promote --holdout FRACTION on the same sources",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    labelled = _labelled_mode(args)
    default_encoders = "static" if labelled else ",".join(ENCODERS)
    encoders = [e.strip() for e in (args.encoders or default_encoders).split(",") if e.strip()]
    unknown = [e for e in encoders if e not in ENCODERS]
    if unknown:
        parser.error(f"unknown encoder(s) {unknown}; expected {ENCODERS}")
    if labelled:
        if args.quality:
            parser.error("--quality reads <data>/routerbench-train; it does not combine with labelled --data")
        if not args.out:
            parser.error("labelled --data needs --out REGISTRY_DIR (the router registry to add a version to)")
        if args.folds < 2:
            parser.error("--folds must be at least 2")
        if args.prior_weight is not None and (args.prior_weight < 0 or args.warm_start is False):
            parser.error("--prior-weight needs the warm start (not --no-warm-start) and a value >= 0")
        return _train_labelled(args, encoders, list(argv) if argv is not None else sys.argv[1:])
    if args.data and not Path(args.data[0]).expanduser().exists():  # not a data directory: a mistyped path
        from evals.labelled import missing_source

        print(f"pointsman train: {missing_source(args.data[0])}", file=sys.stderr)
        return 2
    data_dir = resolve_data_dir(args.data[0] if args.data else None)
    if args.quality:
        return _train_quality(data_dir, encoders, args.out, args.seed, progress=not args.no_progress)
    if not (data_dir / "routellm").is_dir():
        print(f"error: no routellm/ under {data_dir} (use --data or POINTSMAN_DATA_DIR)", file=sys.stderr)
        return 2
    build(data_dir, encoders, Path(args.out or ROUTERS_DIR), args.seed, DEFAULT_CANDIDATES)
    return 0


#: The largest ``--seed``: numpy's and scikit-learn's seeds are unsigned 32-bit integers.
MAX_SEED = 2**32 - 1


def seed_value(value: str) -> int:
    """``--seed``'s argparse type: an integer from 0 to :data:`MAX_SEED`, refused while parsing (before any
    data is loaded) rather than by the first fit that uses it."""
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{value!r}: give an integer from 0 to {MAX_SEED}")
    return seed


def _labelled_mode(args: argparse.Namespace) -> bool:
    """Whether to train a registry version from labelled data rather than rebuild the shipped artifacts.

    Today's calls keep today's behaviour: no --data, or one shared data directory (with routellm/),
    and no registry to write into. Anything naming labelled data (bundled, logs:, file:, a labelled
    file or a directory of them, several sources), a pair, a warm start or an existing registry as
    --out trains a registry version.
    """
    from classifiers.registry import is_registry
    from evals.labelled import is_source_spec

    sources = args.data or []
    return (
        len(sources) > 1
        or any(is_source_spec(s) for s in sources)
        or bool(args.strong or args.weak or args.warm_start is not None or args.prior_weight is not None)
        or args.holdout is not None
        or (bool(args.out) and is_registry(args.out))
    )


def _train_labelled(args: argparse.Namespace, encoders: list[str], argv: list[str]) -> int:
    from evals.labelled import DataError
    from evals.retrain import TrainError, TrainOptions, labelled_count, train_registry_version, with_interval

    sources = args.data or ["bundled"]
    opts = TrainOptions(
        sources=sources,
        encoders=encoders,
        out=Path(args.out),
        strong=args.strong,
        weak=args.weak,
        warm_start=args.warm_start,
        prior_weight=args.prior_weight,
        seed=args.seed,
        folds=args.folds,
        progress=not args.no_progress,
        argv=argv,
        holdout=args.holdout,
    )
    try:
        result = train_registry_version(opts)
    except (DataError, TrainError, ValueError) as exc:  # RegistryError too: a ValueError naming its file
        print(f"pointsman train: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a data file or the registry the checks up front could not foresee (disk full)
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"pointsman train: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # train_registry_version removed its staging directory (and a registry it had created): the
        # registry is as it was, so one line says so instead of a traceback.
        print(f"pointsman train: interrupted; nothing was written to {args.out}", file=sys.stderr)
        return 130
    print(f"wrote router version {result.version} into {result.registry}")
    for pair in result.pairs:
        m = pair.metrics
        lo, hi = m["cv_apgr_ci95"]
        rlo, rhi = m["random_apgr_band95"]
        print(
            f"  {pair.strong} (strong) vs {pair.weak} (weak) [{pair.encoder}]: {m['folds']}-fold CV APGR "
            f"{with_interval(m['cv_apgr'], (lo, hi))} over {labelled_count(m['prompts'], m['rows'])} "
            f"; a random router: {_fmt(rlo)} to {_fmt(rhi)}"
        )
        # PGR divides by the pair's mean quality gap: near zero, APGR swings wildly and means nothing.
        warning = pair.gap.warning()
        if warning:
            print(f"    note: {warning}")
    for name, q in result.info["metrics"]["quality"].items():
        print(f"  quality head [{name}]: {q['artifact']}, CV mean AUC {_fmt(q['cv_mean_auc'])}")
    if result.active:
        print(f"{result.version} is the registry's active version (its first). Serve it with "
              f"classifiers: {{routers_dir: {result.registry}}}")
    else:
        held = (
            " ".join(f"--data {d['source']}" for d in result.info["data"]) + f" --holdout {args.holdout:g}"
            if args.holdout is not None else "--data HELDOUT"
        )
        print(
            f"{result.version} is not active (active: {result.info['parent']}). Compare and promote it with:\n"
            f"  pointsman promote {result.version} --registry {result.registry} {held}"
        )
    return 0


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _train_quality(data_dir: Path, encoders: Sequence[str], out: str | None, seed: int, progress: bool) -> int:
    from evals.quality import DEFAULT_QUALITY_OUT, LICENSE, build_quality, refuse_shipped_dir, summary

    out_dir = Path(out) if out else DEFAULT_QUALITY_OUT
    try:
        refuse_shipped_dir(out_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not (data_dir / "routerbench-train").is_dir():
        print(f"error: no routerbench-train/ under {data_dir} (use --data or POINTSMAN_DATA_DIR)", file=sys.stderr)
        return 2
    report = build_quality(data_dir, encoders, out_dir, seed, progress=progress)
    for path, metrics in report.items():
        print(f"{path} (held-out test split):", *summary(metrics), sep="\n")
    print(
        f"Serve it: set classifiers.routers_dir: {out_dir} and give the multi_model route "
        "quality_models: {<your model>: <RouterBench model>} for candidates named differently.\n"
        f"Licence of the training data: {LICENSE}. Keep the artifact out of anything you distribute."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
