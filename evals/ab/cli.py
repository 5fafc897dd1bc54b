"""``pointsman ab report``: an experiment's per-arm quality, cost and latency with always-valid statistics.

    pointsman ab report EXPERIMENT --store STORE_URL [--out DIR] [--format md,html,json] [--alpha 0.05]
                        [--include-compared] [--since ISO] [--metric quality] [--quality-source auto]
                        [--min-effect 0.02] [--planned-n 1000]

Reads the experiment's registered spec, its served and shadow decision rows with their feedback and
its arm stops from the store (``sqlite:///abs/path.db``, a file path or ``postgresql://...``), and
writes ``ab-report.{md,html,json}`` and PNG plots into ``--out`` (default ``./pointsman-ab``). Exit 0
with a report, 2 on a usage error, an unreadable store or an unknown experiment.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.ab.analysis import Options, analyze
from evals.ab.load import UnknownExperiment, load_experiment_url
from evals.ab.render import FORMATS, report_files, verdict_lines, write_ab_report
from evals.report import report_dir
from evals.run_sync import run_sync
from policies.experiments.sequential import DEFAULT_PLANNED_N
from store.errors import StoreError


class UsageError(ValueError):
    """A bad argument; the message says which and why."""


class CommandError(Exception):
    """The store could not be read or the report could not be written; the message says which."""


def check_text(label: str, value: str) -> None:
    """A :class:`UsageError` naming ``label`` when ``value`` is not valid UTF-8.

    Python hands undecodable argument bytes over as lone surrogates (``\\udcff``); they would fail
    deep in the store's query ("'utf-8' codec can't encode"). Paths are not checked: the file
    system takes such names back as the bytes they were.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{label} {value!r}: not valid UTF-8 text") from None


def shown_path(path: Path) -> str:
    """``path`` for the terminal: a name's bytes that are not UTF-8 shown as ``\\xff`` escapes.

    Such a name is a valid path (the report was written there), but printing its lone surrogates to
    a UTF-8 stdout would raise after the work is done.
    """
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def build_parser() -> argparse.ArgumentParser:
    """The ``pointsman ab`` arguments (one sub-command: ``report``)."""
    p = argparse.ArgumentParser(prog="pointsman ab", description="A/B experiments between routing policies.")
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser(
        "report",
        help="per-arm quality, cost, latency and a verdict, with statistics valid however early it is read",
        description="Per-arm quality (per feedback source), cost, strong-model share, latency and errors of an "
        "experiment, differences against control with always-valid confidence sequences, a sample-ratio "
        "check and a plain-language verdict; shadow arms' decisions separately.",
    )
    r.add_argument("experiment", help="the experiment's name (as in the config's experiments: section)")
    r.add_argument("--store", required=True, metavar="URL",
                   help="sqlite:///abs/path.db, sqlite://rel.db, a file path, or postgresql://...")
    r.add_argument("--out", default="pointsman-ab", help="report directory (default ./pointsman-ab)")
    r.add_argument("--format", default=",".join(FORMATS), help="comma-separated: md, html, json (default all)")
    r.add_argument("--alpha", type=float, default=0.05,
                   help="chance of ever declaring a difference that is not there (default 0.05)")
    r.add_argument("--include-compared", action="store_true",
                   help="keep requests sampled for counterfactual comparisons in quality and cost "
                        "(default: left out, their cost and judge scores include calls made for learning)")
    r.add_argument("--since", metavar="ISO", help="only requests at or after this time (ISO 8601; UTC if no zone)")
    r.add_argument("--metric", default="quality", help="feedback metric of explicit and judge scores (default quality)")
    r.add_argument("--quality-source", default="auto", choices=("auto", "explicit", "judge", "implicit"),
                   help="quality the verdict uses (default auto: explicit if any, else judge, else implicit)")
    r.add_argument("--min-effect", type=float, default=0.02,
                   help="smallest quality difference (0-1 scale) worth detecting (default 0.02)")
    r.add_argument("--planned-n", type=int, default=DEFAULT_PLANNED_N,
                   help=f"requests per arm the intervals are tightest at (default {DEFAULT_PLANNED_N}); "
                        "fix it before the experiment starts")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_since(text: str | None) -> float | None:
    """``--since`` as unix seconds (ISO 8601, naive times in UTC; a plain number is unix seconds)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"--since {text!r}: not an ISO 8601 time (e.g. 2025-01-31T12:00:00Z)") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _options(args: argparse.Namespace) -> tuple[Options, list[str]]:
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be in (0, 1), got {args.alpha}")
    if not 0 < args.min_effect <= 1:
        raise UsageError(f"--min-effect must be in (0, 1], got {args.min_effect}")
    if args.planned_n < 1:
        raise UsageError(f"--planned-n must be at least 1, got {args.planned_n}")
    formats = [f.strip().lower() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UsageError(f"--format {args.format!r}: expected a comma-separated list of {', '.join(FORMATS)}")
    opts = Options(alpha=args.alpha, planned_n=args.planned_n, min_effect=args.min_effect,
                   quality_source=args.quality_source)
    return opts, formats


def report(args: argparse.Namespace) -> tuple[dict[str, Path], dict[str, Any]]:
    """Load, analyse and write; returns the written paths and the report dict.

    Every argument and every output path is checked before the store is read: a bad ``--out``
    fails in a second, not after the load, and never after some of the files were written.
    """
    check_text("experiment name", args.experiment)
    check_text("--metric", args.metric)
    opts, formats = _options(args)
    since = parse_since(args.since)
    try:
        report_dir(args.out, report_files(formats))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from tqdm import tqdm

    bar = tqdm(total=3, desc="load from store", unit="step", disable=args.no_progress or not sys.stderr.isatty(),
               leave=False)
    try:
        try:
            data = run_sync(lambda: load_experiment_url(args.store, args.experiment, since=since,
                                                        include_compared=args.include_compared, metric=args.metric))
        except (StoreError, OSError, ValueError) as exc:  # missing or unreachable database, bad URL
            raise CommandError(f"cannot read the store: {exc}") from exc
        bar.update()
        bar.set_description(f"analyse {len(data.served)} requests")
        result = analyze(data, opts)
        result["since"] = args.since
        bar.update()
        bar.set_description("write report")
        try:
            paths = write_ab_report(result, Path(args.out), formats)
        except (OSError, ValueError) as exc:  # the directory changed since it was checked, or the disk is full
            raise CommandError(f"--out {args.out}: cannot write the report: {exc}") from exc
        bar.update()
    finally:
        bar.close()
    return paths, result


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pointsman ab``; 0 with a report, 2 on a usage error, a store error or an unknown experiment."""
    args = build_parser().parse_args(argv)
    try:
        paths, result = report(args)
    except (UsageError, UnknownExperiment, CommandError) as exc:
        print(f"pointsman ab: {exc}", file=sys.stderr)
        return 2
    print("\n".join(verdict_lines(result)))
    print(f"\n{result['rows']['served']} served requests, {result['rows']['shadow']} shadow decisions")
    print("report: " + "\n        ".join(shown_path(p) for k, p in paths.items() if k in FORMATS))
    return 0
