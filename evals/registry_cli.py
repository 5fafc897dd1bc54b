"""``pointsman registry list --registry DIR [--json]``: what a router registry holds, at a glance;
``pointsman registry prune --registry DIR [--keep N] [--config FILE]... [--dry-run]``: delete old versions.

One line per version, oldest first: its id, when it was trained, its parent, which is active (``*``) and
which was active before it (``previous``, where ``pointsman promote VERSION --force --reason ...`` rolls
back to), the rows it was trained on, each pair head's cross-validated APGR (the first few pairs; all of
them in ``--json``) and the last promotion verdict about it. ``--json`` prints the same as one JSON
object for scripts. Read-only: it takes no lock and writes nothing.

``prune`` keeps the ``--keep`` newest versions (default 5), the active and the previous one, and every
version an experiment arm of a ``--config`` file pins (``router_version``); it deletes the others under
the registry's lock and records each in ``pruned.json`` (``classifiers.registry.RouterRegistry.prune``).
Exit 0, or 2 when DIR is not a registry or a config cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from classifiers.registry import RouterRegistry, VersionInfo, is_registry

#: Pairs shown per version on the terminal (an 11-model file trains 55); ``--json`` has them all.
SHOWN_PAIRS = 3


def _pair_summaries(info: VersionInfo) -> list[dict[str, Any]]:
    out = []
    for pair in info.metrics.get("pairs", []):
        gap = pair.get("quality_gap") or {}
        out.append({
            "strong": pair.get("strong"), "weak": pair.get("weak"), "encoder": pair.get("encoder"),
            "cv_apgr": pair.get("cv_apgr"), "cv_apgr_ci95": pair.get("cv_apgr_ci95"), "rows": pair.get("rows"),
            "gap_resolved": gap.get("resolved"),
        })
    return out


def _last_verdict(info: VersionInfo) -> dict[str, Any] | None:
    if not info.verdicts:
        return None
    v = info.verdicts[-1]
    kind = "forced" if v.get("forced") else "gate" if "comparisons" in v else "registry"
    return {"at": v.get("at"), "decision": v.get("decision"), "by": kind, "reason": v.get("reason", "")}


def registry_summary(root: Path) -> dict[str, Any]:
    """The registry's versions and active state as JSON-ready data."""
    registry = RouterRegistry(root)
    active = registry.active() or {}
    versions = []
    for info in registry.versions():
        versions.append({
            "version": info.version,
            "created_at": info.created_at,
            "parent": info.parent,
            "active": info.version == active.get("version"),
            "previous": info.version == active.get("previous"),
            "rows": sum(int(d.get("rows", 0)) for d in info.data),
            "sources": [d.get("source") for d in info.data],
            "pairs": _pair_summaries(info),
            "last_verdict": _last_verdict(info),
        })
    return {
        "registry": str(root),
        "active": active.get("version"),
        "previous": active.get("previous"),
        "promoted_at": active.get("promoted_at"),
        "versions": versions,
        "pruned": registry.pruned(),
    }


def _fmt_pairs(pairs: list[dict[str, Any]]) -> str:
    if not pairs:
        return "no pair heads"
    parts = []
    for p in pairs[:SHOWN_PAIRS]:
        apgr = "n/a" if p["cv_apgr"] is None else f"{p['cv_apgr']:.3f}"
        flag = " (near-tie)" if p["gap_resolved"] is False else ""
        parts.append(f"{p['strong']} vs {p['weak']} {apgr}{flag}")
    more = f"; +{len(pairs) - SHOWN_PAIRS} more" if len(pairs) > SHOWN_PAIRS else ""
    return "; ".join(parts) + more


