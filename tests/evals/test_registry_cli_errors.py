"""``pointsman registry list/prune`` on registries that cannot be read or written: one line naming the file,
exit 2, never a traceback; and the helpers ``pointsman promote`` shares with it. Registries built by hand
(no training), so these run in a moment."""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from classifiers.registry import RouterRegistry
from evals.registry_cli import corrupt_file, error_line, int_at_least, os_error_line, unwritable
from gateway.cli import main


def _registry(root: Path, versions: int = 3) -> list[str]:
    """A registry of ``versions`` versions without heads (enough to list and prune)."""
    registry = RouterRegistry(root)
    ids = []
    for i in range(versions):
        staging = registry.staging_dir()
        (staging / "marker.txt").write_text(str(i))
        ids.append(registry.add_version(staging, {"data": [{"source": f"file:{i}.jsonl", "rows": 10 + i}]}))
    return ids


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["registry", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_and_prune_work_on_a_sound_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v1, v2, v3 = _registry(tmp_path / "routers")
    code, out, _ = _run(capsys, "list", "--registry", str(tmp_path / "routers"))
    assert code == 0 and f"* {v1}" in out and v3 in out
    code, out, _ = _run(capsys, "prune", "--registry", str(tmp_path / "routers"), "--keep", "1")
    assert code == 0 and out.startswith(f"deleted 1 version: {v2}")


@pytest.mark.parametrize(("name", "content", "what"), [
    ("active.json", "{", "not valid JSON"),
    ("active.json", '"v0001"', 'not a JSON object with a "version" string'),
    ("pruned.json", "{}", "not a JSON list of objects"),
    ("versions/{v2}/version.json", "\xff\xfe", "not valid JSON"),
    ("versions/{v2}/version.json", "[]", 'not a JSON object with a "version" string'),
    ("versions/{v2}/verdicts.json", "[1, 2]", "not a JSON list of objects"),
])
def test_a_corrupt_file_is_named_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str, what: str
) -> None:
    root = tmp_path / "routers"
    _, v2, _ = _registry(root)
    path = root / name.format(v2=v2)
    path.write_bytes(content.encode("latin-1"))
    problem = corrupt_file(root)
    assert problem is not None and problem.startswith(f"{path}: {what}")
    # A listing reads every file; a prune only those it needs (a dry run neither pruned.json nor a doomed
    # version's files; deleting a version needs nothing from its verdicts): it may go ahead, or stop naming it.
    for args in (["list"], ["list", "--json"], ["prune", "--keep", "1", "--dry-run"], ["prune", "--keep", "1"]):
        code, out, err = _run(capsys, *args, "--registry", str(root))
        if code == 0 and args[0] == "prune":
            continue
        assert code == 2 and out == "", (args, out)
        assert err.startswith(f"pointsman registry {args[0]}: ") and str(path) in err, (args, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_prune_stops_at_a_corrupt_file_it_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "routers"
    _, v2, _ = _registry(root)
    for name, content in (("pruned.json", "{}"), (f"versions/{v2}/version.json", "[]"), ("active.json", "{")):
        saved = (root / name).read_bytes() if (root / name).exists() else None
        (root / name).write_text(content)
        code, out, err = _run(capsys, "prune", "--keep", "1", "--registry", str(root))
        assert code == 2 and out == "" and f"{root / name}" in err and len(err.splitlines()) == 1, (name, err)
        assert v2 in RouterRegistry(root).version_ids() or name.endswith("version.json")
        if saved is None:
            (root / name).unlink()
        else:
            (root / name).write_bytes(saved)


def _not_writable_under(root: Path) -> Any:
    """``os.access`` as on a read-only mount for every path under ``root`` (tests may run as root, for whom
    chmod changes nothing)."""
    real = os.access

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if mode & os.W_OK and Path(path).resolve().is_relative_to(root.resolve()):
            return False
        return real(path, mode, **kwargs)

    return access


def test_prune_of_a_read_only_registry_is_refused_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import evals.registry_cli

    root = tmp_path / "routers"
    ids = _registry(root)
    monkeypatch.setattr(evals.registry_cli.os, "access", _not_writable_under(root))
    code, out, err = _run(capsys, "prune", "--registry", str(root), "--keep", "1")
    assert code == 2 and out == ""
    assert err.startswith(f"pointsman registry prune: cannot prune {root}: {root} is not writable (")
    assert RouterRegistry(root).version_ids() == ids and not (root / "pruned.json").exists()
    # Listing reads only, and so does a dry run: it takes no lock (creating .lock failed on a read-only mount).
    assert _run(capsys, "list", "--registry", str(root))[0] == 0
    (root / ".lock").unlink(missing_ok=True)
    code, out, _ = _run(capsys, "prune", "--registry", str(root), "--keep", "1", "--dry-run")
    assert code == 0 and "would delete" in out and not (root / ".lock").exists()
    assert RouterRegistry(root).version_ids() == ids


def test_a_file_system_error_during_prune_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "routers"
    _registry(root)

    def read_only(*args: Any, **kwargs: Any) -> list[str]:
        raise OSError(errno.EROFS, "Read-only file system", str(root / ".lock"))

    monkeypatch.setattr(RouterRegistry, "prune", read_only)
    code, _, err = _run(capsys, "prune", "--registry", str(root), "--keep", "1")
    assert code == 2 and err == f"pointsman registry prune: {root / '.lock'}: read-only file system\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission bits")
