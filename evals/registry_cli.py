"""``pointsman registry list --registry DIR [--json]``: what a router registry holds, at a glance.

One line per version, oldest first: its id, when it was trained, its parent, which is active (``*``) and
which was active before it (``previous``, where ``pointsman promote VERSION --force --reason ...`` rolls
back to), the rows it was trained on, each pair head's cross-validated APGR (the first few pairs; all of
them in ``--json``) and the last promotion verdict about it. ``--json`` prints the same as one JSON
object for scripts. Read-only: it takes no lock and writes nothing. Exit 0, or 2 when DIR is not a
registry.
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
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 listed, 2 usage error."""
    parser = argparse.ArgumentParser(prog="pointsman registry", description="Inspect a router registry.")
    sub = parser.add_subparsers(dest="action", required=True)
    p_list = sub.add_parser("list", help="every version, the active one and the last verdicts")
    p_list.add_argument("--registry", required=True, help="the router registry directory")
    p_list.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args(argv)
    root = Path(args.registry)
    if not is_registry(root):
        print(f"pointsman registry: {root} is not a router registry (no registry.json)", file=sys.stderr)
        return 2
    summary = registry_summary(root)
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0
