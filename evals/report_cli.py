"""``pointsman eval``: replay a route's policy over labelled requests and report it against baselines.

    pointsman eval --config FILE --route auto --data SOURCE [--data SOURCE ...] [--out DIR]
                   [--strong MODEL --weak MODEL] [--routers-dir DIR] [--metric M] [--bootstrap N] [--seed S]

Sources as in ``pointsman train`` (:func:`evals.labelled.load_source`): ``bundled``, ``logs:STORE_URL``,
``file:PATH`` or a directory. No backend is called: the route decides every request offline with the
gateway's own decision code (:mod:`evals.replay`), and the report (:mod:`evals.report`) is written as
JSON, Markdown, HTML and PNG plots into ``--out`` (default ``./pointsman-eval``).

Labelled requests (both models' quality) give the *direct* section; logged requests of a ``logs:``
source with a propensity (exploration) and an outcome of the served answer give the *off-policy*
section (:mod:`evals.offpolicy`: IPS, SNIPS, DR). Either may be missing; with neither, the command
says why for each and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evals.holdout import holdout_fraction, split_sources
from evals.registry_cli import int_at_least

if TYPE_CHECKING:
    from evals.report import PairTable

log = logging.getLogger("pointsman.eval")


def build_parser() -> argparse.ArgumentParser:
    """The ``pointsman eval`` arguments."""
    p = argparse.ArgumentParser(
        prog="pointsman eval",
        description="Replay a route's policy over labelled requests (no backend is called) and report APGR, "
        "CPT, the cost-quality frontier, AIQ and calibration next to random, always-weak, "
        "always-strong, oracle and kNN baselines, with bootstrap confidence intervals; on logged "
        "traffic with propensities (exploration), inverse-propensity estimates of its quality, "
        "strong-call share and cost.",
    )
    p.add_argument("--config", required=True, help="the gateway config file (its routes and classifiers)")
    p.add_argument("--route", default="auto", help="the route to replay (default auto)")
    p.add_argument("--data", action="append", required=True, metavar="SOURCE",
                   help="bundled | logs:STORE_URL | file:PATH | DIR (repeatable: the sources are concatenated)")
    p.add_argument("--out", default="pointsman-eval", help="report directory (default ./pointsman-eval)")
    p.add_argument("--strong", help="the strong model's name in the data (default: the route's cost_quality "
                                    "strong model, through difficulty_models when set)")
    p.add_argument("--weak", help="the weak model's name in the data (default: as --strong)")
    p.add_argument(
        "--routers-dir",
        help="router artifacts to replay with instead of classifiers.routers_dir "
        "(a registry, a registry version directory or a plain directory of heads; must exist)",
    )
    p.add_argument(
        "--metric", default="quality", help="the feedback metric logs: sources are read under (default quality)"
    )
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int_at_least(0), default=0,
                   help="seed of the resamples, folds and random baseline (>= 0; default 0)")
    p.add_argument("--knn-k", type=int_at_least(1),
                   help="neighbours of the kNN baseline (>= 1; default sqrt(n), 5..50)")
    p.add_argument("--min-group", type=int, default=20,
                   help="smallest source/domain group that gets an APGR in the breakdown (default 20)")
    p.add_argument(
        "--holdout", type=holdout_fraction, metavar="FRACTION",
        help="keep only the held-out part of each --data source: the part pointsman train --holdout FRACTION "
        "left out (so two routers can be compared on the same requests)",
    )
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
    from evals.report import report_dir
    from evals.report_render import REPORT_FILES

    # Checked before the replay and the bootstrap, which take minutes: a bad path must not cost them.
    problem = routers_dir_problem(args.routers_dir)
    if problem:
        print(f"pointsman eval: {problem}", file=sys.stderr)
        return 2
    try:
        report_dir(args.out, REPORT_FILES)
    except ValueError as exc:
        print(f"pointsman eval: {exc}", file=sys.stderr)
        return 2
    try:
        paths, report = run(args)
    except EvalError as exc:
        print(f"pointsman eval: {exc}", file=sys.stderr)
        return 2
    print(summary(report))
    print(f"\nreport: {paths['html']}\n        {paths['markdown']}\n        {paths['json']}")
    return 0


#: How requests left out because the replayed router was trained on them are counted (then the version id).
TRAINING_DATA = "training data of router"


class EvalError(ValueError):
    """A problem the user can fix (config, data, route, pair); the message names it."""


def run(args: argparse.Namespace) -> tuple[dict[str, Path], dict[str, Any]]:
    """Load, replay, compute and write; returns the written paths and the report.

    Two sections, each from its own rows: *direct* (labelled requests with both models' quality:
    curves, baselines, calibration) and *off-policy* (logged requests with a propensity and the served
    answer's outcome: IPS, SNIPS and DR estimates). Either may be missing; neither is an error.
    """
    config, cq = _route_config(args)
    data = _load_data(args)
    _leave_out_training_rows(data, args.routers_dir or config.classifiers.routers_dir)
    ips_rows, ips_excluded = _ips_candidates(data.logged, cq.strong, cq.weak)
    strong_data, weak_data, direct_missing = _direct_pair(cq, data.rows, args, bool(ips_rows))
    direct_rows: list[Any] = []
    unlabelled: dict[str, int] = {}
    if strong_data is not None and weak_data is not None:
        direct_rows = [r for r in data.rows if r.labelled_for(strong_data, weak_data)]
        if len(direct_rows) < len(data.rows):
            unlabelled = {f"no quality for both {strong_data} and {weak_data}": len(data.rows) - len(direct_rows)}
        if not direct_rows:
            direct_missing = (
                f"no quality for both {strong_data} and {weak_data} on any of the {len(data.rows)} "
                "labelled requests (--strong/--weak name the pair)"
            )
    if not direct_rows and not ips_rows:
        raise EvalError(_nothing_to_evaluate(args, data, direct_missing, ips_excluded, cq))
    items, logged_idx = _union(direct_rows, ips_rows)
    replay, embeddings = asyncio.run(_replay(config, args, items, [r.text() for r in direct_rows]))

    from evals.offpolicy import build_logged_table, offpolicy_estimator, offpolicy_section
    from evals.replay import subset
    from evals.report import build_table, compute_report, estimator_block, offpolicy_only_report

    prices = (
        config.models[cq.strong].price if cq.strong in config.models else 0.0,
        config.models[cq.weak].price if cq.weak in config.models else 0.0,
    )
    table: PairTable | None = None
    excluded: dict[str, int] = {}
    basis: dict[str, str] = {}
    if direct_rows:
        assert strong_data is not None and weak_data is not None
        table, excluded, basis = build_table(
            direct_rows,
            subset(replay, range(len(direct_rows))),
            strong_data,
            weak_data,
            prices=prices,
            embeddings=embeddings,
        )
        if len(table) == 0:
            direct_missing = (
                f"no request could be evaluated ({_counts(excluded) or 'none'}); the data needs "
                f"qualities for both {strong_data} and {weak_data} (--strong/--weak name them)"
            )
            table = None
    logged_table, logged_excluded, logged_basis = build_logged_table(
        ips_rows, [replay.decisions[j] for j in logged_idx], cq.strong, cq.weak, prices=prices
    )
    logged_excluded = _merged(data.logged_skipped, ips_excluded, logged_excluded)
    if table is None and len(logged_table) == 0:
        raise EvalError(_nothing_to_evaluate(args, data, direct_missing, logged_excluded, cq))
    by: dict[str, int] = {}
    for d in replay.decisions:
        by[d.by] = by.get(d.by, 0) + 1
    logged_total = len(data.logged) + sum(data.logged_skipped.values())
    offpolicy_note = None
    if data.has_logs:
        offpolicy_note = offpolicy_estimator(
            used=len(logged_table),
            logged=logged_total,
            excluded=logged_excluded,
            metric=args.metric,
            missing=f"no logged request of {cq.strong} / {cq.weak} with a propensity and an outcome "
            f"({_counts(logged_excluded) or 'none logged'})",
        )
    meta: dict[str, Any] = {
        "route": args.route,
        "config": str(args.config),
        "router_version": routers_dir_version(args.routers_dir) or replay.router_version,
        "data": data.sources,
        "pair": {"strong": cq.strong, "weak": cq.weak, "strong_data": strong_data, "weak_data": weak_data,
                 **({"reversed_from": replay.difficulty_reversed_from} if replay.difficulty_reversed_from else {})},
        "rows": {
            "total": len(data.rows) + sum(data.skipped.values()),
            "replayed": len(items),
            "decided_by": by,
            "excluded": _merged(data.skipped, unlabelled, excluded),
        },
        "knob": {
            "threshold": replay.threshold,
            "threshold_source": replay.threshold_source,
            "target_share": replay.target_share,
        },
        "estimator": estimator_block(0 if table is None else len(table), offpolicy_note, direct_missing=direct_missing),
        "cost_basis": basis,
        "replay_note": "stateless: stickiness and exploration off; "
        + (
            "the knob's target share calibrated over every replayed request (two passes)"
            if replay.target_share is not None
            else "the configured fixed threshold"
        ),
    }
    if table is not None:
        report = compute_report(
            table,
            meta=meta,
            draws=args.bootstrap,
            seed=args.seed,
            knn_k=args.knn_k,
            min_group=args.min_group,
            progress=not args.no_progress,
        )
    else:
        report = offpolicy_only_report(meta, draws=args.bootstrap, seed=args.seed)
    if len(logged_table):
        report["offpolicy"] = offpolicy_section(
            logged_table,
            pair=(cq.strong, cq.weak),
            metric=args.metric,
            logged=logged_total,
            excluded=logged_excluded,
            basis=logged_basis,
            draws=args.bootstrap,
            seed=args.seed,
        )
    from evals.report_render import write_report

    paths = write_report(report, Path(args.out), (d.as_dict() for d in replay.decisions))
    return paths, report


@dataclasses.dataclass
class _Data:
    """What the ``--data`` sources hold: labelled rows with their text, logged single-outcome rows."""

    rows: list[Any]
    logged: list[Any]
    sources: list[dict[str, Any]]
    skipped: dict[str, int]
    logged_skipped: dict[str, int]
    has_logs: bool


def _route_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """The routing config and the route's cost-quality knob."""
    from policies.brain import RoutingConfigError, load_routing_config

    try:
        config = load_routing_config(args.config)
    except (RoutingConfigError, OSError) as exc:
        raise EvalError(f"--config {args.config}: {exc}") from exc
    try:
        route = config.route(args.route)
    except KeyError as exc:
        raise EvalError(f"--route {args.route}: {exc.args[0]}") from exc
    if route.cost_quality is None:
        raise EvalError(
            f"--route {args.route}: the route has no cost_quality knob; pointsman eval reports a strong/weak "
            "routing decision (set routes.<name>.cost_quality)"
        )
    return config, route.cost_quality


def _leave_out_training_rows(data: _Data, routers_dir: str | None) -> None:
    """Drop (and count) the requests the replayed router version was trained on: graded on its own
    training rows a router looks better than it will on new traffic (:mod:`evals.trained_rows`)."""
    from evals.trained_rows import router_training_rows, trained_mask

    try:
        found = router_training_rows(routers_dir)
    except (OSError, ValueError) as exc:
        raise EvalError(f"the router in {routers_dir}: cannot read the record of its training requests: {exc}") from exc
    if found is None:
        return
    version, trained = found
    reason = f"{TRAINING_DATA} {version}"
    labelled = trained_mask(data.rows, trained)
    logged = trained_mask(data.logged, trained)
    seen, total = int(labelled.sum() + logged.sum()), len(labelled) + len(logged)
    if seen and seen == total:
        raise EvalError(
            f"--data {' '.join(s['source'] for s in data.sources)}: router {version} was trained on every one of "
            f"these {total} requests, so they cannot tell how it routes new traffic; evaluate "
            "on requests it did not learn from (pointsman train --holdout FRACTION keeps a part out, as does "
            "traffic logged after training)"
        )
    if labelled.any():
        data.rows = [r for r, drop in zip(data.rows, labelled, strict=True) if not drop]
        data.skipped = _merged(data.skipped, {reason: int(labelled.sum())})
    if logged.any():
        data.logged = [r for r, drop in zip(data.logged, logged, strict=True) if not drop]
        data.logged_skipped = _merged(data.logged_skipped, {reason: int(logged.sum())})


def _load_data(args: argparse.Namespace) -> _Data:
    """Every ``--data`` source; labelled rows without their text (only an embedding) are counted out."""
    from evals.labelled import DataError, load_source

    data = _Data(rows=[], logged=[], sources=[], skipped={}, logged_skipped={}, has_logs=False)
    for spec in args.data:
        try:
            loaded = load_source(spec, metric=args.metric)
        except DataError as exc:
            raise EvalError(str(exc)) from exc
        if args.holdout is not None:
            (loaded,) = split_sources([loaded], args.holdout, "heldout")
        with_text = [r for r in loaded.rows if r.has_text]
        missing = len(loaded.rows) - len(with_text)
        data.skipped = _merged(
            data.skipped,
            loaded.skipped,
            {"no conversation text (only its embedding was stored)": missing} if missing else {},
        )
        entry: dict[str, Any] = {"source": loaded.spec, "rows": len(loaded.rows)}
        if loaded.holdout:
            entry["holdout"] = loaded.holdout
        if loaded.skipped:
            entry["skipped"] = loaded.skipped
        if spec.startswith("logs:"):
            data.has_logs = True
            entry["logged"] = len(loaded.logged)
            if loaded.logged_skipped:
                entry["logged_skipped"] = loaded.logged_skipped
            data.logged_skipped = _merged(data.logged_skipped, loaded.logged_skipped)
        data.sources.append(entry)
        data.rows.extend(with_text)
        data.logged.extend(loaded.logged)
    return data


def _ips_candidates(logged: Sequence[Any], strong: str, weak: str) -> tuple[list[Any], dict[str, int]]:
    """The logged rows inverse propensity can use for the pair (before replay), and why the others not."""
    from evals.offpolicy import ips_exclusion

    keep: list[Any] = []
    excluded: dict[str, int] = {}
    for row in logged:
        reason = ips_exclusion(row, strong, weak)
        if reason is None:
            keep.append(row)
        else:
            excluded[reason] = excluded.get(reason, 0) + 1
    return keep, excluded


def _direct_pair(
    cq: Any, rows: Sequence[Any], args: argparse.Namespace, logged_usable: bool
) -> tuple[str | None, str | None, str]:
    """The pair's names in the labelled data, or (None, None, why not) when the off-policy section can
    stand alone (no labelled rows, or a pair the data does not name and the user did not ask for)."""
    if not rows:
        return None, None, "no labelled request (both models' quality) with its conversation text"
    try:
        strong, weak = resolve_pair(cq, rows, args.strong, args.weak)
    except EvalError as exc:
        if args.strong or args.weak or not logged_usable:
            raise
        return None, None, str(exc)
    return strong, weak, ""


def _union(direct: Sequence[Any], logged: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """Every request to replay once: the direct rows, then the logged rows not among them (same request
    id and conversation); returns them and each logged row's index in that list."""
    items = list(direct)
    seen = {r.request_id: i for i, r in enumerate(direct) if r.request_id}
    index = []
    for row in logged:
        j = seen.get(row.request_id)
        if j is None or items[j].messages != row.messages:
            j = len(items)
            items.append(row)
        index.append(j)
    return items, index


def _merged(*counts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for key, n in c.items():
            out[key] = out.get(key, 0) + n
    return out


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in counts.items())


def _nothing_to_evaluate(
    args: argparse.Namespace, data: _Data, direct_missing: str, logged_excluded: dict[str, int], cq: Any
) -> str:
    """The error when neither estimator has a row, naming why for each."""
    if not data.has_logs:
        logged = "no logs:STORE_URL source for off-policy estimates"
    else:
        logged = (
            f"no logged request of {cq.strong} / {cq.weak} has a propensity and an outcome of its served "
            f"answer ({_counts(logged_excluded) or 'nothing logged'})"
        )
    return (
        f"--data {' '.join(args.data)}: nothing to evaluate. Direct: {direct_missing}. Off-policy: {logged}. "
        "Labelled requests need both models' quality (a file, or comparisons: routes.<name>.compare); "
        "off-policy estimates need exploration (routes.<name>.explore.epsilon) and feedback on the answers"
    )


def routers_dir_problem(path: str | None) -> str | None:
    """Why ``--routers-dir`` cannot be replayed, or None (not given, or a registry or directory of heads).

    A path with no router in it would silently replay the shipped heads (``resolve_routers_dir`` falls
    back to them) under the name ``bundled-...``, grading a router the user did not ask for.
    """
    from classifiers.registry import has_heads, is_registry

    if path is None:
        return None
    root = Path(path)
    if not path.strip():
        return "--routers-dir: give a directory (a registry, a registry version or a directory of heads)"
    if not root.exists():
        return f"--routers-dir {path}: no such directory"
    if not root.is_dir():
        return f"--routers-dir {path}: is a file; give a registry, a registry version or a directory of heads"
    if not is_registry(root) and not has_heads(root):
        return (f"--routers-dir {path}: holds no router (no registry.json, no <head>/manifest.json); give a "
                "registry, a registry version or a directory of heads")
    return None


def routers_dir_version(path: str | Path | None) -> str | None:
    """The registry version id of a ``--routers-dir`` that is a registry version directory
    (``<registry>/versions/<id>``, read from its ``version.json``), else None (the brain's own id)."""
    from classifiers.registry import VERSION_FILE

    if not path:
        return None
    file = Path(path) / VERSION_FILE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = raw.get("version") if isinstance(raw, dict) else None
    return version if isinstance(version, str) and version else None


def resolve_pair(cq: Any, rows: Sequence[Any], strong: str | None, weak: str | None) -> tuple[str, str]:
    """The strong and weak models' names in the data.

    ``--strong``/``--weak`` win; else the route's ``cost_quality.difficulty_models`` mapping of its
    strong/weak config names; else the config names themselves when the data has them; else, when the
    data has exactly two models, the one with the higher mean quality is strong.
    """
    from evals.labelled import models_of

    models = models_of(rows)
    if len(models) < 2:  # no pair to compare: naming one (--strong/--weak) cannot help
        has = f"qualities for {models[0]} only" if models else "no quality for any model"
        raise EvalError(
            f"the labelled data has {has}; the direct report "
            f"compares the route's strong ({cq.strong}) and weak ({cq.weak}) models on requests labelled for both"
        )
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


async def _replay(
    config: Any, args: argparse.Namespace, items: Sequence[Any], texts: Sequence[str]
) -> tuple[Any, np.ndarray | None]:
    """Replay every item (``messages``, ``request_id``, ``source``), then embed ``texts`` (the direct
    rows, for the kNN baseline) with the same encoder."""
    from evals.replay import ReplayError, replay_route
    from policies.brain import RoutingConfigError, build_brain

    # The encoder's cache holds every replayed conversation, so the second pass (a target share) and
    # the kNN baseline's embeddings are cache hits; decisions do not depend on it.
    settings = config.classifiers
    cache = max(settings.cache_size, min(len(items) + 16, 1_000_000))
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
                brain,
                args.route,
                [r.messages for r in items],
                request_ids=[r.request_id for r in items],
                sources=[r.source for r in items],
                progress=progress,
            )
        except ReplayError as exc:
            raise EvalError(str(exc)) from exc
        embeddings = (await _embed(brain, config, texts, progress=not args.no_progress)) if texts else None
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
    from evals.report_render import _est, cpt_text

    lines = [f"route {report['route']} (estimator: {report['estimator']['name']}; router {report['router_version']})"]
    r = report.get("routers")
    if r is not None:
        trained_on = sum(n for why, n in (report["rows"].get("excluded") or {}).items()
                         if why.startswith(TRAINING_DATA))
        left_out = f" ({trained_on} more left out: the router was trained on them)" if trained_on else ""
        lines.append(f"direct, on {report['rows']['evaluated']} labelled requests{left_out}:")
        for key, label in (("router", "route"), ("knn", "kNN"), ("random", "random"), ("oracle", "oracle")):
            if key in r:
                lines.append(
                    f"  {label:<8} APGR {_est(r[key].get('apgr'))}"
                    + (f"  CPT(50) {cpt_text(r[key].get('cpt50'))}" if "cpt50" in r[key] else "")
                )
        k = report["knob"]
        lines.append(f"  knob     {_est(k['strong_share'], pct=True)} strong calls, PGR {_est(k['pgr'])}")
        lines.extend(f"  note: {warning}" for warning in report.get("warnings", []))
    else:
        lines.append(f"direct: {report['estimator']['direct']['text']}")
    off = report.get("offpolicy")
    if off is not None:
        route, logging_ = off["policies"]["router"], off["policies"]["logging"]
        lines.append(
            f"off-policy, on {off['rows']['used']} logged requests with propensities "
            f"(ESS {route['ess']:.0f}; {off['rows']['without_propensity']} without a propensity left out):"
        )
        lines.append(
            f"  route    {off['metric']} SNIPS {_est(route['quality']['snips'])}  "
            f"IPS {_est(route['quality']['ips'])}  DR {_est(route['quality']['dr'])}"
        )
        lines.append(f"  logging  {off['metric']} {_est(logging_['quality'])} (observed)")
        lines.append(
            f"  route    {_est(route['strong_share']['replayed'], pct=True)} strong calls (replayed; SNIPS "
            f"{_est(route['strong_share']['snips'], pct=True)})"
        )
    elif "offpolicy" in report["estimator"]:
        lines.append(f"off-policy: {report['estimator']['offpolicy']['text']}")
    return "\n".join(lines)
