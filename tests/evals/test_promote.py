"""``pointsman promote``: a better version is promoted, a worse or equal one refused, the verdict and its
numbers land in the registry either way, and usage errors exit 2. Real registries trained from real
labelled files with the static encoder."""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from classifiers.provider import load_router_heads
from classifiers.registry import RouterRegistry, operator_name
from evals.holdout import is_held_out
from evals.labelled import load_source
from evals.promote import GateError, pair_arg, run_gate, split_pair
from evals.registry_cli import corrupt_file
from evals.retrain import row_key
from gateway.cli import main
from tests.evals.labelled_files import STRONG, TWIN, WEAK, rows, with_twin, write_jsonl
from tests.gatewayproc import REPO
from tests.polling import eventually


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """A registry template: v1 (active) learnt the wrong relation, v2 the right one, v3 is v2 again;
    plus a held-out file with the right relation on prompts none of them saw."""
    root = tmp_path_factory.mktemp("promote")
    wrong = write_jsonl(root / "wrong.jsonl", rows(seed=2, n=120, relation="chat-needs-strong"))
    right = write_jsonl(root / "right.jsonl", rows(seed=1, n=120))
    heldout = write_jsonl(root / "heldout.jsonl", rows(seed=3, n=120))
    registry = root / "template"
    for data in (wrong, right, right):
        code = main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(registry),
                     "--no-progress", "--folds", "3"])
        assert code == 0
    versions = [v.version for v in RouterRegistry(registry).versions()]
    return registry, heldout, versions


@pytest.fixture
def registry(trained: tuple[Path, Path, list[str]], tmp_path: Path) -> Path:
    copy = tmp_path / "routers"
    shutil.copytree(trained[0], copy)
    return copy


def _prompts(path: Path) -> set[str]:
    return {json.loads(line)["prompt"] for line in path.read_text().splitlines()}


