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
same sequence number. Files and directories get the modes an ordinary write would (0666 / 0777 less the
umask), so gateway replicas running as other users can read what a training run wrote.

A registry that cannot be read or written raises :class:`RegistryError` (a ``ValueError``), one line naming
the file: a corrupt JSON file, a path that is not a directory, a permission or file system error.

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
import socket
import tempfile
import time
import unicodedata
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
#: A version id, matched whole (``fullmatch``): ``$`` would also take an id with a trailing newline, and
#: ``\d`` digits of other scripts, neither of which names a directory a registry ever writes.
_VERSION_ID = re.compile(r"v([0-9]{4,})-[0-9a-f]{8}")
STAGING_PREFIX = ".staging-"
#: A staging directory with no owner record this process can check (another host's, a copy made by
#: add_version) is taken as abandoned once untouched this long: no training run writes nothing for a day.
STAGING_ORPHAN_SECONDS = 24 * 3600


class RegistryError(ValueError):
    """A registry that cannot be read or written (a corrupt file, a path that is not a directory, no
    permission). The message is one line naming the file; callers print it and exit 2."""


def slug(name: str) -> str:
    """A model name as a directory-name part: ASCII lower case, runs of other characters as one ``-``.

    ``gpt-4-1106-preview`` stays itself; ``mistralai/Mixtral-8x7B-Instruct-v0.1`` becomes
    ``mistralai-mixtral-8x7b-instruct-v0-1``. Accents are dropped (``Modèle`` -> ``modele``); a name with
    other non-ASCII letters or digits (``模型-ü``), or with none at all, gets the first 8 hex digits of
    the sha256 of the exact name appended, so what the ASCII form loses still tells names apart. A form
    longer than :data:`MAX_SLUG` characters is cut and gets that hash too: two such names in one head's
    directory name would pass the file system's 255 bytes. Never contains ``--``, so ``<strong>--<weak>``
    splits. Raises ``ValueError`` for an empty name.
    """
    if not name:
        raise ValueError("a model name cannot be empty")
    # NFKD splits an accented letter into its base letter and a combining mark: the mark is dropped, the
    # letter kept. Full-width forms fold to ASCII too.
    decomposed = "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))
    out = re.sub(r"[^a-z0-9]+", "-", decomposed.encode("ascii", "ignore").decode().lower()).strip("-")
    lost = any(not c.isascii() and c.isalnum() for c in decomposed)
    if len(out) > MAX_SLUG:
        out, lost = out[: MAX_SLUG - 9].rstrip("-"), True
    if lost or not out:
        out = "-".join(part for part in (out, name_hash(name)) if part)
    return out


#: The longest slug: a pair head's directory holds two (each maybe with a collision hash, 9 more) and stays
#: well under the 255 bytes file systems allow in a name.
MAX_SLUG = 80


