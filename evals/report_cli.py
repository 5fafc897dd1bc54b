"""``pointsman eval``: replay a route's policy over labelled requests and report it against baselines.

    pointsman eval --config FILE --route auto --data SOURCE [--data SOURCE ...] [--out DIR]
                   [--strong MODEL --weak MODEL] [--routers-dir DIR] [--bootstrap N] [--seed S]

Sources as in ``pointsman train`` (:func:`evals.labelled.load_source`): ``bundled``, ``logs:STORE_URL``,
``file:PATH`` or a directory. No backend is called: the route decides every request offline with the
gateway's own decision code (:mod:`evals.replay`), and the report (:mod:`evals.report`) is written as
JSON, Markdown, HTML and PNG plots into ``--out`` (default ``./pointsman-eval``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("pointsman.eval")


def build_parser() -> argparse.ArgumentParser:
    """The ``pointsman eval`` arguments."""
    p = argparse.ArgumentParser(
        prog="pointsman eval",
        description="Replay a route's policy over labelled requests (no backend is called) and report APGR, "
                    "CPT, the cost-quality frontier, AIQ and calibration next to random, always-weak, "
                    "always-strong, oracle and kNN baselines, with bootstrap confidence intervals.",
    )
    p.add_argument("--config", required=True, help="the gateway config file (its routes and classifiers)")
    p.add_argument("--route", default="auto", help="the route to replay (default auto)")
    p.add_argument("--data", action="append", required=True, metavar="SOURCE",
                   help="bundled | logs:STORE_URL | file:PATH | DIR (repeatable: the sources are concatenated)")
    p.add_argument("--out", default="pointsman-eval", help="report directory (default ./pointsman-eval)")
    p.add_argument("--strong", help="the strong model's name in the data (default: the route's cost_quality "
                                    "strong model, through difficulty_models when set)")
    p.add_argument("--weak", help="the weak model's name in the data (default: as --strong)")
    p.add_argument("--routers-dir", help="router artifacts to replay with instead of classifiers.routers_dir "
                                         "(a registry, a registry version directory or a plain directory)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the resamples, folds and random baseline")
    p.add_argument("--knn-k", type=int, help="neighbours of the kNN baseline (default sqrt(n), 5..50)")
    p.add_argument("--min-group", type=int, default=20,
                   help="smallest source/domain group that gets an APGR in the breakdown (default 20)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pointsman eval``; 0 on success, 2 on a bad config, data or route."""
    args = build_parser().parse_args(argv)
    if args.bootstrap < 1:
        print("pointsman eval: --bootstrap must be at least 1", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401  (checked first: the plots come last, after minutes of work)
    except ImportError:
        print("pointsman eval: the report's plots need matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    try:
        paths, report = run(args)
    except EvalError as exc:
        print(f"pointsman eval: {exc}", file=sys.stderr)
        return 2
    print(summary(report))
    print(f"\nreport: {paths['html']}\n        {paths['markdown']}\n        {paths['json']}")
    return 0


class EvalError(ValueError):
    """A problem the user can fix (config, data, route, pair); the message names it."""


def run(args: argparse.Namespace) -> tuple[dict[str, Path], dict[str, Any]]:
    """Load, replay, compute and write; returns the written paths and the report."""
    from evals.labelled import DataError, load_source
    from policies.brain import RoutingConfigError, load_routing_config

    try:
        config = load_routing_config(args.config)
    except (RoutingConfigError, OSError) as exc:
        raise EvalError(f"--config {args.config}: {exc}") from exc
    try:
        route = config.route(args.route)
    except KeyError as exc:
        raise EvalError(f"--route {args.route}: {exc.args[0]}") from exc
    cq = route.cost_quality
    if cq is None:
        raise EvalError(
            f"--route {args.route}: the route has no cost_quality knob; pointsman eval reports a strong/weak "
            "routing decision (set routes.<name>.cost_quality)"
        )
    sources, rows = [], []
    skipped: dict[str, int] = {}
    for spec in args.data:
        try:
            loaded = load_source(spec)
        except DataError as exc:
            raise EvalError(str(exc)) from exc
        with_text = [r for r in loaded.rows if r.has_text]
        if len(with_text) < len(loaded.rows):
            key = "no conversation text (only its embedding was stored)"
            skipped[key] = skipped.get(key, 0) + len(loaded.rows) - len(with_text)
        for reason, n in loaded.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        sources.append({"source": spec, "rows": len(loaded.rows), **({"skipped": loaded.skipped}
                                                                     if loaded.skipped else {})})
        rows.extend(with_text)
    if not rows:
        raise EvalError(f"--data {' '.join(args.data)}: no request with its conversation text to replay")
    strong_data, weak_data = resolve_pair(cq, rows, args.strong, args.weak)

    replay, embeddings = asyncio.run(_replay(config, args, rows))
    from evals.report import build_table, compute_report, estimator_note

    prices = (config.models[cq.strong].price if cq.strong in config.models else 0.0,
              config.models[cq.weak].price if cq.weak in config.models else 0.0)
    table, excluded, basis = build_table(rows, replay, strong_data, weak_data, prices=prices, embeddings=embeddings)
    if len(table) == 0:
        raise EvalError(
            f"no request could be evaluated ({', '.join(f'{n} {w}' for w, n in excluded.items()) or 'none'}); "
            f"the data needs qualities for both {strong_data} and {weak_data} (--strong/--weak name them)"
        )
    by: dict[str, int] = {}
    for d in replay.decisions:
        by[d.by] = by.get(d.by, 0) + 1
    meta: dict[str, Any] = {
        "route": args.route,
        "config": str(args.config),
        "router_version": replay.router_version,
        "data": sources,
        "pair": {"strong": cq.strong, "weak": cq.weak, "strong_data": strong_data, "weak_data": weak_data},
        "rows": {"total": len(rows) + sum(skipped.values()), "replayed": len(rows), "decided_by": by,
                 "excluded": {**skipped, **excluded}},
        "knob": {"threshold": replay.threshold, "threshold_source": replay.threshold_source,
                 "target_share": replay.target_share},
        "estimator": estimator_note(table),
        "cost_basis": basis,
        "replay_note": "stateless: stickiness and exploration off; "
                       + ("the knob's target share calibrated over the replayed requests (two passes)"
                          if replay.target_share is not None else "the configured fixed threshold"),
    }
    report = compute_report(table, meta=meta, draws=args.bootstrap, seed=args.seed, knn_k=args.knn_k,
                            min_group=args.min_group, progress=not args.no_progress)
    from evals.report_render import write_report

    paths = write_report(report, Path(args.out), (d.as_dict() for d in replay.decisions))
    return paths, report


def resolve_pair(cq: Any, rows: Sequence[Any], strong: str | None, weak: str | None) -> tuple[str, str]:
    """The strong and weak models' names in the data.

    ``--strong``/``--weak`` win; else the route's ``cost_quality.difficulty_models`` mapping of its
    strong/weak config names; else the config names themselves when the data has them; else, when the
    data has exactly two models, the one with the higher mean quality is strong.
    """
    from evals.labelled import models_of

    models = models_of(rows)
    mapping = dict(cq.difficulty_models)
    s = strong or mapping.get(cq.strong) or (cq.strong if cq.strong in models else None)
    w = weak or mapping.get(cq.weak) or (cq.weak if cq.weak in models else None)
    if (s is None or w is None) and len(models) == 2:
        means = {m: float(np.mean([q for r in rows if (q := r.qualities.get(m)) is not None])) for m in models}
        hi, lo = sorted(models, key=lambda m: -means[m])
        s = s or (hi if w != hi else lo)
        w = w or (lo if s != lo else hi)
    if s is None or w is None:
        raise EvalError(
            f"which models of the data are the route's strong ({cq.strong}) and weak ({cq.weak})? the data has "
            f"{', '.join(models) or 'no scored model'}; pass --strong MODEL --weak MODEL"
        )
    for name, flag in ((s, "--strong"), (w, "--weak")):
        if name not in models:
            raise EvalError(f"{flag} {name}: no quality for it in the data (models: {', '.join(models)})")
    if s == w:
        raise EvalError(f"--strong and --weak are the same model {s!r}")
    return s, w


async def _replay(config: Any, args: argparse.Namespace, rows: Sequence[Any]) -> tuple[Any, np.ndarray | None]:
    """Replay every row, then embed the rows for the kNN baseline with the same encoder."""
    from evals.replay import ReplayError, replay_route
    from policies.brain import RoutingConfigError, build_brain

    # The encoder's cache holds every replayed conversation, so the second pass (a target share) and
    # the kNN baseline's embeddings are cache hits; decisions do not depend on it.
    settings = config.classifiers
    cache = max(settings.cache_size, min(len(rows) + 16, 1_000_000))
    config = dataclasses.replace(config, classifiers=settings.model_copy(update={"cache_size": cache}))
    try:
        brain = build_brain(config, sticky=False, explore=False, routers_dir=args.routers_dir, watch=False)
    except (RoutingConfigError, ValueError) as exc:
        raise EvalError(str(exc)) from exc
    await brain.start()
    try:
        progress = None if args.no_progress else _bar
        try:
            replay = await replay_route(
                brain, args.route, [r.messages for r in rows], request_ids=[r.request_id for r in rows],
                sources=[r.source for r in rows], progress=progress,
            )
        except ReplayError as exc:
            raise EvalError(str(exc)) from exc
        embeddings = await _embed(brain, config, [r.text() for r in rows], progress=not args.no_progress)
    finally:
        await brain.close()
    return replay, embeddings


def _bar(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", leave=False)


async def _embed(brain: Any, config: Any, texts: Sequence[str], *, progress: bool) -> np.ndarray | None:
    """The texts' embeddings with the config's encoder (the brain's, cached by replay, when it loaded one)."""
    encoder = getattr(brain, "encoder", None)
    if encoder is not None:
        out = []
        for start in range(0, len(texts), 256):
            out.extend(await asyncio.gather(*(encoder.encode(t) for t in texts[start:start + 256])))
        return np.vstack(out) if out else None
    from classifiers.encoders import load_encoder
    from evals.embeddings import embed_texts

    try:
        raw = await asyncio.to_thread(load_encoder, config.classifiers.encoder)
    except (OSError, ValueError) as exc:  # no encoder to be had: the kNN baseline is left out
        log.warning("kNN baseline skipped: encoder %s unavailable (%s)", config.classifiers.encoder, exc)
        return None
    return await asyncio.to_thread(embed_texts, raw, list(texts), progress=progress)


def summary(report: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    from evals.report_render import _est

    r = report["routers"]
    lines = [f"route {report['route']} on {report['rows']['evaluated']} requests "
             f"(estimator: {report['estimator']['name']}; router {report['router_version']})"]
    for key, label in (("router", "route"), ("knn", "kNN"), ("random", "random"), ("oracle", "oracle")):
        if key in r:
            lines.append(f"  {label:<8} APGR {_est(r[key].get('apgr'))}"
                         + (f"  CPT(50) {_est(r[key].get('cpt50'), pct=True)}" if "cpt50" in r[key] else ""))
    k = report["knob"]
    lines.append(f"  knob     {_est(k['strong_share'], pct=True)} strong calls, PGR {_est(k['pgr'])}")
    return "\n".join(lines)