def render(summary: dict[str, Any]) -> str:
    """The terminal form of :func:`registry_summary`."""
    n = len(summary["versions"])
    if summary["active"]:
        head = (f"registry {summary['registry']}: {n} version{'s' * (n != 1)}, active {summary['active']} "
                f"(since {summary['promoted_at']}; previous {summary['previous'] or 'none'})")
    else:
        head = f"registry {summary['registry']}: {n} version{'s' * (n != 1)}, none active (the shipped routers serve)"
    lines = [head]
    for v in summary["versions"]:
        mark = "*" if v["active"] else "<" if v["previous"] else " "
        verdict = v["last_verdict"]
        said = "no verdict yet" if verdict is None else f"{verdict['decision']} ({verdict['by']}, {verdict['at']})"
        lines.append(
            f"{mark} {v['version']}  trained {v['created_at']}  parent {v['parent'] or '-'}  {v['rows']} rows  "
            f"CV APGR: {_fmt_pairs(v['pairs'])}  last verdict: {said}"
        )
    if summary["versions"]:
        lines.append("(* active, < previous: `pointsman promote VERSION --registry DIR --force --reason ...` "
                     "goes back to it)")
    if summary["pruned"]:
        last = summary["pruned"][-1]
        lines.append(f"{len(summary['pruned'])} older version{'s' * (len(summary['pruned']) != 1)} pruned "
                     f"(the last on {last.get('pruned_at')}); see pruned.json")
    return "\n".join(lines)


def pinned_versions(configs: Sequence[str]) -> set[str]:
    """Registry versions the gateway configs pin (experiment arms' ``router_version``).

    Raises ``ValueError`` naming the file for a config that cannot be read or is invalid: pruning must
    not go ahead believing a config pins nothing.
    """
    from policies.brain import RoutingConfigError, load_routing_config

    pinned: set[str] = set()
    for path in configs:
        try:
            config = load_routing_config(path)
        except (RoutingConfigError, OSError) as exc:
            raise ValueError(f"--config {path}: {exc}") from exc
        pinned.update(arm.router_version for e in config.experiments for arm in e.arms if arm.router_version)
    return pinned


def _prune(args: argparse.Namespace, root: Path) -> int:
    try:
        pinned = pinned_versions(args.config or [])
    except ValueError as exc:
        print(f"pointsman registry prune: {exc}", file=sys.stderr)
        return 2
    registry = RouterRegistry(root)
    doomed = registry.prune(args.keep, pinned, dry_run=args.dry_run)
    kept = [v for v in registry.version_ids() if v not in doomed]
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(doomed)} version{'s' * (len(doomed) != 1)}" + (f": {', '.join(doomed)}" if doomed else ""))
    print(f"kept {len(kept)}: {', '.join(kept) or 'none'} (the {args.keep} newest, the active and previous ones"
          + (f", pinned by --config: {', '.join(sorted(pinned))}" if pinned else "") + ")")
    if not args.config:
        print("note: no --config given; a version an experiment arm pins (router_version) is kept only if it is "
              "among those; pass each gateway config with --config", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 done, 2 usage error."""
    parser = argparse.ArgumentParser(prog="pointsman registry", description="Inspect or prune a router registry.")
    sub = parser.add_subparsers(dest="action", required=True)
    p_list = sub.add_parser("list", help="every version, the active one and the last verdicts")
    p_list.add_argument("--registry", required=True, help="the router registry directory")
    p_list.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p_prune = sub.add_parser(
        "prune", help="delete old versions: keeps the --keep newest, the active and previous ones, and those "
        "the --config files pin; recorded in pruned.json",
    )
    p_prune.add_argument("--registry", required=True, help="the router registry directory")
    p_prune.add_argument("--keep", type=_at_least_one, default=5, help="newest versions to keep (>= 1; default 5)")
    p_prune.add_argument("--config", action="append", metavar="FILE",
                         help="a gateway config whose experiment arms' router_version must be kept (repeatable)")
    p_prune.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    args = parser.parse_args(argv)
    root = Path(args.registry)
    if not is_registry(root):
        print(f"pointsman registry: {root} is not a router registry (no registry.json)", file=sys.stderr)
        return 2
    if args.action == "prune":
        return _prune(args, root)
    summary = registry_summary(root)
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


def _at_least_one(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number >= 1 (the newest version is always kept)")
    return n