def name_hash(name: str) -> str:
    """The first 8 hex digits of the sha256 of ``name`` (UTF-8): what tells apart names that slug alike."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]


def model_slugs(models: Iterable[str]) -> dict[str, str]:
    """Each model's directory-name part, distinct across ``models``.

    Names that :func:`slug` makes alike (``Model-A`` and ``model/a``) each get :func:`name_hash` of the
    exact name appended, so their heads never share a directory. A name that collides with no other
    keeps its plain slug, the name earlier versions gave it.
    """
    names = sorted(set(models))
    plain = {m: slug(m) for m in names}
    count: dict[str, int] = {}
    for s in plain.values():
        count[s] = count.get(s, 0) + 1
    out = {m: (s if count[s] == 1 else f"{s}-{name_hash(m)}") for m, s in plain.items()}
    # An appended hash could, in theory, rebuild another model's plain slug: refuse rather than overwrite.
    if len(set(out.values())) != len(out):
        clash = sorted(m for m in names if list(out.values()).count(out[m]) > 1)
        raise RegistryError(f"model names {', '.join(map(repr, clash))} give the same head directory name")
    return out


def pair_artifact(strong: str, weak: str, encoder: str, slugs: Mapping[str, str] | None = None) -> str:
    """Directory name of the difficulty head for ``strong`` vs ``weak`` on ``encoder``.

    ``slugs`` (from :func:`model_slugs` over every model trained together) keeps apart models whose names
    slug alike; without it each name is slugged alone. Heads load by their manifest's ``model_pair``, not by
    this name, so versions written with other names stay loadable.
    """
    slugs = slugs or {}
    return PAIR_ARTIFACT.format(strong=slugs.get(strong) or slug(strong), weak=slugs.get(weak) or slug(weak),
                                encoder=encoder)


def process_umask() -> int:
    """The process's umask, without changing it when ``/proc`` tells (``os.umask`` can only set it, and a
    thread creating a file between the set and the restore would use the wrong one)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _chmod_default(path: str | Path, fd: int | None = None, *, directory: bool) -> None:
    # mkstemp and mkdtemp create 0600 / 0700 whatever the umask: give the mode an ordinary open() or mkdir()
    # would, so a gateway replica running as another user (same group, or any user) can read the registry.
    mode = (0o777 if directory else 0o666) & ~process_umask()
    if fd is not None:
        os.fchmod(fd, mode)
    else:
        os.chmod(path, mode)


def _os_error(exc: OSError, path: str | Path, doing: str) -> RegistryError:
    """One line naming the file ``exc`` is about (else ``path``) and what was being done."""
    where = exc.filename if exc.filename is not None else path
    return RegistryError(f"{where}: cannot {doing}: {exc.strerror or exc}")


