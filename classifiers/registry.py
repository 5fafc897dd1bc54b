"""The router registry: trained router versions on disk, one of them active.

A registry is a directory::

    registry.json                 {"format": 1}
    active.json                   {"version", "promoted_at", "verdict", "previous"}   (absent: none active)
    versions/<id>/version.json    {version, parent, created_at, data, metrics, encoders, pairs, weights_sha256}
    versions/<id>/verdicts.json   every promotion verdict about this version, refusals included
    versions/<id>/difficulty-<strong>--<weak>-<encoder>/, quality-<src>-<encoder>/, domain-<encoder>/  (heads)

Version ids are ``v<NNNN>-<8 hex>``: a sequence number (so ids sort by age and read well) and the
first hex digits of the sha256 over the version's weight files (so two versions trained from the same
inputs visibly hold the same weights). A version directory is complete or absent: it is built in a
staging directory inside the registry and renamed into place. ``active.json`` and ``verdicts.json``
are written to a temporary file, fsynced and renamed over the old one (``os.replace``), so a reader
(every gateway replica polls :func:`active_marker`) sees the old file or the new one, never half of
one. Writers take an exclusive ``flock`` on ``.lock`` so two ``pointsman train`` runs never pick the
same sequence number.

:func:`resolve_routers_dir` turns ``classifiers.routers_dir`` into the directory heads load from and a
version id for decision records: the registry's active version, a plain directory of heads, or (no
directory, or a registry with no active version) the artifacts shipped with the package.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: The artifacts shipped inside the package: the fallback when no registry version is active.
SHIPPED_ROUTERS_DIR = Path(__file__).resolve().parent / "artifacts" / "routers"
REGISTRY_FILE = "registry.json"
ACTIVE_FILE = "active.json"
VERSIONS_DIR = "versions"
VERSION_FILE = "version.json"
VERDICTS_FILE = "verdicts.json"
PRUNED_FILE = "pruned.json"
LOCK_FILE = ".lock"
FORMAT = 1
#: The directory of a difficulty head for one model pair (``slug`` of each model name).
PAIR_ARTIFACT = "difficulty-{strong}--{weak}-{encoder}"
_VERSION_ID = re.compile(r"^v(\d{4,})-[0-9a-f]{8}$")


def slug(name: str) -> str:
    """A model name as a directory-name part: lower case, runs of other characters as one ``-``.

    ``gpt-4-1106-preview`` stays itself; ``mistralai/Mixtral-8x7B-Instruct-v0.1`` becomes
    ``mistralai-mixtral-8x7b-instruct-v0-1``. Never contains ``--``, so ``<strong>--<weak>`` splits.
    """
    out = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not out:
        raise ValueError(f"model name {name!r} has no letters or digits")
    return out


def pair_artifact(strong: str, weak: str, encoder: str) -> str:
    """Directory name of the difficulty head for ``strong`` vs ``weak`` on ``encoder``."""
    return PAIR_ARTIFACT.format(strong=slug(strong), weak=slug(weak), encoder=encoder)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so readers see the old content or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_registry(path: str | Path | None) -> bool:
    """Whether ``path`` is a router registry (holds ``registry.json``)."""
    return path is not None and (Path(path) / REGISTRY_FILE).is_file()


def weights_digest(directory: Path) -> str:
    """sha256 over every head's weights under ``directory`` (names and bytes; manifests excluded).

    Manifests carry a creation time, weights do not: two trainings from the same inputs and seed give
    the same digest.
    """
    h = hashlib.sha256()
    for path in sorted(directory.rglob("weights.npz")):
        h.update(path.relative_to(directory).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def manifests_digest(directory: Path) -> str:
    """sha256 over the head manifests directly under ``directory`` (each names its weights' sha256)."""
    h = hashlib.sha256()
    if directory.is_dir():
        for path in sorted(directory.glob("*/manifest.json")):
            h.update(path.parent.name.encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class VersionInfo:
    """One registry version as ``version.json`` describes it (plus its verdicts)."""

    version: str
    parent: str | None
    created_at: str
    path: Path
    data: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    encoders: list[str] = field(default_factory=list)
    pairs: list[dict[str, str]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResolvedRouters:
    """Where heads load from and which version that is (for ``/v1/route`` and decision records)."""

    directory: Path
    version: str
    registry: Path | None = None


class RouterRegistry:
    """A registry directory (created with :meth:`init` or on the first :meth:`add_version`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ---------------------------------------------------------------- reading

    def exists(self) -> bool:
        """Whether ``registry.json`` is there."""
        return is_registry(self.root)

    def version_ids(self) -> list[str]:
        """Every complete version's id, oldest first."""
        base = self.root / VERSIONS_DIR
        if not base.is_dir():
            return []
        ids = [d.name for d in base.iterdir() if _VERSION_ID.match(d.name) and (d / VERSION_FILE).is_file()]
        return sorted(ids, key=_sequence)

    def versions(self) -> list[VersionInfo]:
        """Every version, oldest first."""
        return [self.info(v) for v in self.version_ids()]

    def info(self, version: str) -> VersionInfo:
        """One version's ``version.json`` and verdicts (``KeyError`` for an unknown id)."""
        directory = self.version_dir(version)
        raw = json.loads((directory / VERSION_FILE).read_text())
        verdicts_path = directory / VERDICTS_FILE
        verdicts = json.loads(verdicts_path.read_text()) if verdicts_path.exists() else []
        return VersionInfo(
            version=raw["version"],
            parent=raw.get("parent"),
            created_at=str(raw.get("created_at", "")),
            path=directory,
            data=list(raw.get("data", [])),
            metrics=dict(raw.get("metrics", {})),
            encoders=list(raw.get("encoders", [])),
            pairs=list(raw.get("pairs", [])),
            verdicts=list(verdicts),
            raw=raw,
        )

    def version_dir(self, version: str) -> Path:
        """The directory of ``version`` (``KeyError`` when the registry has no such version)."""
        if not _VERSION_ID.match(version):
            raise KeyError(f"{version!r} is not a version id (like v0001-0123abcd)")
        directory = self.root / VERSIONS_DIR / version
        if not (directory / VERSION_FILE).is_file():
            known = ", ".join(self.version_ids()) or "none"
            raise KeyError(f"no version {version!r} in registry {self.root} (versions: {known})")
        return directory

    def active(self) -> dict[str, Any] | None:
        """``active.json`` (None when no version is active)."""
        path = self.root / ACTIVE_FILE
        if not path.is_file():
            return None
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def pruned(self) -> list[dict[str, Any]]:
        """``pruned.json``: one entry per version :meth:`prune` deleted, oldest first."""
        path = self.root / PRUNED_FILE
        entries: list[dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else []
        return entries

    def active_version(self) -> str | None:
        """The active version's id, or None."""
        active = self.active()
        return str(active["version"]) if active else None

    # ---------------------------------------------------------------- writing

    def init(self) -> None:
        """Create the registry (idempotent); refuses a non-empty directory that is not one."""
        if self.exists():
            return
        if self.root.exists() and any(p.name != LOCK_FILE for p in self.root.iterdir()):
            raise ValueError(
                f"{self.root} is a non-empty directory that is not a router registry (no {REGISTRY_FILE}); "
                "give an empty or new directory"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / REGISTRY_FILE, {"format": FORMAT})

    def staging_dir(self) -> Path:
        """A fresh directory inside the registry to write a version's heads into before :meth:`add_version`.

        Inside the registry so the final rename stays on one file system (atomic).
        """
        self.init()
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))

    def add_version(self, staging_dir: str | Path, info: Mapping[str, Any]) -> str:
        """Move ``staging_dir`` (heads) into the registry as a new version; return its id.

        ``info`` becomes ``version.json`` (with ``version``, ``parent``, ``created_at`` and
        ``weights_sha256`` filled in unless given). ``parent`` defaults to the active version. The first
        version of a registry with no active version becomes active; later ones only through
        :meth:`promote`.
        """
        self.init()
        staging = Path(staging_dir)
        if staging.resolve().parent != self.root.resolve():
            # Staged elsewhere (perhaps another file system): copy it in first so the final step is a
            # rename within the registry. The caller's directory is left as it was.
            local = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
            shutil.copytree(staging, local, dirs_exist_ok=True)
            staging = local
        digest = weights_digest(staging)
        with self._locked():
            active = self.active_version()
            ids = self.version_ids()
            number = (_sequence(ids[-1]) + 1) if ids else 1
            version = f"v{number:04d}-{digest[:8]}"
            record = {
                "parent": active,
                "created_at": _now_iso(),
                **dict(info),
                "version": version,
                "weights_sha256": digest,
            }
            write_json_atomic(staging / VERSION_FILE, record)
            target = self.root / VERSIONS_DIR / version
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, target)
            _fsync_dir(target.parent)
            if active is None:
                self._promote_locked(version, {"decision": "promoted", "reason": "first version of the registry"})
        return version

    def promote(self, version: str, verdict: Mapping[str, Any]) -> None:
        """Make ``version`` active (atomically) and record ``verdict`` with it."""
        with self._locked():
            self._promote_locked(version, verdict)

    def record_verdict(self, version: str, verdict: Mapping[str, Any]) -> None:
        """Append ``verdict`` (a promotion's or a refusal's numbers) to the version's ``verdicts.json``."""
        with self._locked():
            self._record_locked(version, verdict)

    def prune(self, keep: int, protect: Iterable[str] = (), *, dry_run: bool = False) -> list[str]:
        """Delete old versions; return the ids deleted (or, with ``dry_run``, that would be), oldest first.

        Kept: the ``keep`` (>= 1) newest versions, the active one, the previous one (where a rollback goes)
        and every id in ``protect`` (versions that configs pin, e.g. experiment arms). Each deletion is
        recorded in ``pruned.json`` (id, parent, weights sha256, when, by whom). A version is first renamed
        out of ``versions/`` (atomic: a reader sees it whole or not at all), then removed.
        """
        if keep < 1:
            raise ValueError("keep must be at least 1: the newest version numbers the next one")
        with self._locked():
            ids = self.version_ids()
            active = self.active() or {}
            kept = set(ids[-keep:]) | {active.get("version"), active.get("previous")} | set(protect)
            doomed = [v for v in ids if v not in kept]
            if dry_run or not doomed:
                return doomed
            for stale in (self.root / VERSIONS_DIR).glob(".pruned-*"):  # a prune that stopped part-way
                shutil.rmtree(stale, ignore_errors=True)
            log = self.pruned()
            user = operator_name()
            for version in doomed:
                info = self.info(version)
                log.append({"version": version, "parent": info.parent, "created_at": info.created_at,
                            "weights_sha256": info.raw.get("weights_sha256"), "pruned_at": _now_iso(), "user": user})
            # The record first: a crash part-way leaves a version listed as pruned but still on disk (pruning
            # again removes it), never one gone without a trace.
            write_json_atomic(self.root / PRUNED_FILE, log)
            for version in doomed:
                directory = self.root / VERSIONS_DIR / version
                aside = directory.with_name(f".pruned-{version}")
                os.replace(directory, aside)
                shutil.rmtree(aside)
            _fsync_dir(self.root / VERSIONS_DIR)
        return doomed

    def _promote_locked(self, version: str, verdict: Mapping[str, Any]) -> None:
        self.version_dir(version)  # KeyError for an unknown id, before anything is written
        stamped = {"at": _now_iso(), **dict(verdict)}
        self._record_locked(version, stamped)
        previous = self.active_version()
        write_json_atomic(
            self.root / ACTIVE_FILE,
            {"version": version, "promoted_at": stamped["at"], "verdict": stamped, "previous": previous},
        )

    def _record_locked(self, version: str, verdict: Mapping[str, Any]) -> None:
        path = self.version_dir(version) / VERDICTS_FILE
        verdicts = json.loads(path.read_text()) if path.exists() else []
        verdicts.append({"at": _now_iso(), **dict(verdict)})
        write_json_atomic(path, verdicts)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK_FILE, "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _sequence(version: str) -> int:
    match = _VERSION_ID.match(version)
    return int(match.group(1)) if match else -1


def operator_name() -> str:
    """Who is changing the registry (recorded with forced promotions and prunes)."""
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"


def _now_iso() -> str:
    # The same form as a version's created_at (evals.train.created_at): one format across a registry.
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def resolve_routers_dir(path: str | Path | None) -> ResolvedRouters:
    """The directory to load heads from and its version id.

    - a registry: its active version's directory and id; with no active version the shipped artifacts
      (``bundled-<sha>``), the fallback;
    - a plain directory of heads: itself, ``dir-<sha>`` (sha over its head manifests, so retraining into it
      changes the id);
    - a missing directory, or one with no heads (a registry ``pointsman train --out`` has yet to write):
      the shipped artifacts, ``bundled-<sha>``, like no directory at all: the shipped heads are what serve,
      and a ``dir-`` id would pass them off as the operator's own;
    - None: the shipped artifacts, ``bundled-<sha>``.
    """
    if path is not None and str(path) != "":
        root = Path(path)
        if is_registry(root):
            registry = RouterRegistry(root)
            active = registry.active_version()
            if active is not None:
                return ResolvedRouters(registry.version_dir(active), active, registry=root)
            return ResolvedRouters(SHIPPED_ROUTERS_DIR, _bundled_version(), registry=root)
        if has_heads(root):
            return ResolvedRouters(root, f"dir-{manifests_digest(root)[:8]}")
    return ResolvedRouters(SHIPPED_ROUTERS_DIR, _bundled_version())


def has_heads(directory: Path) -> bool:
    """Whether ``directory`` holds at least one trained head (``*/manifest.json``)."""
    return directory.is_dir() and any(directory.glob("*/manifest.json"))


_BUNDLED: str | None = None


def _bundled_version() -> str:
    # The shipped artifacts never change while the process runs: hash them once.
    global _BUNDLED
    if _BUNDLED is None:
        _BUNDLED = f"bundled-{manifests_digest(SHIPPED_ROUTERS_DIR)[:8]}"
    return _BUNDLED


def active_marker(path: str | Path | None) -> str:
    """A cheap token that changes whenever the heads :func:`resolve_routers_dir` returns would change.

    For a registry: the bytes of ``active.json`` (one small read; a promotion rewrites it). For a plain
    directory: size and mtime of every head manifest (a retrain into it rewrites them). For None: a
    constant.
    """
    if path is None or str(path) == "":
        return "bundled"
    root = Path(path)
    if is_registry(root):
        try:
            return "registry:" + hashlib.sha256((root / ACTIVE_FILE).read_bytes()).hexdigest()
        except FileNotFoundError:
            return "registry:none"
    parts = []
    if root.is_dir():
        for manifest in sorted(root.glob("*/manifest.json")):
            with contextlib.suppress(FileNotFoundError):
                st = manifest.stat()
                parts.append(f"{manifest.parent.name}:{st.st_size}:{st.st_mtime_ns}")
    return "dir:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()
