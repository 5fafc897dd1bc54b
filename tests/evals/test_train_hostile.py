"""``pointsman train`` and the router registry against what a hostile review threw at them: model names that
slug alike or are not ASCII, registry files other users must read, an ``--out`` the file system refuses, a bad
``--seed``, two runs into one new registry, malformed CSV rows, weight-0 rows and Ctrl-C. Each failure is one
line naming the file, line, field or option (exit 2; 130 when interrupted), and a failed run leaves nothing."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import classifiers.registry as registry_module
import evals.retrain as retrain
from classifiers.provider import load_router_heads
from classifiers.registry import RegistryError, RouterRegistry, model_slugs, pair_artifact, slug
from evals.labelled import DataError, load_file
from evals.retrain import TrainError
from evals.trained_rows import key_hashes, load_trained_rows
from gateway.cli import main
from tests.evals.labelled_files import STRONG, WEAK, rows, write_csv, write_jsonl
from tests.fakes.routers import add_version

# No warm start: these tests are about what is written and refused, not about the prior, and it is 3x faster.
TRAIN = ["--encoders", "static", "--no-progress", "--no-warm-start", "--folds", "2"]


def _train(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["train", *args, *TRAIN])
    out = capsys.readouterr()
    return code, out.out, out.err


def _renamed(items: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    """``items`` with their models renamed (``names``: old -> new)."""
    return [{**r, "scores": {names.get(m, m): q for m, q in r["scores"].items()},
             "costs": {names.get(m, m): c for m, c in r["costs"].items()}} for r in items]


def _one_line_error(code: int, stderr: str, *needles: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    for needle in needles:
        assert needle in stderr, stderr


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("labelled") / "labels.jsonl", rows(seed=3, n=60))


@pytest.fixture
def umask() -> Iterator[None]:
    """Restore the process umask a test changes."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


# ----------------------------------------------------------------------------- 1. names that slug alike


def test_models_whose_names_slug_alike_each_get_their_own_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = rows(seed=5, n=60)
    items = [{"prompt": r["prompt"], "scores": {"Model-A": r["scores"][STRONG], "model/a": 0.5 + r["scores"][WEAK] / 2,
                                                  "weak": r["scores"][WEAK]}} for r in base]
    path = write_jsonl(tmp_path / "alike.jsonl", items)
    out = tmp_path / "routers"
    code, _, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(out))
    assert code == 0, stderr
    (info,) = RouterRegistry(out).versions()
    artifacts = [p["artifact"] for p in info.pairs]
    assert len(info.pairs) == 3 and len(set(artifacts)) == 3
    # Every pair version.json names points at the head of that pair, not at another's.
    for pair in info.pairs:
        manifest = json.loads((info.path / pair["artifact"] / "manifest.json").read_text())
        assert manifest["model_pair"] == {"strong": pair["strong"], "weak": pair["weak"]}
    heads = load_router_heads("static", out)
    assert set(heads.pairs) == {(p["strong"], p["weak"]) for p in info.pairs}
    assert {m for p in heads.pairs for m in p} == {"Model-A", "model/a", "weak"}


def test_slugs_stay_as_before_unless_names_collide() -> None:
    # The names earlier versions gave their heads are kept (old registries and tests name them).
    assert pair_artifact("big-model", "small-model", "static") == "difficulty-big-model--small-model-static"
    assert model_slugs(["big-model", "small-model"]) == {"big-model": "big-model", "small-model": "small-model"}
    alike = model_slugs(["Model-A", "model/a", "weak"])
    assert alike["weak"] == "weak" and alike["Model-A"] != alike["model/a"]
    assert all(s.startswith("model-a-") and "--" not in s for m, s in alike.items() if m != "weak")
    assert model_slugs(["Model-A", "model/a"]) == model_slugs(["model/a", "Model-A"])  # order does not matter


# ----------------------------------------------------------------------------- 2. non-ASCII and empty names