def _promote(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["promote", *args, "--no-progress"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_better_version_is_promoted_and_served(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    assert RouterRegistry(registry).active_version() == v1
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}")
    assert code == 0, err
    assert out.splitlines()[-1].startswith(f"PROMOTED: {v2} is now the active version")
    active = json.loads((registry / "active.json").read_text())
    assert active["version"] == v2 and active["previous"] == v1
    verdict = active["verdict"]
    assert verdict["decision"] == "promoted" and verdict["against"] == v1 and verdict["margin"] == 0.0
    assert verdict["resamples"] == 2000 and verdict["data"][0]["rows"] == 120
    # The short chat prompts repeat across files: held-out prompts either router was trained on are left out.
    in_right, in_wrong = (_prompts(trained[0].parent / f"{name}.jsonl") for name in ("right", "wrong"))
    held = [json.loads(line)["prompt"] for line in heldout.read_text().splitlines()]
    excluded = verdict["excluded_training_rows"]
    assert excluded == {"candidate": sum(p in in_right for p in held), "active": sum(p in in_wrong for p in held),
                        "active_recorded": True}
    fresh = sum(p not in in_right | in_wrong for p in held)
    assert 60 < fresh < 120 and excluded["candidate"] > 0 and excluded["active"] > 0
    assert f"left out {excluded['candidate']} requests {v2} was trained on and {excluded['active']} the active" in out
    (cmp,) = verdict["comparisons"]
    assert (cmp["strong"], cmp["weak"], cmp["rows"]) == (STRONG, WEAK, fresh)
    assert cmp["apgr_candidate"] > 0.55 > 0.45 > cmp["apgr_active"]
    assert cmp["apgr_diff_ci95"][0] > 0 and cmp["passed"] and cmp["resamples_used"] == 2000
    assert f"difference {cmp['apgr_diff']:+.3f}" in out
    assert RouterRegistry(registry).info(v2).verdicts[-1]["decision"] == "promoted"
    assert load_router_heads("static", registry).version == v2


def test_a_worse_version_is_refused_and_the_refusal_recorded(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    reg = RouterRegistry(registry)
    reg.promote(v2, {"decision": "promoted", "reason": "test set-up"})
    code, out, _ = _promote(capsys, v1, "--registry", str(registry), "--data", f"file:{heldout}")
    assert code == 1
    assert out.splitlines()[-1].startswith(f"REFUSED: {v1} stays inactive; {v2} stays active.")
    assert reg.active_version() == v2
    refusal = reg.info(v1).verdicts[-1]
    assert refusal["decision"] == "refused" and refusal["against"] == v2
    (cmp,) = refusal["comparisons"]
    assert cmp["apgr_diff_ci95"][1] < 0 and not cmp["passed"]


def test_an_equal_version_is_refused(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (_, v2, v3) = trained
    reg = RouterRegistry(registry)
    reg.promote(v2, {"decision": "promoted", "reason": "test set-up"})
    assert reg.info(v2).raw["weights_sha256"] == reg.info(v3).raw["weights_sha256"]  # trained from the same data
    code, out, _ = _promote(capsys, v3, "--registry", str(registry), "--data", f"file:{heldout}")
    assert code == 1 and "REFUSED" in out
    (cmp,) = reg.info(v3).verdicts[-1]["comparisons"]
    assert cmp["apgr_diff"] == 0.0 and cmp["apgr_diff_ci95"] == [0.0, 0.0]
    assert reg.active_version() == v2


def _someone_waits_for(lock: Path) -> bool:
    """Whether a process is blocked in flock() on ``lock`` (a ``->`` line of /proc/locks for its inode)."""
    st = lock.stat()
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any("->" in line and "FLOCK" in line and device in line.split()
               for line in Path("/proc/locks").read_text().splitlines())


def test_a_promotion_made_while_the_gate_waits_for_the_lock_is_not_overwritten(
    registry: Path, trained: tuple[Path, Path, list[str]]
) -> None:
    # Two `pointsman promote` at once: the gate checked that the active version had not changed, then took
    # the lock to write its promotion. A promotion made in between was overwritten by one whose numbers were
    # against the version it had replaced (and "REFUSED ... v0001 stays active" named a replaced version).
    _, heldout, (v1, v2, v3) = trained
    reg = RouterRegistry(registry)
    with reg._locked():  # what another promote holds while it writes
        gate = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "promote", v3, "--registry", str(registry), "--data",
             f"file:{heldout}", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            eventually(lambda: gate.poll() is not None or _someone_waits_for(registry / ".lock"),
                       "the gate waits for the registry lock", timeout=100)
            assert gate.poll() is None, gate.communicate()
            reg._promote_locked(v2, {"decision": "promoted", "reason": "the other promote"})
        except BaseException:
            gate.kill()
            raise
    out, err = gate.communicate(timeout=100)
    assert gate.returncode == 1, out + err
    active = reg.active()
    assert active is not None and (active["version"], active["previous"]) == (v2, v1)
    refusal = reg.info(v3).verdicts[-1]
    assert refusal["decision"] == "refused" and refusal["against"] == v1
    assert refusal["reason"] == f"the active version changed during the gate ({v1} -> {v2}); run it again"
    assert out.splitlines()[-1].startswith(f"REFUSED: {v3} stays inactive; {v2} stays active.")


def test_the_margin_is_what_the_ci_must_clear(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    code, out, _ = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}", "--margin", "0.99")
    assert code == 1 and "<= 0.99" in out
    assert RouterRegistry(registry).active_version() == v1
    assert RouterRegistry(registry).info(v2).verdicts[-1]["margin"] == 0.99


def test_usage_errors_exit_2_and_write_nothing(
    registry: Path, trained: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    before = sorted((p.relative_to(registry), p.read_bytes()) for p in registry.rglob("*.json"))
    cases = [
        (["v0042-0123abcd", "--registry", str(registry), "--data", f"file:{heldout}"], "no version 'v0042-0123abcd'"),
        ([v1, "--registry", str(registry), "--data", f"file:{heldout}"], "already the active version"),
        ([v2, "--registry", str(tmp_path), "--data", f"file:{heldout}"], "is not a router registry"),
        ([v2, "--registry", str(registry), "--data", f"file:{heldout}", "--resamples", "100"], "at least 1000"),
        ([v2, "--registry", str(registry), "--data", f"file:{tmp_path / 'missing.jsonl'}"], "no such file"),
    ]
    other = write_jsonl(tmp_path / "other-pair.jsonl", rows(seed=5, n=30, models=("x-large", "x-small")))
    cases.append(([v2, "--registry", str(registry), "--data", f"file:{other}"], "0 held-out prompts labelled"))
    for args, message in cases:
        code, _, err = _promote(capsys, *args)
        assert code == 2, args
        assert message in err, (args, err)
    with pytest.raises(SystemExit) as exit_info:
        main(["promote", v2, "--registry", str(registry)])  # --data missing: argparse's usage error
    assert exit_info.value.code == 2
    assert sorted((p.relative_to(registry), p.read_bytes()) for p in registry.rglob("*.json")) == before


@pytest.fixture(scope="module")
def three_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """v1 (active) learnt the wrong relation, v2 the right one, each over three models (three pair heads)."""
    root = tmp_path_factory.mktemp("promote3")
    wrong = write_jsonl(root / "wrong.jsonl", with_twin(rows(seed=2, n=120, relation="chat-needs-strong"), 2))
    right = write_jsonl(root / "right.jsonl", with_twin(rows(seed=1, n=120), 1))
    heldout = write_jsonl(root / "heldout.jsonl", with_twin(rows(seed=3, n=120), 3))
    registry = root / "routers"
    for data in (wrong, right):
        code = main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(registry),
                     "--no-progress", "--folds", "3"])
        assert code == 0
    return registry, heldout, [v.version for v in RouterRegistry(registry).versions()]


@pytest.fixture
def registry3(three_models: tuple[Path, Path, list[str]], tmp_path: Path) -> Path:
    copy = tmp_path / "routers3"
    shutil.copytree(three_models[0], copy)
    return copy


def test_a_near_tied_pair_is_reported_but_does_not_block_the_promotion(
    three_models: tuple[Path, Path, list[str]], registry3: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2) = three_models
    registry = registry3
    assert RouterRegistry(registry).active_version() == v1
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}")
    assert code == 0, out + err
    comparisons = RouterRegistry(registry).info(v2).verdicts[-1]["comparisons"]
    by_pair = {frozenset((c["strong"], c["weak"])): c for c in comparisons}
    assert set(by_pair) == {frozenset((STRONG, WEAK)), frozenset((STRONG, TWIN)), frozenset((WEAK, TWIN))}
    tie = by_pair[frozenset((WEAK, TWIN))]
    lo, hi = tie["quality_gap"]["ci95"]
    assert lo < 0 < hi and not tie["judged"]
    assert tie["apgr_diff_ci95"][1] - tie["apgr_diff_ci95"][0] > 0.5  # the figure it would otherwise be judged by
    for pair in ((STRONG, WEAK), (STRONG, TWIN)):
        judged = by_pair[frozenset(pair)]
        assert judged["judged"] and judged["passed"] and judged["quality_gap"]["ci95"][0] > 0
    assert "not judged: the models' mean quality gap" in out
    assert RouterRegistry(registry).active_version() == v2


def test_pair_gates_only_the_named_pairs(
    three_models: tuple[Path, Path, list[str]], registry3: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template, heldout, (v1, v2) = three_models
    registry = registry3
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}",
                              "--pair", f"{WEAK},{STRONG}")  # either order names the pair
    assert code == 0, out + err
    verdict = RouterRegistry(registry).info(v2).verdicts[-1]
    (cmp,) = verdict["comparisons"]
    assert {cmp["strong"], cmp["weak"]} == {STRONG, WEAK}
    assert {frozenset((p["strong"], p["weak"])) for p in verdict["not_gated"]} == {
        frozenset((STRONG, TWIN)), frozenset((WEAK, TWIN))
    }
    assert out.count("not gated (not named by --pair)") == 2

    # Only the near-tied pair: nothing left to judge, so the version is refused.
    shutil.rmtree(registry)
    shutil.copytree(template, registry)
    code, out, _ = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}",
                            "--pair", f"{WEAK},{TWIN}")
    assert code == 1 and "no pair could be judged" in out
    assert RouterRegistry(registry).active_version() == v1

    code, _, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}",
                            "--pair", f"{STRONG},nope")
    assert code == 2 and "has no head for that pair" in err
    with pytest.raises(SystemExit) as exit_info:  # not a pair: argparse's usage error
        main(["promote", v2, "--registry", str(registry), "--data", f"file:{heldout}", "--pair", STRONG])
    assert exit_info.value.code == 2 and "expected STRONG,WEAK" in capsys.readouterr().err
    assert RouterRegistry(registry).active_version() == v1