def read_json_file(path: Path) -> Any:
    """``path``'s JSON; :class:`RegistryError` naming the file when it cannot be read or is not JSON.

    ``FileNotFoundError`` passes through (callers treat a missing file as "none")."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _os_error(exc, path, "read it") from None
    except UnicodeDecodeError:
        raise RegistryError(f"{path}: not UTF-8 text; the registry file is corrupt") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RegistryError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); the registry file is corrupt") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so readers see the old content or the new, never a mix.

    The file gets the mode an ordinary write would (0666 less the umask). Raises :class:`RegistryError`
    naming the file when it cannot be written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _os_error(exc, path, "write it") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            _chmod_default(tmp, fh.fileno(), directory=False)
            json.dump(obj, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _os_error(exc, path, "write it") from None
        raise


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
    """A registry directory (created with :meth:`init` or on the first :meth:`add_version`).

    A registry that cannot be read or written (a corrupt JSON file, a path that is not a directory, no
    permission) raises :class:`RegistryError`, a ``ValueError`` whose one-line message names the file.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ---------------------------------------------------------------- reading

    def exists(self) -> bool:
        """Whether ``registry.json`` is there."""
        return is_registry(self.root)

    def check_format(self) -> None:
        """Raise :class:`RegistryError` unless ``registry.json`` is a registry record this code reads."""
        path = self.root / REGISTRY_FILE
        try:
            raw = read_json_file(path)
        except FileNotFoundError:
            raise RegistryError(f"{self.root}: not a router registry (no {REGISTRY_FILE})") from None
        fmt = raw.get("format") if isinstance(raw, dict) else None
        if isinstance(fmt, bool) or not isinstance(fmt, int):
            raise RegistryError(f"{path}: no format number ({{\"format\": {FORMAT}}}); the registry file is corrupt")
        if fmt > FORMAT:
            raise RegistryError(f"{path}: format {fmt} is newer than this pointsman reads ({FORMAT}); upgrade it")

    def version_ids(self) -> list[str]:
        """Every complete version's id, oldest first."""
        base = self.root / VERSIONS_DIR
        try:
            if not base.is_dir():
                return []
            ids = [d.name for d in base.iterdir() if _VERSION_ID.fullmatch(d.name) and (d / VERSION_FILE).is_file()]
        except OSError as exc:
            raise _os_error(exc, base, "list the versions") from None
        return sorted(ids, key=_sequence)

    def versions(self) -> list[VersionInfo]:
        """Every version, oldest first."""
        return [self.info(v) for v in self.version_ids()]

    def info(self, version: str) -> VersionInfo:
        """One version's ``version.json`` and verdicts (``KeyError`` for an unknown id)."""
        directory = self.version_dir(version)
        path = directory / VERSION_FILE
        try:
            raw = read_json_file(path)
        except FileNotFoundError:  # pruned since version_dir looked
            raise KeyError(f"no version {version!r} in registry {self.root}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("version"), str):
            raise RegistryError(f"{path}: not a version record (an object with a version); the file is corrupt")
        fields: dict[str, type] = {"data": list, "metrics": dict, "encoders": list, "pairs": list}
        for key, kind in fields.items():
            if not isinstance(raw.get(key, kind()), kind):
                raise RegistryError(f"{path}: {key} is not a JSON {'list' if kind is list else 'object'}")
        return VersionInfo(
            version=raw["version"],
            parent=raw.get("parent"),
            created_at=str(raw.get("created_at", "")),
            path=directory,
            data=list(raw.get("data", [])),
            metrics=dict(raw.get("metrics", {})),
            encoders=list(raw.get("encoders", [])),
            pairs=list(raw.get("pairs", [])),
            verdicts=self._verdicts(directory),
            raw=raw,
        )

    def _verdicts(self, directory: Path) -> list[dict[str, Any]]:
        path = directory / VERDICTS_FILE
        try:
            verdicts = read_json_file(path)
        except FileNotFoundError:
            return []
        if not isinstance(verdicts, list):
            raise RegistryError(f"{path}: not a list of verdicts; the file is corrupt")
        return verdicts

    def version_dir(self, version: str) -> Path:
        """The directory of ``version`` (``KeyError`` when the registry has no such version)."""
        if not _VERSION_ID.fullmatch(version):
            raise KeyError(f"{version!r} is not a version id (like v0001-0123abcd)")
        directory = self.root / VERSIONS_DIR / version
        if not (directory / VERSION_FILE).is_file():
            known = ", ".join(self.version_ids()) or "none"
            raise KeyError(f"no version {version!r} in registry {self.root} (versions: {known})")
        return directory

    def active(self) -> dict[str, Any] | None:
        """``active.json`` (None when no version is active)."""
        path = self.root / ACTIVE_FILE
        try:
            data = read_json_file(path)
        except FileNotFoundError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("version"), str):
            raise RegistryError(f"{path}: not an active-version record (an object with a version); the file is corrupt")
        return data

    def pruned(self) -> list[dict[str, Any]]:
        """``pruned.json``: one entry per version :meth:`prune` deleted, oldest first."""
        path = self.root / PRUNED_FILE
        try:
            entries = read_json_file(path)
        except FileNotFoundError:
            return []
        if not isinstance(entries, list):
            raise RegistryError(f"{path}: not a list of pruned versions; the file is corrupt")
        return entries

    def active_version(self) -> str | None:
        """The active version's id, or None."""
        active = self.active()
        return str(active["version"]) if active else None

    def check_writable(self) -> None:
        """Raise :class:`RegistryError` unless a version could be added here now.

        For a training run to call before its long part, so a registry it cannot write fails in a second,
        not after the training. An existing registry: its ``registry.json`` and ``active.json`` read well,
        ``versions`` is a directory, the directories are writable and the lock can be taken. A new one: the
        nearest existing parent is a writable directory.
        """
        root = self.root
        if not (root.exists() or root.is_symlink()):
            ancestor = root.parent
            while not (ancestor.exists() or ancestor.is_symlink()):
                ancestor = ancestor.parent
            if not ancestor.is_dir():
                raise RegistryError(f"{ancestor}: not a directory, so the registry {root} cannot be created in it")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise RegistryError(
                    f"{ancestor}: not writable ({unwritable_reason(ancestor)}), so the registry {root} cannot be "
                    "created in it"
                )
            return
        if not root.is_dir():
            raise RegistryError(f"{root}: not a directory")
        versions = root / VERSIONS_DIR
        if self.exists():
            self.check_format()
            self.active()
            if (versions.exists() or versions.is_symlink()) and not versions.is_dir():
                raise RegistryError(f"{versions}: not a directory; a registry keeps its versions in it")
            self.version_ids()
        for directory in (root, versions):
            if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):
                raise RegistryError(f"{directory}: not writable ({unwritable_reason(directory)})")
        if self.exists():  # an empty directory gets its lock file only once a run writes into it
            with self._locked():
                pass

    # ---------------------------------------------------------------- writing

    def init(self) -> None:
        """Create the registry (idempotent); refuses a non-empty directory that is not one."""
        if self.exists():
            self.check_format()
            return
        try:
            if self.root.exists() and any(p.name != LOCK_FILE for p in self.root.iterdir()):
                raise RegistryError(
                    f"{self.root} is a non-empty directory that is not a router registry (no {REGISTRY_FILE}); "
                    "give an empty or new directory"
                )
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(exc, self.root, "create the registry") from None
        write_json_atomic(self.root / REGISTRY_FILE, {"format": FORMAT})

    def staging_dir(self) -> Path:
        """A fresh directory inside the registry to write a version's heads into before :meth:`add_version`.

        Inside the registry so the final rename stays on one file system (atomic). Made under the lock, so
        :meth:`remove_if_unused` in another process never removes the registry between the two steps.
        """
        with self._locked():
            self.init()
            try:
                path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))
                _chmod_default(path, directory=True)
                # Beside it, not in it (the directory becomes the version): who writes it, so a prune can
                # tell a run that was killed from one still training.
                write_json_atomic(_owner_file(path), _this_process())
            except OSError as exc:
                raise _os_error(exc, self.root, "create a staging directory in the registry") from None
        return path

    def discard_staging(self, staging: Path) -> None:
        """Remove a staging directory a run gives up on (and its owner record); never raises."""
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            _owner_file(staging).unlink()

    def abandoned_staging(self) -> list[Path]:
        """Staging directories left by training runs that died before adding their version (a SIGKILL, a
        lost machine): their process is gone from this host, or, with no owner this host can check, they
        have not been touched for :data:`STAGING_ORPHAN_SECONDS`."""
        try:
            candidates = sorted(p for p in self.root.glob(STAGING_PREFIX + "*") if p.is_dir())
        except OSError:
            return []
        return [p for p in candidates if _abandoned(p)]

    def remove_abandoned_staging(self) -> list[Path]:
        """Delete :meth:`abandoned_staging` (and their owner records) under the lock; return what went."""
        with self._locked():
            gone = self.abandoned_staging()
            for path in gone:
                self.discard_staging(path)
        return gone

    def add_version(self, staging_dir: str | Path, info: Mapping[str, Any]) -> str:
        """Move ``staging_dir`` (heads) into the registry as a new version; return its id.

        ``info`` becomes ``version.json`` (with ``created_at`` filled in unless given, and ``version``,
        ``parent`` and ``weights_sha256`` always set here). ``parent`` is the version active when the
        version is added, read under the lock: a run that started before another's first version was added
        still names it. The first version of a registry with no active version becomes active; later ones
        only through :meth:`promote`.
        """
        self.init()
        staging = Path(staging_dir)
        local: Path | None = None
        try:
            if staging.resolve().parent != self.root.resolve():
                # Staged elsewhere (perhaps another file system): copy it in first so the final step is a
                # rename within the registry. The caller's directory is left as it was.
                local = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))
                shutil.copytree(staging, local, dirs_exist_ok=True)
                _chmod_default(local, directory=True)
                staging = local
            digest = weights_digest(staging)
        except OSError as exc:
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)
            raise _os_error(exc, staging, "read the staged version") from None
        try:
            with self._locked():
                return self._add_locked(staging, info, digest)
        except BaseException:
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)
            raise

    def _add_locked(self, staging: Path, info: Mapping[str, Any], digest: str) -> str:
        current = self.active() or {}
        active = current.get("version")
        # Numbered after every id the registry still names, not only after the directories left: a version
        # deleted by hand (the active one, its previous, a pruned one) must never see its id handed out
        # again, or a gateway serving it would take the new version for the one it already has.
        named = [*self.version_ids(), str(active), str(current.get("previous")),
                 *(str(entry.get("version")) for entry in self.pruned() if isinstance(entry, dict))]
        number = max([0, *(_sequence(v) for v in named)]) + 1
        version = f"v{number:04d}-{digest[:8]}"
        record = {
            "created_at": _now_iso(),
            **dict(info),
            "parent": active,
            "version": version,
            "weights_sha256": digest,
        }
        write_json_atomic(staging / VERSION_FILE, record)
        base = self.root / VERSIONS_DIR
        if (base.exists() or base.is_symlink()) and not base.is_dir():
            raise RegistryError(f"{base}: not a directory; a registry keeps its versions in it")
        try:
            base.mkdir(exist_ok=True)
            os.replace(staging, base / version)
            _fsync_dir(base)
        except OSError as exc:
            raise _os_error(exc, base / version, "add the version") from None
        with contextlib.suppress(OSError):
            _owner_file(staging).unlink()  # the staging directory is the version now
        if active is None:
            self._promote_locked(version, {"decision": "promoted", "reason": "first version of the registry"})
        return version

    def remove_if_unused(self, *, keep_directory: bool = False) -> bool:
        """Delete the registry when it holds only what :meth:`init` wrote; whether it did.

        For a run that created the registry and then failed or was interrupted: it leaves no half-made
        registry behind. Anything else in it (a version, another run's staging directory) keeps it. With
        ``keep_directory`` (an empty directory the run was given) only the registry's files go. Best
        effort: a registry that cannot be removed stays, and False says so.
        """
        if not self.root.is_dir():
            return False
        with self._locked():
            try:
                names = {p.name for p in self.root.iterdir()}
                # An owner record whose staging directory is gone keeps nothing: it goes with the registry.
                stale = {n for n in names if n.endswith(_OWNER_SUFFIX) and n.removesuffix(_OWNER_SUFFIX) not in names}
                versions = self.root / VERSIONS_DIR
                if names - stale - {REGISTRY_FILE, LOCK_FILE, VERSIONS_DIR}:
                    return False
                for name in stale:
                    (self.root / name).unlink(missing_ok=True)
                if VERSIONS_DIR in names and (not versions.is_dir() or any(versions.iterdir())):
                    return False
                if VERSIONS_DIR in names:
                    versions.rmdir()
                # The lock file goes too: a process waiting on it finds the file it locked unlinked and
                # locks the new one (see _locked).
                for name in (REGISTRY_FILE, LOCK_FILE):
                    (self.root / name).unlink(missing_ok=True)
                if not keep_directory:
                    self.root.rmdir()
            except OSError:
                return False
        return True

    def promote(self, version: str, verdict: Mapping[str, Any]) -> None:
        """Make ``version`` active (atomically) and record ``verdict`` with it."""
        with self._locked():
            self._promote_locked(version, verdict)

    def promote_over(self, version: str, verdict: Mapping[str, Any], expected: str | None) -> bool:
        """:meth:`promote`, but only while ``expected`` is still the active version (None: none is); whether it
        did. Checked under the lock, so a promotion another process makes meanwhile is never overwritten by
        one whose numbers were against the version it replaced."""
        with self._locked():
            if self.active_version() != expected:
                return False
            self._promote_locked(version, verdict)
        return True

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
        if dry_run:  # only reads: no lock, so a read-only registry (a mounted copy) can be asked too
            return self._doomed(keep, protect)
        with self._locked():
            doomed = self._doomed(keep, protect)
            if not doomed:
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
                try:
                    os.replace(directory, aside)
                    shutil.rmtree(aside)
                except OSError as exc:
                    raise _os_error(exc, directory, "delete the version") from None
            _fsync_dir(self.root / VERSIONS_DIR)
        return doomed

    def _doomed(self, keep: int, protect: Iterable[str]) -> list[str]:
        """The versions a prune with these settings deletes, oldest first."""
        ids = self.version_ids()
        active = self.active() or {}
        kept = set(ids[-keep:]) | {active.get("version"), active.get("previous")} | set(protect)
        return [v for v in ids if v not in kept]

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
        directory = self.version_dir(version)
        verdicts = self._verdicts(directory)
        verdicts.append({"at": _now_iso(), **dict(verdict)})
        write_json_atomic(directory / VERDICTS_FILE, verdicts)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        path = self.root / LOCK_FILE
        held = None
        try:
            while held is None:
                self.root.mkdir(parents=True, exist_ok=True)
                try:
                    fh = open(path, "a+")  # noqa: SIM115 - held open until the context exits
                except FileNotFoundError:  # the registry was removed between the two steps: make it again
                    continue
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                    # remove_if_unused may have unlinked the file while this process waited for it: a lock on
                    # an unlinked file keeps no one out, so lock the one now at the path instead.
                    held = fh if _same_file(fh.fileno(), path) else None
                finally:
                    if held is None:
                        fh.close()
        except OSError as exc:
            raise _os_error(exc, path, "lock the registry") from None
        try:
            yield
        finally:
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            held.close()