def test_slug_handles_non_ascii_names() -> None:
    assert slug("Modèle-Français") == "modele-francais"  # accents dropped: nothing else lost
    cjk = slug("模型-ü")
    assert cjk.startswith("u-") and len(cjk) == len("u-") + 8 and cjk.isascii()
    assert slug("模型") != slug("模型2") and slug("模型").isascii()
    assert slug("!!!") != slug("???")  # no letters or digits at all: the hash alone
    with pytest.raises(ValueError, match="cannot be empty"):
        slug("")


def test_a_non_ascii_model_name_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "cjk.jsonl", _renamed(rows(seed=6, n=60), {STRONG: "模型-ü"}))
    out = tmp_path / "routers"
    code, stdout, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(out))
    assert code == 0, stderr
    assert "模型-ü (strong) vs small-model (weak)" in stdout
    assert set(load_router_heads("static", out).pairs) == {("模型-ü", WEAK)}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.jsonl", '{"prompt": "hi", "scores": {"": 1, "b": 0}}\n', "empty.jsonl:1: scores: an empty model name"),
        ("blank.jsonl", '{"prompt": "hi", "scores": {"  ": 1, "b": 0}}\n',
         "blank.jsonl:1: scores: an empty model name"),
        ("cost.jsonl", '{"prompt": "hi", "scores": {"a": 1}, "costs": {"": 0.1}}\n',
         "cost.jsonl:1: costs: an empty model name"),
        ("tab.jsonl", '{"prompt": "hi", "scores": {"a\\tb": 1}}\n', "tab.jsonl:1: scores: model name 'a\\tb' holds"),
        ("twice.jsonl", '{"prompt": "hi", "scores": {"a": 1, " a ": 0}}\n',
         "twice.jsonl:1: scores: 'a' and ' a ' name the same model"),
        ("empty.csv", "prompt,score:,score:b\nhi,1,0\n", "empty.csv:1: column 'score:': an empty model name"),
        ("cost.csv", "prompt,score:a,cost: \nhi,1,0\n", "cost.csv:1: column 'cost: ': an empty model name"),
    ],
)
def test_empty_and_unprintable_model_names_are_refused_where_they_are(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError) as err:
        load_file(path)
    assert str(err.value).startswith(f"{tmp_path}/") and message in str(err.value)


def test_model_names_lose_surrounding_spaces(tmp_path: Path) -> None:
    jsonl = tmp_path / "spaced.jsonl"
    jsonl.write_text('{"prompt": "hi", "scores": {" m1 ": 1, "m2": 0}, "costs": {"m1 ": 0.1}}\n')
    (row,) = load_file(jsonl)
    assert row.qualities == {"m1": 1.0, "m2": 0.0} and row.costs == {"m1": 0.1}
    csv_path = tmp_path / "spaced.csv"
    csv_path.write_text("prompt, score: m1 ,score:m2,cost: m1\nhi,1,0,0.1\n")
    (row,) = load_file(csv_path)
    assert row.qualities == {"m1": 1.0, "m2": 0.0} and row.costs == {"m1": 0.1}


def test_a_failed_training_leaves_no_registry_it_created(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise TrainError("the pair fit failed")

    monkeypatch.setattr(retrain, "train_pair", fail)
    # A new registry, with parent directories of its own: all gone again.
    new = tmp_path / "a" / "b" / "routers"
    code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(new))
    _one_line_error(code, stderr, "the pair fit failed")
    assert not (tmp_path / "a").exists()
    # An empty directory given as --out: it stays, empty.
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(empty))
    assert code == 2 and list(empty.iterdir()) == []
    code, _, stderr = _train(capsys, "--data", f"file:{tmp_path / 'missing.jsonl'}", "--out", str(empty))
    _one_line_error(code, stderr, "missing.jsonl: no such file")
    assert list(empty.iterdir()) == []  # refused before anything was written, not even the lock file
    # An existing registry: exactly as it was.
    registry = RouterRegistry(tmp_path / "existing")
    add_version(registry, {(STRONG, WEAK): 0.9})
    before = sorted(str(p.relative_to(registry.root)) for p in registry.root.rglob("*"))
    code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(registry.root))
    assert code == 2
    assert sorted(str(p.relative_to(registry.root)) for p in registry.root.rglob("*")) == before