def test_prune_of_a_registry_without_write_permission_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "routers"
    _registry(root)
    root.chmod(0o555)
    try:
        code, _, err = _run(capsys, "prune", "--registry", str(root), "--keep", "1")
    finally:
        root.chmod(0o755)
    assert code == 2 and f"{root} is not writable (no write permission)" in err


def test_unwritable_checks_the_directories_and_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evals.registry_cli

    root = tmp_path / "routers"
    _registry(root, versions=1)
    assert unwritable(root, root / "versions", root / "not-there") is None
    monkeypatch.setattr(evals.registry_cli.os, "access", _not_writable_under(root / "versions"))
    assert unwritable(root) is None
    assert (unwritable(root, root / "versions") or "").startswith(f"{root / 'versions'} is not writable (")


def test_error_lines() -> None:
    assert os_error_line(OSError(errno.EROFS, "Read-only file system", "R/.lock")) == "R/.lock: read-only file system"
    assert os_error_line(OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b")) == (
        "a -> b: invalid cross-device link")
    assert os_error_line(OSError("no errno")) == "no errno"
    assert error_line(ValueError("R/active.json: not valid JSON\n(line 1)"), "x") == (
        "R/active.json: not valid JSON (line 1)")
    assert error_line(KeyError("version"), "R: cannot read the registry") == (
        "R: cannot read the registry (KeyError: 'version')")


def test_int_at_least_names_the_bound() -> None:
    parse = int_at_least(0)
    assert parse("0") == 0 and parse("7") == 7
    for bad in ("-1", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
            parse(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="give a whole number >= 1 \\(the newest"):
        int_at_least(1, " (the newest version is always kept)")("0")


def test_the_json_of_list_is_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "routers"
    _registry(root, versions=2)
    code, out, _ = _run(capsys, "list", "--registry", str(root), "--json")
    assert code == 0 and json.loads(out)["active"]


def _staged_by_a_process_that_died(root: Path) -> Path:
    """What a `pointsman train` killed mid-run leaves: a staging directory its (now gone) process made."""
    script = ("import os, sys; from classifiers.registry import RouterRegistry; "
              "p = RouterRegistry(sys.argv[1]).staging_dir(); (p / 'head.bin').write_bytes(b'x' * 4096); "
              "print(p); sys.stdout.flush(); os._exit(0)")
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def test_prune_removes_the_staging_directories_of_runs_that_died_and_keeps_live_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "routers"
    v1, _, _ = _registry(root)
    dead = _staged_by_a_process_that_died(root)
    live = RouterRegistry(root).staging_dir()  # this process: still training
    foreign_old, foreign_new = root / ".staging-foreign-old", root / ".staging-foreign-new"  # no owner to ask
    for path in (foreign_old, foreign_new):
        path.mkdir()
    day_and_more = time.time() - 25 * 3600
    os.utime(foreign_old, (day_and_more, day_and_more))
    code, out, _ = _run(capsys, "prune", "--registry", str(root), "--keep", "5", "--dry-run")
    assert code == 0 and "would remove 2 staging directories" in out and dead.exists()
    code, out, _ = _run(capsys, "prune", "--registry", str(root), "--keep", "5")
    assert code == 0 and "removed 2 staging directories" in out, out
    assert dead.name in out and foreign_old.name in out
    assert not dead.exists() and not foreign_old.exists() and live.exists() and foreign_new.exists()
    assert sorted(p.name for p in root.glob(".staging-*.owner.json")) == [live.name + ".owner.json"]
    # The live run finishes: its directory becomes the version, and nothing of the staging is left.
    version = RouterRegistry(root).add_version(live, {"data": []})
    assert not list(root.glob(live.name + "*")) and version in RouterRegistry(root).version_ids()
    assert RouterRegistry(root).active_version() == v1