def unwritable_reason(path: Path) -> str:
    """Why ``path``, which ``os.access`` says cannot be written, cannot: a read-only file system or no
    write permission (which one tells the operator what to fix)."""
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "no write permission"


def _same_file(fd: int, path: Path) -> bool:
    st = os.fstat(fd)
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (at_path.st_dev, at_path.st_ino)


def is_version_id(text: str) -> bool:
    """Whether ``text`` reads as a registry version id (``v0002-1a2b3c4d``), not ``bundled-…`` or ``dir-…``."""
    return _VERSION_ID.fullmatch(text) is not None


def _sequence(version: str) -> int:
    match = _VERSION_ID.fullmatch(version)
    return int(match.group(1)) if match else -1


def operator_name() -> str:
    """Who is changing the registry (recorded with forced promotions and prunes): ``USER`` or ``LOGNAME``,
    else the name of the real user id (a container running as root often sets neither), else ``uid <n>``."""
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    import pwd  # POSIX only, like the registry's flock

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (an arbitrary --user in a container)
        return f"uid {os.getuid()}"


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

    A path that exists but is no directory (a file) raises :class:`RegistryError`: no training can ever
    make a registry of it, so serving the shipped heads in its name would hide the mistake for good.
    """
    if path is not None and str(path) != "":
        root = Path(path)
        if root.exists() and not root.is_dir():
            raise RegistryError(f"{root}: not a directory; give a router registry or a directory of heads")
        if is_registry(root):
            registry = RouterRegistry(root)
            active = registry.active_version()
            if active is not None:
                return ResolvedRouters(_active_dir(registry, active), active, registry=root)
            return ResolvedRouters(SHIPPED_ROUTERS_DIR, _bundled_version(), registry=root)
        if has_heads(root):
            return ResolvedRouters(root, f"dir-{manifests_digest(root)[:8]}")
    return ResolvedRouters(SHIPPED_ROUTERS_DIR, _bundled_version())


def _active_dir(registry: RouterRegistry, active: str) -> Path:
    """The directory of the version ``active.json`` names; :class:`RegistryError` naming that file when the
    registry has no such version (deleted by hand, a partial copy of the registry, an edited pointer)."""
    path = registry.root / ACTIVE_FILE
    if not _VERSION_ID.fullmatch(active):
        raise RegistryError(f"{path}: {active!r} is not a version id (like v0001-0123abcd); the file is corrupt")
    try:
        return registry.version_dir(active)
    except KeyError:
        known = ", ".join(registry.version_ids()) or "none"
        missing = registry.root / VERSIONS_DIR / active / VERSION_FILE
        raise RegistryError(
            f"{path}: names version {active}, which is not in the registry (no {missing}; versions: {known}); "
            "restore it, or make another active with pointsman promote VERSION --force --reason TEXT"
        ) from None


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

    For a registry: the bytes of ``active.json`` (one small read; a promotion rewrites it), and whether the
    version it names still has its ``version.json`` (one stat): a deleted active version (``rm -rf`` of its
    directory; no ``pointsman`` command does it) then fails the next reload, which names the missing file,
    instead of going unnoticed until a restart fails on it. For a plain directory: size and mtime of every
    head manifest (a retrain into it rewrites them). For None: a constant.
    """
    if path is None or str(path) == "":
        return "bundled"
    root = Path(path)
    if is_registry(root):
        marker = _registry_marker(root)
        # Something missing may mean the whole directory moved away between these reads: ask again, so
        # one move reads as one change (a registry gone), not two (no active version, then no registry),
        # which the watcher counted as two failed reloads.
        if not marker.endswith(":ok") and not is_registry(root):
            return _directory_marker(root)
        return marker
    return _directory_marker(root)