def test_remove_if_unused_keeps_a_registry_someone_else_is_writing_into(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    staging = registry.staging_dir()  # another run's, still training
    assert not registry.remove_if_unused() and staging.is_dir()
    staging.rmdir()
    assert registry.remove_if_unused() and not registry.root.exists()
    registry.init()
    add_version(registry, {(STRONG, WEAK): 0.9})
    assert not registry.remove_if_unused() and registry.active_version() is not None


# ----------------------------------------------------------------------------- 3. modes by the umask


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_registry_files_and_directories_get_the_modes_the_umask_gives(
    tmp_path: Path, umask: None, mask: int, file_mode: int, dir_mode: int
) -> None:
    os.umask(mask)
    registry = RouterRegistry(tmp_path / "routers")
    version = add_version(registry, {(STRONG, WEAK): 0.9})
    registry.record_verdict(version, {"decision": "refused"})
    directory = registry.version_dir(version)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    for path in (registry.root / "registry.json", registry.root / "active.json", registry.root / ".lock",
                 directory / "version.json", directory / "verdicts.json"):
        assert mode(path) == file_mode, path
    for path in (registry.root, registry.root / "versions", directory):
        assert mode(path) == dir_mode, path


# ----------------------------------------------------------------------------- 4. an --out the file system refuses


def test_an_out_below_a_file_is_refused_before_training(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    code, stdout, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(afile / "sub"))
    _one_line_error(code, stderr, f"--out {afile / 'sub'}: {afile}: not a directory")
    assert "loading" not in stdout  # refused before the data was even read


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("versions-file", "versions: not a directory"),
        ("registry.json", "registry.json:1: not valid JSON"),
        ("registry-format", "registry.json: no format number"),
        ("active.json", "active.json:1: not valid JSON"),
        ("active-shape", "active.json: not an active-version record"),
    ],
)
def test_a_broken_registry_is_one_line_naming_the_file_before_training(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str], breakage: str, message: str
) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    if breakage == "versions-file":
        registry.init()
        (registry.root / "versions").write_text("")
    else:
        add_version(registry, {(STRONG, WEAK): 0.9})
        broken = {"registry.json": ("registry.json", "{"), "registry-format": ("registry.json", "{}"),
                  "active.json": ("active.json", "not json"), "active-shape": ("active.json", "[]")}[breakage]
        (registry.root / broken[0]).write_text(broken[1])
    code, stdout, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(registry.root))
    _one_line_error(code, stderr, f"--out {registry.root}: {registry.root}/", message)
    assert "loading" not in stdout


def test_an_unwritable_registry_is_refused_before_training(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    add_version(registry, {(STRONG, WEAK): 0.9})
    real_access = os.access
    # Root may write anywhere, so the permission is taken away where the check asks for it.
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: Path(path) != registry.root and real_access(path, mode, **kw)
    )
    code, stdout, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(registry.root))
    _one_line_error(code, stderr, f"{registry.root}: not writable")
    assert "loading" not in stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_registry_is_refused_before_training(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    add_version(registry, {(STRONG, WEAK): 0.9})
    paths = [registry.root, *registry.root.rglob("*")]
    for path in paths:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
    try:
        code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(registry.root))
    finally:
        for path in paths:
            path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)
    _one_line_error(code, stderr, str(registry.root))


