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
Exit 0, or 2 when DIR is not a registry, a config cannot be read, a registry file is corrupt (named) or
the registry cannot be written (a prune on a read-only file system is refused before it starts).

The helpers at the end (:func:`int_at_least`, :func:`unwritable`, :func:`corrupt_file`, :func:`error_line`,
:func:`os_error_line`) serve ``pointsman promote`` too: one line naming the file, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from classifiers.registry import (
    ACTIVE_FILE,
    LOCK_FILE,
    PRUNED_FILE,
    REGISTRY_FILE,
    VERDICTS_FILE,
    VERSION_FILE,
    VERSIONS_DIR,
    RouterRegistry,
    VersionInfo,
    is_registry,
    unwritable_reason,
)

#: Pairs shown per version on the terminal (an 11-model file trains 55); ``--json`` has them all.
SHOWN_PAIRS = 3


def _pair_summaries(info: VersionInfo) -> list[dict[str, Any]]:
    out = []
    for pair in info.metrics.get("pairs", []):
        gap = pair.get("quality_gap") or {}
        out.append({
            "strong": pair.get("strong"), "weak": pair.get("weak"), "encoder": pair.get("encoder"),
            "cv_apgr": pair.get("cv_apgr"), "cv_apgr_ci95": pair.get("cv_apgr_ci95"), "rows": pair.get("rows"),
            "prompts": pair.get("prompts"),  # distinct labelled prompts (a prompt judged twice is two rows)
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
        over = "" if p.get("prompts") is None else f" over {p['prompts']} prompts"
        parts.append(f"{p['strong']} vs {p['weak']} {apgr}{over}{flag}")
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
    if not args.dry_run:
        # Refused up front: a prune that cannot take the lock or delete would fail with a traceback.
        problem = unwritable(root, root / VERSIONS_DIR)
        if problem:
            print(f"pointsman registry prune: cannot prune {root}: {problem}", file=sys.stderr)
            return 2
    registry = RouterRegistry(root)
    doomed = registry.prune(args.keep, pinned, dry_run=args.dry_run)
    # Left by training runs that were killed before adding their version: nothing else ever removes them.
    staging = registry.abandoned_staging() if args.dry_run else registry.remove_abandoned_staging()
    if staging:
        print(f"{'would remove' if args.dry_run else 'removed'} {len(staging)} staging director"
              f"{'ies' if len(staging) != 1 else 'y'} left by training runs that did not finish: "
              + ", ".join(p.name for p in staging))
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
    p_prune.add_argument("--keep", type=int_at_least(1, " (the newest version is always kept)"), default=5,
                         help="newest versions to keep (>= 1; default 5)")
    p_prune.add_argument("--config", action="append", metavar="FILE",
                         help="a gateway config whose experiment arms' router_version must be kept (repeatable)")
    p_prune.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    args = parser.parse_args(argv)
    root = Path(args.registry)
    if not is_registry(root):
        print(f"pointsman registry: {root} is not a router registry (no registry.json)", file=sys.stderr)
        return 2
    try:
        if args.action == "prune":
            return _prune(args, root)
        summary = registry_summary(root)
    except OSError as exc:
        print(f"pointsman registry {args.action}: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a corrupt file: name it
        print(f"pointsman registry {args.action}: {registry_problem(root, exc)}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


# ----------------------------------------------------------------------------- shared with pointsman promote


def int_at_least(minimum: int, hint: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum`` (argparse's usage error names the option)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r}: give a whole number >= {minimum}{hint}")
        return number

    return parse


def unwritable(root: Path, *directories: Path) -> str | None:
    """Why the registry at ``root`` cannot be changed, or None.

    A change takes the lock (``.lock`` in ``root``, created if missing) and replaces files by renaming
    a temporary file written beside them, so ``root`` and each of ``directories`` (those that exist)
    must be writable directories, and ``.lock`` a writable file. Checked with ``os.access``, which sees a
    read-only mount even for root.
    """
    for directory in (root, *directories):
        if directory.exists() and not os.access(directory, os.W_OK | os.X_OK):
            return f"{directory} is not writable ({unwritable_reason(directory)})"
    lock = root / LOCK_FILE
    if lock.exists() and not os.access(lock, os.W_OK):
        return f"{lock} is not writable ({unwritable_reason(lock)})"
    return None


def registry_problem(root: Path, exc: BaseException) -> str:
    """One line for ``exc``, raised while reading or changing the registry at ``root``: the first of its
    JSON files that is not what it should be (:func:`corrupt_file`), or else the exception itself."""
    problem = corrupt_file(root)
    if problem is not None:
        return problem
    return error_line(exc, f"{root}: cannot read the registry")


def error_line(exc: BaseException, context: str) -> str:
    """One line for an exception: a file system error as ``path: reason``; a ``ValueError`` by its message
    (this code base's usage and data errors, the registry's among them, are ValueErrors that name the file
    or option); anything else as ``context (Type: message)``."""
    if isinstance(exc, OSError):
        return os_error_line(exc)
    if isinstance(exc, ValueError) and str(exc):
        return " ".join(str(exc).split())
    return f"{context} ({type(exc).__name__}: {' '.join(str(exc).split())})"


def corrupt_file(root: Path) -> str | None:
    """The first JSON file of the registry at ``root`` that is not what it should be (not JSON, or not
    the object or list it should hold), named with what is wrong; None when all of them read."""
    checks: list[tuple[Path, type, str | None]] = [
        (root / REGISTRY_FILE, dict, None), (root / ACTIVE_FILE, dict, "version"), (root / PRUNED_FILE, list, None),
    ]
    try:
        # Staging and pruned-aside directories (dot names) are not versions.
        versions = sorted(d for d in (root / VERSIONS_DIR).iterdir() if not d.name.startswith("."))
    except OSError:  # no versions directory, or an unreadable one: the files above can still be checked
        versions = []
    for directory in versions:
        checks += [(directory / VERSION_FILE, dict, "version"), (directory / VERDICTS_FILE, list, None)]
    for path, kind, key in checks:
        try:
            if not path.is_file():
                continue
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            return f"{path}: cannot read it ({err.strerror or err})"
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            return f"{path}: not valid JSON ({err}); the registry file is corrupt: restore it"
        if kind is list:
            ok = isinstance(raw, list) and all(isinstance(e, dict) for e in raw)
            what = "a JSON list of objects"
        else:
            ok = isinstance(raw, dict) and (key is None or isinstance(raw.get(key), str))
            what = "a JSON object" + (f' with a "{key}" string' if key else "")
        if not ok:
            return f"{path}: not {what}; the registry file is corrupt: restore it"
    return None


def os_error_line(exc: OSError) -> str:
    """``path: reason`` for a file system error (``[Errno 30] Read-only file system: 'R/.lock'`` reads
    as ``R/.lock: read-only file system``)."""
    reason = (exc.strerror or str(exc)).rstrip(".")
    reason = reason[:1].lower() + reason[1:]
    if exc.filename is not None:
        target = f" -> {exc.filename2}" if exc.filename2 is not None else ""
        return f"{exc.filename}{target}: {reason}"
    return reason