def _registry_marker(root: Path) -> str:
    """:func:`active_marker` of a registry: ``registry:none``, or ``registry:<sha of active.json>:ok`` (or
    ``:missing`` when the version it names has no ``version.json``)."""
    try:
        raw = (root / ACTIVE_FILE).read_bytes()
    except FileNotFoundError:
        return "registry:none"
    version = _named_version(raw)
    present = version is None or (root / VERSIONS_DIR / version / VERSION_FILE).is_file()
    return f"registry:{hashlib.sha256(raw).hexdigest()}:{'ok' if present else 'missing'}"


def _directory_marker(root: Path) -> str:
    """:func:`active_marker` of a plain directory of heads: size and mtime of every head manifest."""
    parts = []
    try:
        manifests = sorted(root.glob("*/manifest.json")) if root.is_dir() else []
    except FileNotFoundError:  # moved away while listed: as gone
        manifests = []
    for manifest in manifests:
        with contextlib.suppress(FileNotFoundError):
            st = manifest.stat()
            parts.append(f"{manifest.parent.name}:{st.st_size}:{st.st_mtime_ns}")
    return "dir:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _named_version(raw: bytes) -> str | None:
    """The version id ``active.json``'s bytes name, or None when they name none (a corrupt file, which
    loading reports)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) and _VERSION_ID.fullmatch(version) else None


_OWNER_SUFFIX = ".owner.json"


def _owner_file(staging: Path) -> Path:
    return staging.with_name(staging.name + _OWNER_SUFFIX)


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), which a recycled pid does not share."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rpartition(")")[2].split()[19])
    except (IndexError, ValueError):
        return None


def _this_process() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start_ticks": _start_ticks(os.getpid())}


def _alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        pass
    return start_ticks is None or _start_ticks(pid) in (None, start_ticks)


def _abandoned(staging: Path) -> bool:
    try:
        owner = json.loads(_owner_file(staging).read_text())
    except (OSError, ValueError):
        owner = None
    if isinstance(owner, dict) and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        start = owner.get("start_ticks")
        return not _alive(owner["pid"], start if isinstance(start, int) else None)
    try:
        return time.time() - staging.stat().st_mtime > STAGING_ORPHAN_SECONDS
    except OSError:
        return False