def test_file_system_errors_in_the_registry_are_registry_errors_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    version = add_version(registry, {(STRONG, WEAK): 0.9})
    assert issubclass(RegistryError, ValueError)  # what promote and registry's CLIs catch

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system", str(registry.root / ".lock"))

    with monkeypatch.context() as patch:
        patch.setattr(registry_module, "open", read_only, raising=False)
        with pytest.raises(RegistryError, match=r"routers/\.lock: cannot lock the registry: Read-only file system"):
            registry.promote(version, {"decision": "promoted"})
    with monkeypatch.context() as patch:
        patch.setattr(tempfile, "mkdtemp", read_only)
        with pytest.raises(RegistryError, match="Read-only file system"):
            registry.staging_dir()
    # A corrupt version.json, verdicts.json or pruned.json: the file, not a JSONDecodeError.
    (registry.version_dir(version) / "verdicts.json").write_text("{")
    with pytest.raises(RegistryError, match=r"verdicts\.json:1: not valid JSON"):
        registry.info(version)
    (registry.version_dir(version) / "version.json").write_text('{"no": "version"}')
    with pytest.raises(RegistryError, match=r"version\.json: not a version record"):
        registry.versions()
    (registry.root / "pruned.json").write_text("{}")
    with pytest.raises(RegistryError, match=r"pruned\.json: not a list"):
        registry.pruned()


def test_a_versions_file_fails_adding_a_version_with_a_registry_error(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    staging = registry.staging_dir()
    (registry.root / "versions").write_text("")
    with pytest.raises(RegistryError, match=r"routers/versions: not a directory"):
        registry.add_version(staging, {})


# ----------------------------------------------------------------------------- 5. --seed


@pytest.mark.parametrize("seed", ["-1", "x", str(2**32)])
def test_a_bad_seed_is_a_usage_error_naming_the_option(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str], seed: str
) -> None:
    out = tmp_path / "routers"
    with pytest.raises(SystemExit) as usage:
        main(["train", "--data", f"file:{labelled}", "--out", str(out), "--seed", seed, *TRAIN])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed" in err and "Traceback" not in err
    assert not out.exists()


# ----------------------------------------------------------------------------- 6. two runs into one new registry


def test_the_parent_is_the_version_active_when_the_new_one_is_added(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "routers"
    real = retrain.train_pair
    other: list[str] = []

    def with_a_concurrent_run(*args: Any, **kwargs: Any) -> Any:
        if not other:  # another `pointsman train` finishes first, while this one trains
            other.append(add_version(RouterRegistry(out), {(STRONG, WEAK): 0.9}))
        return real(*args, **kwargs)

    monkeypatch.setattr(retrain, "train_pair", with_a_concurrent_run)
    code, stdout, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(out))
    assert code == 0, stderr
    registry = RouterRegistry(out)
    first, second = registry.versions()
    assert first.version == other[0] == registry.active_version()
    assert second.parent == first.version
    assert f"{second.version} is not active (active: {first.version})" in stdout