def test_force_rolls_back_without_the_gate_and_registry_list_shows_it(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    assert _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}")[0] == 0
    # v2 misbehaves live: back to v1, which the gate would refuse (it routes the wrong prompts).
    code, out, err = _promote(capsys, v1, "--registry", str(registry), "--force", "--reason", "p99 alert")
    assert code == 0, err
    assert out.startswith(f"PROMOTED (forced, no gate): {v1} is now the active version") and f"(was {v2})" in out
    reg = RouterRegistry(registry)
    active = reg.active()
    assert active is not None and active["version"] == v1 and active["previous"] == v2
    assert active["verdict"]["forced"] is True and active["verdict"]["against"] == v2
    assert active["verdict"]["reason"] == "forced without the gate: p99 alert"
    assert reg.info(v1).verdicts[-1]["forced"] is True  # recorded with the version too
    assert load_router_heads("static", registry).version == v1

    code = main(["registry", "list", "--registry", str(registry)])
    listing = capsys.readouterr().out.splitlines()
    assert code == 0
    assert listing[0].startswith(f"registry {registry}: 3 versions, active {v1}") and f"previous {v2}" in listing[0]
    marks = {line[2:].split()[0]: line[0] for line in listing[1:4]}  # "* v0001-...", "< v0002-...", "  v0003-..."
    assert marks == {v1: "*", v2: "<", trained[2][2]: " "}
    assert "last verdict: promoted (forced," in next(line for line in listing if v1 in line and line.startswith("*"))
    assert "last verdict: promoted (gate," in next(line for line in listing if line.startswith("<"))
    assert f"{STRONG} vs {WEAK}" in listing[1]
    # Each pair's CV APGR says how many distinct prompts it rests on (rows count a prompt judged twice twice).
    assert re.search(rf"{STRONG} vs {WEAK} \d\.\d{{3}} over \d+ prompts", listing[1]), listing[1]
    assert main(["registry", "list", "--registry", str(registry), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["active"] == v1 and [v["version"] for v in summary["versions"]][:2] == [v1, v2]
    assert summary["versions"][0]["pairs"][0]["cv_apgr"] is not None


def test_force_usage_errors_write_nothing(
    registry: Path, trained: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    before = sorted((p.relative_to(registry), p.read_bytes()) for p in registry.rglob("*.json"))
    for args, message in (
        ([v2, "--registry", str(registry), "--force"], "--force needs --reason"),
        ([v1, "--registry", str(registry), "--force", "--reason", "x"], "already the active version"),
        (["v0042-0123abcd", "--registry", str(registry), "--force", "--reason", "x"], "no version 'v0042-0123abcd'"),
        ([v2 + "\n", "--registry", str(registry), "--force", "--reason", "x"], "is not a version id"),
        ([v2, "--registry", str(tmp_path), "--force", "--reason", "x"], "is not a router registry"),
    ):
        code, _, err = _promote(capsys, *args)
        assert code == 2 and message in err, (args, err)
    for args, message in (
        ([v2, "--registry", str(registry), "--force", "--reason", "x", "--data", f"file:{heldout}"], "give no --data"),
        ([v2, "--registry", str(registry), "--reason", "x", "--data", f"file:{heldout}"], "--reason goes with --force"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["promote", *args])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert sorted((p.relative_to(registry), p.read_bytes()) for p in registry.rglob("*.json")) == before
    assert main(["registry", "list", "--registry", str(tmp_path)]) == 2
    assert "is not a router registry" in capsys.readouterr().err


def _lock_waiters(lock: Path) -> int:
    """How many processes wait for the flock on ``lock`` (Linux ``/proc/locks``: a waiter's line has ``->``)."""
    inode = f":{os.stat(lock).st_ino} "
    return sum("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux /proc/locks to see processes wait")
def test_two_forced_promotions_at_once_each_record_the_version_they_replaced(
    registry: Path, trained: tuple[Path, Path, list[str]]
) -> None:
    # force_promote read the active version before taking the registry lock: two forced promotions started
    # together both recorded (and printed) v1 as the version they replaced, though the second replaced the
    # first's. The test holds the lock until both wait for it, so both have read what they read before it.
    _, _, (v1, v2, v3) = trained
    lock = registry / ".lock"
    with open(lock, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        procs = {
            version: subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "promote", version, "--registry", str(registry), "--force",
                 "--reason", f"race {version}", "--no-progress"],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for version in (v2, v3)
        }
        try:
            eventually(lambda: _lock_waiters(lock) == 2 or any(p.poll() is not None for p in procs.values()),
                       "both promotions wait for the registry lock", timeout=120)
        finally:
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        outs = {version: p.communicate(timeout=120) for version, p in procs.items()}
    for version, (_, err) in outs.items():
        assert procs[version].returncode == 0, err
    reg = RouterRegistry(registry)
    against = {v: next(x["against"] for x in reg.info(v).verdicts if x.get("forced")) for v in (v2, v3)}
    active = reg.active()
    assert active is not None
    last = active["version"]
    first = v2 if last == v3 else v3
    # A history v1 -> first -> last: each promotion names the version it replaced, in the registry and on screen.
    assert against == {first: v1, last: first}
    assert active["previous"] == first and active["verdict"]["against"] == first
    for version, (out, _) in outs.items():
        assert f"(was {against[version]})" in out, out


def test_holdout_splits_one_source_between_train_and_the_gate(
    registry: Path, trained: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Logged traffic is one stream: train --holdout F keeps a fixed part out and promote --holdout F reads only
    it; whatever the gate reads, requests the candidate or the active version trained on are left out (for a
    version that did not record them, a source it trained on is refused), and a gate on nothing else is refused."""
    template, _, (v1, v2, _) = trained
    assert RouterRegistry(registry).active_version() == v1
    stream = write_jsonl(tmp_path / "stream.jsonl", rows(seed=11, n=200))
    code = main(["train", "--data", f"file:{stream}", "--encoders", "static", "--out", str(registry),
                 "--no-progress", "--folds", "3", "--holdout", "0.3"])
    out = capsys.readouterr().out
    assert code == 0
    v4 = RouterRegistry(registry).versions()[-1]
    (source,) = v4.data
    assert source["holdout"]["part"] == "train" and 110 < source["rows"] < 170  # ~70% of 200
    assert v4.raw["holdout"]["fraction"] == 0.3
    assert f"--holdout 0.3: {200 - source['rows']} of 200 rows held out" in out
    assert f"pointsman promote {v4.version} --registry {registry} --data file:{stream} --holdout 0.3" in out

    right = template.parent / "right.jsonl"  # what v2 was trained on, all of it
    code, _, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{right}")
    assert code == 2 and "all 120 held-out requests were training data of the candidate (120)" in err
    assert RouterRegistry(registry).info(v2).verdicts == []  # a usage error writes nothing
    # A version from before training rows were recorded is judged by source.
    manifest = registry / "versions" / v2 / "version.json"
    older = json.loads(manifest.read_text())
    del older["trained_rows"]
    manifest.write_text(json.dumps(older))
    (registry / "versions" / v2 / "trained_rows.npy").unlink()
    code, _, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{right}")
    assert code == 2 and f"{v2} was trained on all of it (no --holdout)" in err

    # Without --holdout, or with a larger fraction, the rows v4 trained on are left out all the same; so are
    # those the active v1 was trained on.
    stream_rows = load_source(f"file:{stream}").rows
    v4_trained = [not is_held_out(row_key(r), 0.3) for r in stream_rows]
    v1_trained = [row_key(r) in {row_key(w) for w in load_source(f"file:{template.parent / 'wrong.jsonl'}").rows}
                  for r in stream_rows]
    assert sum(v4_trained) == source["rows"] and any(v1_trained)
    for fraction in (None, 0.5, 0.3):
        read = [fraction is None or is_held_out(row_key(r), fraction) for r in stream_rows]
        args = [] if fraction is None else ["--holdout", str(fraction)]
        code, out, err = _promote(capsys, v4.version, "--registry", str(registry), "--data", f"file:{stream}", *args,
                                  "--resamples", "1000")
        assert code == 0, out + err  # v4 learnt the right relation, the active v1 the wrong one
        verdict = RouterRegistry(registry).info(v4.version).verdicts[-1]
        assert verdict["excluded_training_rows"] == {
            "candidate": sum(r and t for r, t in zip(read, v4_trained, strict=True)),
            "active": sum(r and t for r, t in zip(read, v1_trained, strict=True)),
            "active_recorded": True,
        }
        assert verdict["comparisons"][0]["rows"] == sum(
            r and not (a or b) for r, a, b in zip(read, v4_trained, v1_trained, strict=True)
        )
        RouterRegistry(registry).promote(v1, {"decision": "promoted", "reason": "test: back to v1"})
    (gate_source,) = verdict["data"]
    assert gate_source["rows"] == 200 - source["rows"] and gate_source["holdout"]["part"] == "heldout"


NOT_VERDICTS = shutil.ignore_patterns("verdicts.json")


def _experiment_config(path: Path, registry: Path, pinned: str) -> Path:
    path.write_text(yaml.safe_dump({
        "backends": [{"name": "fake", "base_url": "http://127.0.0.1:9/v1",
                      "models": [{"name": STRONG}, {"name": WEAK}]}],
        "classifiers": {"encoder": "static", "routers_dir": str(registry)},
        "routes": [{"name": "auto", "policy": "rules",
                    "cost_quality": {"strong": STRONG, "weak": WEAK, "threshold": 0.5}}],
        "experiments": [{"name": "old-router", "route": "auto",
                         "arms": [{"name": "control", "control": True}, {"name": "old", "router_version": pinned}]}],
    }))
    return path


def test_prune_keeps_the_newest_active_previous_and_pinned_versions(
    registry: Path, trained: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, (v1, v2, v3) = trained
    reg = RouterRegistry(registry)
    for _ in range(2):  # v4 and v5: v2's heads again
        staging = reg.staging_dir()
        shutil.copytree(reg.version_dir(v2), staging, dirs_exist_ok=True, ignore=NOT_VERDICTS)
        reg.add_version(staging, {"data": [{"source": "copy of v2", "rows": 120}]})
    v4, v5 = reg.version_ids()[3:]
    assert _promote(capsys, v4, "--registry", str(registry), "--force", "--reason", "test")[0] == 0  # previous: v1
    config = _experiment_config(tmp_path / "gateway.yaml", registry, pinned=v2)

    def prune(*args: str) -> tuple[int, str, str]:
        code = main(["registry", "prune", "--registry", str(registry), *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = prune("--keep", "1", "--config", str(config), "--dry-run")
    assert code == 0 and out.startswith(f"would delete 1 version: {v3}\n") and len(reg.version_ids()) == 5
    code, out, err = prune("--keep", "1", "--config", f"{tmp_path}/missing.yaml")
    assert code == 2 and "missing.yaml" in err and len(reg.version_ids()) == 5  # never prune blind to a config
    with pytest.raises(SystemExit):
        main(["registry", "prune", "--registry", str(registry), "--keep", "0"])
    assert "the newest version is always kept" in capsys.readouterr().err

    code, out, err = prune("--keep", "1", "--config", str(config))
    assert code == 0 and out.startswith(f"deleted 1 version: {v3}\n") and f"pinned by --config: {v2}" in out
    assert reg.version_ids() == [v1, v2, v4, v5] and not (registry / "versions" / v3).exists()
    (entry,) = json.loads((registry / "pruned.json").read_text())
    assert entry["version"] == v3 and len(entry["weights_sha256"]) == 64 and entry["pruned_at"]
    # The pinned version still loads for the experiment; the gateway serves the active one.
    assert load_router_heads("static", registry).version == v4
    assert main(["check-config", str(config)]) == 0
    capsys.readouterr()

    code, out, err = prune("--keep", "1")  # no config: v2 goes, and the operator is told why configs matter
    assert code == 0 and f"deleted 1 version: {v2}" in out and "no --config given" in err
    assert reg.version_ids() == [v1, v4, v5]
    assert main(["check-config", str(config)]) == 2  # the experiment's pinned version is gone: named at start-up
    assert f"no version '{v2}'" in capsys.readouterr().err
    assert main(["registry", "list", "--registry", str(registry)]) == 0
    assert "2 older versions pruned" in capsys.readouterr().out
    # Numbering goes on from the newest version, which is never pruned.
    staging = reg.staging_dir()
    shutil.copytree(reg.version_dir(v5), staging, dirs_exist_ok=True, ignore=NOT_VERDICTS)
    assert reg.add_version(staging, {}).startswith("v0006-")


def test_an_active_version_without_a_record_of_its_training_rows_is_named(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (v1, v2, _) = trained
    manifest = registry / "versions" / v1 / "version.json"
    older = json.loads(manifest.read_text())
    del older["trained_rows"]
    manifest.write_text(json.dumps(older))
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}",
                              "--resamples", "1000")
    assert code == 0, err
    assert f"note: {v1} recorded no training requests" in out
    verdict = RouterRegistry(registry).info(v2).verdicts[-1]
    assert verdict["excluded_training_rows"]["active"] == 0
    assert verdict["excluded_training_rows"]["active_recorded"] is False


def test_a_pair_the_held_out_data_ranks_the_other_way_round_is_not_judged(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # On these prompts the trained weak model is always right and the strong one fails the math: APGR
    # would divide by a negative gap, so a better ranking would score lower. Not judged, so refused.
    _, _, (v1, v2, _) = trained
    upside_down = write_jsonl(tmp_path / "upside-down.jsonl", rows(seed=4, n=120, models=(WEAK, STRONG)))
    code, out, _ = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{upside_down}")
    assert code == 1
    assert "not judged: on these prompts the weak model does better on average (strong minus weak -0." in out
    assert "no pair could be judged" in out
    assert RouterRegistry(registry).active_version() == v1
    verdict = json.loads((registry / "versions" / v2 / "verdicts.json").read_text())[-1]
    (cmp,) = verdict["comparisons"]
    assert cmp["judged"] is False and cmp["quality_gap"]["ci95"][1] < 0


def test_a_pair_the_held_out_data_does_not_cover_is_shown_but_does_not_block(
    three_models: tuple[Path, Path, list[str]], registry3: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A multi-model version gated on a held-out file that labels only two of its models: the other
    # pairs cannot be judged, which is said per pair; the pair the file covers decides.
    _, _, (_, v2) = three_models
    two_models = write_jsonl(tmp_path / "two-models.jsonl", rows(seed=3, n=120))
    code, out, err = _promote(capsys, v2, "--registry", str(registry3), "--data", f"file:{two_models}")
    assert code == 0, out + err
    assert out.count("held-out prompts labelled for both models and scorable by both routers, need at least 10") == 2
    comparisons = RouterRegistry(registry3).info(v2).verdicts[-1]["comparisons"]
    by_pair = {frozenset((c["strong"], c["weak"])): c for c in comparisons}
    for pair in ((STRONG, TWIN), (WEAK, TWIN)):
        uncovered = by_pair[frozenset(pair)]
        assert uncovered["rows"] == 0 and uncovered["judged"] is False and uncovered["apgr_diff"] is None
    covered = by_pair[frozenset((STRONG, WEAK))]
    assert covered["rows"] >= 10 and covered["judged"] and covered["passed"]
    assert RouterRegistry(registry3).active_version() == v2


def test_the_shipped_head_standing_in_for_a_missing_pair_is_not_graded_on_its_training_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The active version has no head for the candidate's pair, so the gate compares against the shipped
    # difficulty head; held-out prompts the shipped head was trained on must not grade it.
    from classifiers.registry import resolve_routers_dir
    from evals.data.prior import load_prior_rows
    from evals.trained_rows import resolved_training_rows

    registry = tmp_path / "routers"
    active = write_jsonl(tmp_path / "active.jsonl", rows(seed=2, n=120, models=(STRONG, WEAK)))
    candidate = write_jsonl(tmp_path / "candidate.jsonl", rows(seed=1, n=120, models=(STRONG, TWIN)))
    for data in (active, candidate):  # no warm start: the shipped prompts stay out of both records
        assert main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(registry),
                     "--no-progress", "--folds", "3", "--no-warm-start"]) == 0
    v1, v2 = (v.version for v in RouterRegistry(registry).versions())

    prior = load_prior_rows()
    shipped = resolved_training_rows(resolve_routers_dir(None))
    assert shipped is not None
    seen = [r for r, inside in zip(prior, shipped[1].contains(prior), strict=True) if inside][:40]
    assert len(seen) == 40
    # Asked again with other spacing or capitals, a prompt is still one the shipped head learnt from.
    heldout = rows(seed=3, n=120, models=(STRONG, TWIN)) + [
        {"prompt": r.messages[0]["content"].replace(" ", "  ").upper() + "\n", "scores": {STRONG: 1.0, TWIN: 0.0}}
        for r in seen
    ]
    heldout_file = write_jsonl(tmp_path / "heldout.jsonl", heldout)
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout_file}",
                              "--resamples", "1000")
    assert code in (0, 1), out + err
    (cmp,) = RouterRegistry(registry).info(v2).verdicts[-1]["comparisons"]
    assert cmp["baseline_head"].startswith("difficulty-gpt4-mixtral")
    assert cmp["excluded_fallback_training_rows"] == 40
    # Every other held-out request (after the versions' own training rows) is labelled for the pair.
    gated = int(re.search(r"on (\d+) held-out requests", out).group(1))  # type: ignore[union-attr]
    assert cmp["rows"] == gated - 40
    assert "left out 40 more requests for this pair: the active version has no head for it" in out
    assert RouterRegistry(registry).active_version() in (v1, v2)


# ----------------------------------------------------------------------------- review fixes: exit codes, options


def _registry_files(registry: Path) -> list[tuple[Path, bytes]]:
    return sorted((p.relative_to(registry), p.read_bytes()) for p in registry.rglob("*.json"))


def _not_writable_under(root: Path) -> Callable[..., bool]:
    """An ``os.access`` that reports every path under ``root`` unwritable, the way a read-only mount does
    (tests may run as root, for whom a chmod changes nothing)."""
    real = os.access

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if mode & os.W_OK and Path(path).resolve().is_relative_to(root.resolve()):
            return False
        return real(path, mode, **kwargs)

    return access


def _read_only_error(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.EROFS, "Read-only file system", "routers/.lock")


def test_a_registry_the_verdict_cannot_be_written_to_is_refused_before_the_gate_runs(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import evals.promote
    import evals.registry_cli

    _, heldout, (_, v2, _) = trained
    before = _registry_files(registry)
    monkeypatch.setattr(evals.registry_cli.os, "access", _not_writable_under(registry))
    monkeypatch.setattr(evals.promote, "load_source", _must_not_be_called)
    for extra in (["--data", f"file:{heldout}"], ["--force", "--reason", "rollback"]):
        code, out, err = _promote(capsys, v2, "--registry", str(registry), *extra)
        assert code == 2 and out == "", extra
        assert err.startswith(f"pointsman promote: --registry {registry}: cannot write to it: {registry} is not "
                              "writable (") and len(err.splitlines()) == 1, err
    assert _registry_files(registry) == before


def _must_not_be_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the gate read its held-out data although the verdict could not be written")


def test_a_registry_write_that_fails_anyway_is_one_line_and_exit_2_never_1(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The file system turns read-only after the check (or access() cannot tell): still no traceback, and
    # never exit 1, which means "refused by the gate".
    _, heldout, (_, v2, _) = trained
    for method in ("promote", "promote_over", "record_verdict"):
        monkeypatch.setattr(RouterRegistry, method, _read_only_error)
    for extra in (["--data", f"file:{heldout}", "--resamples", "1000"], ["--force", "--reason", "rollback"]):
        code, _, err = _promote(capsys, v2, "--registry", str(registry), *extra)
        assert code == 2 and err == "pointsman promote: routers/.lock: read-only file system\n", (extra, err)
    import evals.promote

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("something unforeseen")

    monkeypatch.setattr(evals.promote, "run_gate", crash)
    code, _, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}")
    assert code == 2 and err == "pointsman promote: failed (RuntimeError: something unforeseen)\n"


@pytest.mark.parametrize(("name", "content", "what"), [
    ("active.json", "{not json", "not valid JSON"),
    ("active.json", "[]", 'not a JSON object with a "version" string'),
    ("versions/{v2}/version.json", "", "not valid JSON"),
    ("versions/{v2}/version.json", '{"parent": null}', 'not a JSON object with a "version" string'),
    ("versions/{v2}/verdicts.json", '{"decision": "refused"}', "not a JSON list of objects"),
])
def test_a_corrupt_registry_file_is_named_by_promote_list_and_prune(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str],
    name: str, content: str, what: str,
) -> None:
    _, heldout, (_, v2, _) = trained
    path = registry / name.format(v2=v2)
    path.write_text(content)
    commands = [
        ["promote", v2, "--registry", str(registry), "--force", "--reason", "rollback"],
        ["promote", v2, "--registry", str(registry), "--data", f"file:{heldout}", "--resamples", "1000"],
        ["registry", "list", "--registry", str(registry)],
        ["registry", "list", "--registry", str(registry), "--json"],
        ["registry", "prune", "--registry", str(registry), "--keep", "1"],
    ]
    for command in commands:
        code = main([*command, "--no-progress"] if command[0] == "promote" else command)
        out = capsys.readouterr()
        # The registry's own messages may word it their way; either way one line naming the file.
        assert code == 2, (command, out)
        assert str(path) in out.err and len(out.err.splitlines()) == 1 and "Traceback" not in out.err, (command, out)
    problem = corrupt_file(registry)
    assert problem is not None and problem.startswith(f"{path}: {what}") and problem.endswith("restore it")


def test_seed_and_margin_are_checked_when_parsed(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, heldout, (_, v2, _) = trained
    before = _registry_files(registry)
    for args, option in ((["--seed", "-1"], "--seed"), (["--margin", "nan"], "--margin"),
                         (["--margin=-inf"], "--margin"), (["--margin", "inf"], "--margin"),
                         (["--margin", "x"], "--margin")):
        with pytest.raises(SystemExit) as exit_info:
            main(["promote", v2, "--registry", str(registry), "--data", f"file:{heldout}", *args])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and f"argument {option}:" in err and "Traceback" not in err, args
    assert _registry_files(registry) == before
    # Called as a function the gate refuses them too, before writing anything.
    for kwargs in ({"margin": float("nan")}, {"margin": float("-inf")}, {"seed": -1}):
        with pytest.raises(GateError):
            run_gate(registry, v2, [f"file:{heldout}"], progress=False, log=lambda _: None, **kwargs)
    assert _registry_files(registry) == before


def _truncate_weights(head_dir: Path) -> None:
    """What a disk error or an interrupted copy of the registry leaves: half of a head's weights."""
    weights = head_dir / "weights.npz"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def test_a_forced_rollback_to_a_version_whose_heads_do_not_load_is_refused(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    # --force made it active: running gateways logged a failed reload, and every gateway started on the
    # registry afterwards (a restart, a new replica) refused to start.
    _, _, (v1, v2, _) = trained
    (head,) = [d for d in RouterRegistry(registry).version_dir(v2).iterdir() if d.name.startswith("difficulty-")]
    _truncate_weights(head)
    before = _registry_files(registry)
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--force", "--reason", "p99 alert")
    assert code == 2 and out == "", out
    assert f"{v2} cannot be made active" in err and f"{head}/weights.npz" in err and "Traceback" not in err
    assert RouterRegistry(registry).active_version() == v1 and _registry_files(registry) == before
    assert load_router_heads("static", registry).version == v1  # what a gateway starting now serves


def test_the_gate_does_not_promote_a_version_with_a_head_it_did_not_score(
    three_models: tuple[Path, Path, list[str]], registry3: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --pair gates one pair head; the version's other heads (here its quality head) went live unchecked.
    _, heldout, (v1, v2) = three_models
    (quality,) = RouterRegistry(registry3).version_dir(v2).glob("quality-*")
    _truncate_weights(quality)
    code, out, err = _promote(capsys, v2, "--registry", str(registry3), "--data", f"file:{heldout}",
                              "--pair", f"{STRONG},{WEAK}")
    assert code == 2, out + err
    assert f"{v2} cannot be made active" in err and f"{quality}/weights.npz" in err
    reg = RouterRegistry(registry3)
    assert reg.active_version() == v1 and reg.info(v2).verdicts == []
    assert load_router_heads("static", registry3).version == v1


def test_a_forced_promotion_names_the_user_without_user_or_logname(
    registry: Path, trained: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    _, _, (_, v2, v3) = trained
    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    assert _promote(capsys, v2, "--registry", str(registry), "--force", "--reason", "test")[0] == 0
    assert RouterRegistry(registry).active()["verdict"]["user"] == pwd.getpwuid(os.getuid()).pw_name  # type: ignore[index]

    def no_entry(uid: int) -> Any:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert _promote(capsys, v3, "--registry", str(registry), "--force", "--reason", "test")[0] == 0
    assert RouterRegistry(registry).active()["verdict"]["user"] == f"uid {os.getuid()}"  # type: ignore[index]
    monkeypatch.setenv("USER", "anna")
    assert operator_name() == "anna"


# ----------------------------------------------------------------------------- --pair with commas in model names

BIG, SMALL = "vendor/big, v2", "small model"  # a comma and spaces: names train takes as they are


def test_split_pair_finds_the_comma_between_two_models_of_a_pair() -> None:
    trained = [{"strong": BIG, "weak": SMALL}, {"strong": "a", "weak": "b,c"}, {"strong": "a,b", "weak": "c"}]
    assert split_pair(f"{BIG},{SMALL}", trained, "v1") == (BIG, SMALL)
    assert split_pair(f"{SMALL},{BIG}", trained, "v1") == (SMALL, BIG)
    assert split_pair("vendor/big, v2, small model", trained, "v1") == (BIG, SMALL)  # " small model" stripped
    assert split_pair('["a,b", "c"]', trained, "v1") == ("a,b", "c")
    with pytest.raises(GateError, match=r"ambiguous, it can be split into \["):
        split_pair("a,b,c", trained, "v1")
    with pytest.raises(GateError, match="has no head for that pair"):
        split_pair("vendor/big,v2,small", trained, "v1")


def test_split_pair_compares_halves_as_written_before_stripping_them() -> None:
    trained = [{"strong": "x", "weak": " y"}, {"strong": "p", "weak": "q"}]
    assert split_pair("x, y", trained, "v1") == ("x", " y")  # as written: " y" is the model
    assert split_pair("p, q", trained, "v1") == ("p", "q")  # stripped: "a, b" reads as a and b
    with pytest.raises(GateError, match=re.escape('has no head for that pair (it has: ["x", " y"]; p,q)')):
        split_pair("x,y", trained, "v1")  # "y" is not the model " y"


@pytest.mark.parametrize("value", ["big-model", "", ",", '["a", "a"]', '["a"]'])
def test_a_pair_value_that_cannot_name_two_models_is_a_usage_error(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        pair_arg(value)


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """v1 (active) learnt the wrong relation, v2 the right one, for models named ``BIG`` and ``SMALL``."""
    root = tmp_path_factory.mktemp("odd-names")

    def renamed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = {STRONG: BIG, WEAK: SMALL}
        return [{**it, "scores": {names[m]: q for m, q in it["scores"].items()},
                 "costs": {names[m]: c for m, c in it.get("costs", {}).items()}} for it in items]

    wrong = write_jsonl(root / "wrong.jsonl", renamed(rows(seed=2, n=120, relation="chat-needs-strong")))
    right = write_jsonl(root / "right.jsonl", renamed(rows(seed=1, n=120)))
    heldout = write_jsonl(root / "heldout.jsonl", renamed(rows(seed=3, n=120)))
    registry = root / "routers"
    for data in (wrong, right):
        assert main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(registry),
                     "--no-progress", "--folds", "3"]) == 0
    return registry, heldout, [v.version for v in RouterRegistry(registry).versions()]


def test_pair_names_models_whose_names_hold_commas_and_spaces(
    odd_names: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template, heldout, (v1, v2) = odd_names
    info = RouterRegistry(template).info(v2)
    assert {(p["strong"], p["weak"]) for p in info.pairs} == {(BIG, SMALL)}
    for value in (f"{BIG},{SMALL}", f"{SMALL},{BIG}", json.dumps([BIG, SMALL])):
        registry = tmp_path / "copy"
        shutil.rmtree(registry, ignore_errors=True)
        shutil.copytree(template, registry)
        code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}",
                                  "--resamples", "1000", "--pair", value)
        assert code == 0, (value, out + err)
        (cmp,) = RouterRegistry(registry).info(v2).verdicts[-1]["comparisons"]
        assert (cmp["strong"], cmp["weak"]) == (BIG, SMALL)
    code, _, err = _promote(capsys, v2, "--registry", str(template), "--data", f"file:{heldout}",
                            "--pair", "vendor/big,v2")
    assert code == 2 and f'has no head for that pair (it has: {json.dumps([BIG, SMALL])})' in err
    assert RouterRegistry(template).active_version() == v1


def test_a_held_out_file_judging_each_prompt_four_times_gets_the_interval_of_its_distinct_prompts(
    trained: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Rows of one prompt are not independent evidence: resampled one by one, four copies halved the
    # interval the gate reads, so a version no better than the active one could clear it.
    template, heldout, (_, v2, _) = trained
    repeated = tmp_path / "heldout4.jsonl"
    repeated.write_text(heldout.read_text() * 4)
    widths = []
    for name, data in (("once", heldout), ("four", repeated)):
        copy = tmp_path / name
        shutil.copytree(template, copy)
        code, _, err = _promote(capsys, v2, "--registry", str(copy), "--data", f"file:{data}")
        assert code == 0, err
        (cmp,) = json.loads((copy / "active.json").read_text())["verdict"]["comparisons"]
        widths.append(cmp["apgr_diff_ci95"][1] - cmp["apgr_diff_ci95"][0])
        assert cmp["resamples_used"] == 2000
    assert 0.8 < widths[1] / widths[0] < 1.25, widths


def test_the_active_versions_head_for_the_reversed_pair_is_the_baseline_read_as_a_gateway_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The active version was trained for the pair the other way round (--strong/--weak, or data where the other
    model did better on average: a near tie flips between retrainings). A gateway reads that head reversed; the
    gate compared the candidate against the shipped GPT-4/Mixtral head instead, printed as the active one."""
    registry = tmp_path / "routers"
    active = write_jsonl(tmp_path / "active.jsonl", rows(seed=2, n=120))
    candidate = write_jsonl(tmp_path / "candidate.jsonl", rows(seed=1, n=120))
    heldout = write_jsonl(tmp_path / "heldout.jsonl", rows(seed=3, n=120))
    for data, pair in ((active, ["--strong", WEAK, "--weak", STRONG]), (candidate, [])):
        assert main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(registry),
                     "--no-progress", "--folds", "3", *pair]) == 0
    v1, v2 = (v.version for v in RouterRegistry(registry).versions())
    assert RouterRegistry(registry).info(v1).pairs[0]["strong"] == WEAK
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}",
                              "--resamples", "1000")
    assert code in (0, 1), out + err
    (cmp,) = RouterRegistry(registry).info(v2).verdicts[-1]["comparisons"]
    reversed_head = f"difficulty-{WEAK}--{STRONG}-static"
    assert cmp["baseline_head"] == f"{reversed_head} (reversed)"
    assert f"(active, {reversed_head} (reversed))" in out
    assert cmp["excluded_fallback_training_rows"] == 0 and "has no head for it" not in out
    # Both learnt which prompts need the strong model: read the right way round, the active head ranks as well.
    assert abs(cmp["apgr_candidate"] - cmp["apgr_active"]) < 0.05


def test_a_held_out_file_of_few_prompts_judged_many_times_is_too_small_to_judge(
    registry: Path, trained: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The gate's minimum counted rows: five prompts judged three times each passed as "15 prompts" and
    # could promote a version on five prompts' worth of evidence.
    _, _, (v1, v2, _) = trained
    seen = {r["prompt"] for seed in (1, 2) for r in rows(seed=seed, n=120)}
    fresh = [r for r in rows(seed=40, n=200) if r["prompt"] not in seen]
    math = list({r["prompt"]: r for r in fresh if r["scores"][WEAK] == 0.0}.values())[:4]
    chat = list({r["prompt"]: r for r in fresh if r["scores"][WEAK] == 1.0}.values())[:1]
    heldout = write_jsonl(tmp_path / "few.jsonl", (math + chat) * 3)
    code, out, err = _promote(capsys, v2, "--registry", str(registry), "--data", f"file:{heldout}")
    assert code == 2, out
    assert "5 held-out prompts (15 rows) labelled for both models and scorable by both routers" in out
    assert "need at least 10 prompts" in err
    assert RouterRegistry(registry).active_version() == v1