def test_add_version_sets_the_parent_itself(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    first = add_version(registry, {(STRONG, WEAK): 0.9})
    staging = registry.staging_dir()
    second = registry.add_version(staging, {"parent": None, "encoders": ["static"]})
    assert registry.info(second).parent == first


# ----------------------------------------------------------------------------- 7. CSV rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt,score:a,score:b\nok,1,0\nshort,1\n", "x.csv:3: 2 cells, but the header (line 1) has 3 columns"),
        ("prompt,score:a,score:b\nok,1,0\nlong,1,0,1\n", "x.csv:3: 4 cells, but the header (line 1) has 3 columns"),
        ("prompt,score:a,score:a\nok,1,0\n", "x.csv:1: column 'score:a' repeats column 'score:a'"),
        ("prompt,score:a,score: a \nok,1,0\n", "x.csv:1: column 'score: a ' repeats column 'score:a'"),
        ("prompt,prompt,score:a\nok,ok,1\n", "x.csv:1: column 'prompt' repeats column 'prompt'"),
        # A quoted prompt over three lines: the next rows' errors name the lines they start on.
        ('prompt,score:a,score:b\n"one\ntwo\nthree",1,0\n\nfine,1,0\nbad,1,2\n',
         "x.csv:7: scores.b: 2.0 is not a quality"),
        ('prompt,score:a,score:b\nok,1,0\n"a\nb",1,x\n', "x.csv:3: column score:b: 'x' is not a number"),
    ],
)
def test_malformed_csv_rows_are_refused_at_the_line_they_start(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(DataError) as err:
        load_file(path)
    assert str(err.value).startswith(f"{tmp_path}/"), err.value
    assert message in str(err.value)


def test_csv_written_by_the_csv_module_still_loads(tmp_path: Path) -> None:
    items = rows(seed=7, n=30)
    items[0]["prompt"] = 'Line one,\nline "two"\r\nline three'
    loaded = load_file(write_csv(tmp_path / "ok.csv", items))
    assert len(loaded) == 30 and loaded[0].messages[0]["content"] == items[0]["prompt"]


# ----------------------------------------------------------------------------- 8. weight-0 rows


def test_weight_zero_rows_are_not_training_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = rows(seed=8, n=50)
    for r in items[40:]:
        r["weight"] = 0
    path = write_jsonl(tmp_path / "weights.jsonl", items)
    out = tmp_path / "routers"
    code, stdout, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(out))
    assert code == 0, stderr
    assert "50 rows (10 with weight 0: not trained on)" in stdout
    (info,) = RouterRegistry(out).versions()
    (pair,) = info.metrics["pairs"]
    prompts = len({r["prompt"] for r in items[:40]})
    assert pair["rows"] == 40 and f"over {prompts} labelled prompts (40 rows labelled for both models)" in stdout
    trained = load_trained_rows(info.path, info.raw["trained_rows"])
    assert trained is not None
    rows_40 = load_file(path)[:40]
    assert np.array_equal(trained.hashes, np.unique(key_hashes(rows_40)))
    # 19 rows that weigh something (fewer prompts still) are too few for a pair, however many weigh nothing.
    for r in items[19:]:
        r["weight"] = 0
    code, stdout, stderr = _train(capsys, "--data", f"file:{write_jsonl(path, items)}", "--out", str(out))
    _one_line_error(code, stderr, f"{len({r['prompt'] for r in items[:19]})} prompts labelled for both (< 20)")


def test_a_pair_needs_twenty_prompts_not_twenty_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ten prompts each judged three times are 30 rows but ten prompts' evidence: the minimum counted rows,
    so such a file trained a head (and, into an empty registry, made it active at once)."""
    items = rows(seed=9, n=10)
    path = write_jsonl(tmp_path / "thrice.jsonl", [dict(r) for r in items for _ in range(3)])
    code, _, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(tmp_path / "routers"))
    _one_line_error(code, stderr, "10 prompts labelled for both (< 20)")
    assert not (tmp_path / "routers").exists() or not any((tmp_path / "routers").iterdir())


def test_all_weights_zero_is_an_early_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "zero.jsonl", [{**r, "weight": 0} for r in rows(seed=9, n=30)])
    out = tmp_path / "routers"
    code, stdout, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(out))
    _one_line_error(code, stderr, f"file:{path}: every labelled request has weight 0")
    assert "embedding" not in stdout and not out.exists()


# ----------------------------------------------------------------------------- 9. Ctrl-C


def test_ctrl_c_is_one_line_exit_130_and_writes_nothing(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(retrain, "train_pair", interrupted)
    out = tmp_path / "routers"
    code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(out))
    assert code == 130 and stderr == f"pointsman train: interrupted; nothing was written to {out}\n"
    assert not out.exists()
    registry = RouterRegistry(out)
    version = add_version(registry, {(STRONG, WEAK): 0.9})
    code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(out))
    assert code == 130 and "Traceback" not in stderr
    assert registry.version_ids() == [version] and not list(out.glob(".staging-*"))


def _installed_copy(root: Path) -> Path:
    """The packages as a wheel lays them out in site-packages (no checkout around them: no pyproject.toml)."""
    import shutil

    from tests.gatewayproc import REPO

    site = root / "site-packages"
    for package in ("gateway", "classifiers", "policies", "evals", "store"):
        shutil.copytree(REPO / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_an_installed_pointsman_trains_without_writing_into_its_package_directory(tmp_path: Path) -> None:
    """The embedding cache lived in <package dir>/../.cache: in an installed Pointsman that is site-packages,
    which the Docker image's uid 10001 cannot write, so `pointsman train` (and promote) stopped with
    "site-packages/.cache: Permission denied" before any training. Here the package directory has a file
    where that cache would go (root ignores permissions; a file in the way fails the same mkdir)."""
    import subprocess
    import sys

    site = _installed_copy(tmp_path)
    (site / ".cache").write_text("not a directory\n")
    labels = write_jsonl(tmp_path / "labels.jsonl", rows(seed=1, n=40))
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(home)}
    for key in ("POINTSMAN_CACHE_DIR", "XDG_CACHE_HOME"):
        env.pop(key, None)

    def train(out: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", "train", "--data", f"file:{labels}", "--encoders", "static",
             "--out", str(tmp_path / out), "--no-progress", "--folds", "3", "--no-warm-start"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**env, **extra},
        )

    run = train("routers")
    assert run.returncode == 0, run.stderr
    assert "wrote router version" in run.stdout
    assert (site / ".cache").read_text() == "not a directory\n"
    assert list((home / ".cache" / "pointsman" / "embeddings").glob("*.npy"))  # the user's cache instead
    # A cache directory that cannot be written either (POINTSMAN_CACHE_DIR as the image sets it, root-owned)
    # costs the cache, not the training.
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    again = train("routers2", POINTSMAN_CACHE_DIR=str(blocked))
    assert again.returncode == 0, again.stderr
    assert "cannot write the embedding cache" in again.stderr
    ids = [sorted(p.name for p in (tmp_path / out / "versions").iterdir()) for out in ("routers", "routers2")]
    assert ids[0] == ids[1]  # the same weights: the cache changes no number


def test_models_with_long_names_train_and_serve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two model names of 137 characters made a head directory name of 289 bytes: the training ran to its end,
    then saving the head failed with 'File name too long' and the version was lost."""
    long = "org/" + "very-long-descriptive-model-name-" * 4
    strong, weak = long + "A", long + "B"
    path = write_jsonl(tmp_path / "long.jsonl", _renamed(rows(seed=6, n=60), {STRONG: strong, WEAK: weak}))
    out = tmp_path / "routers"
    code, _, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(out))
    assert code == 0, stderr
    (info,) = RouterRegistry(out).versions()
    assert len(info.pairs[0]["artifact"]) < 200
    assert set(load_router_heads("static", out).pairs) == {(strong, weak)}
    assert slug(strong) != slug(weak) and "--" not in slug(strong) and slug(STRONG) == STRONG


def test_a_data_path_that_does_not_exist_is_named_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A mistyped labelled file without file: was read as the shared data directory and refused with
    # "no routellm/ under .../labels.jsonl", sending the user to look for RouteLLM data.
    missing = tmp_path / "labels.jsonl"
    for options in ([], TRAIN):  # the shipped artifacts' rebuild, and a registry version (--no-warm-start)
        code = main(["train", "--data", str(missing), "--out", str(tmp_path / "routers"), *options])
        stderr = capsys.readouterr().err
        _one_line_error(code, stderr, f"pointsman train: --data {missing}: no such file or directory")
        assert "routellm" not in stderr
        assert not (tmp_path / "routers").exists()
