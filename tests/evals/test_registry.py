"""The router registry on disk: versions, the active one, atomic writes, and what serving loads from it."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from classifiers.heads.fit import fit_head
from classifiers.provider import DEFAULT_ROUTERS_DIR, load_router_heads
from classifiers.registry import (
    ACTIVE_FILE,
    RouterRegistry,
    active_marker,
    is_registry,
    pair_artifact,
    resolve_routers_dir,
    slug,
)


def _pair_head_dir(staging: Path, strong: str, weak: str, *, seed: int = 0, encoder: str = "static") -> Path:
    """A small real pair head (logistic regression on random features) saved like ``pointsman train`` does."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(60, 4))
    y = (x[:, 0] + rng.normal(scale=0.3, size=60) > 0).astype(int)
    head, _ = fit_head("logreg", x, y, ["weak_ok", "strong_needed"], seed=seed)
    encoder_id = "minilm-static-256" if encoder == "static" else "minilm-l6-v2"
    head.manifest = {
        "name": pair_artifact(strong, weak, encoder),
        "task": "difficulty",
        "model_pair": {"strong": strong, "weak": weak},
        "encoder": encoder_id,
        "feature_schema": {"embedding": {"encoder": encoder_id, "dim": 4}, "cheap": []},
    }
    return head.save(staging / pair_artifact(strong, weak, encoder))


def _add(registry: RouterRegistry, seed: int, pair: tuple[str, str] = ("big-model", "small-model")) -> str:
    staging = registry.staging_dir()
    _pair_head_dir(staging, *pair, seed=seed)
    info = {"data": [{"source": "file:x.jsonl", "sha256": "0" * 64, "rows": 60}], "metrics": {"cv_apgr": 0.7},
            "encoders": ["static"], "pairs": [{"strong": pair[0], "weak": pair[1],
                                               "artifact": pair_artifact(*pair, "static"), "encoder": "static"}]}
    return registry.add_version(staging, info)


def test_first_version_becomes_active_later_ones_wait_for_promotion(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    assert not is_registry(registry.root) and registry.active_version() is None
    first = _add(registry, seed=0)
    assert is_registry(registry.root)
    assert json.loads((registry.root / "registry.json").read_text()) == {"format": 1}
    assert registry.active_version() == first
    second = _add(registry, seed=1)
    assert registry.active_version() == first  # not promoted
    assert [v.version for v in registry.versions()] == [first, second]
    assert first.startswith("v0001-") and second.startswith("v0002-") and first != second
    info = registry.info(second)
    assert info.parent == first and info.created_at and info.encoders == ["static"]
    assert info.data == [{"source": "file:x.jsonl", "sha256": "0" * 64, "rows": 60}]
    assert info.raw["weights_sha256"].startswith(second.split("-")[1])  # the id's hex part names the weights
    assert registry.info(first).verdicts[0]["decision"] == "promoted"  # the first version's automatic verdict
    # Nothing half-written is left behind: no staging directories, no temporary files.
    leftovers = [p.name for p in registry.root.rglob("*") if ".staging-" in p.name or p.name.endswith(".tmp")]
    assert leftovers == []


def test_same_weights_give_the_same_hex_part_of_the_id(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    a, b = _add(registry, seed=3), _add(registry, seed=3)
    assert a.split("-")[1] == b.split("-")[1] and a != b


def test_an_id_deleted_by_hand_is_never_handed_out_again(tmp_path: Path) -> None:
    # A gateway serving v0002 compares ids: a new version under the same id (same weights, the active
    # directory deleted by hand, then a retrain) would never be picked up.
    registry = RouterRegistry(tmp_path / "routers")
    _add(registry, seed=0)
    second = _add(registry, seed=1)
    registry.promote(second, {"decision": "promoted"})
    shutil.rmtree(registry.root / "versions" / second)
    again = _add(registry, seed=1)
    assert again != second and again.startswith("v0003-")
    assert registry.active_version() == second  # still named, still what a gateway serves until promoted


def test_promote_switches_active_and_records_verdicts(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    first, second = _add(registry, seed=0), _add(registry, seed=1)
    registry.record_verdict(second, {"decision": "refused", "apgr_diff_ci95": [-0.1, 0.2]})
    assert registry.active_version() == first
    registry.promote(second, {"decision": "promoted", "apgr_diff_ci95": [0.05, 0.3]})
    active = json.loads((registry.root / ACTIVE_FILE).read_text())
    assert active["version"] == second and active["previous"] == first
    assert active["verdict"]["apgr_diff_ci95"] == [0.05, 0.3] and active["promoted_at"]
    decisions = [v["decision"] for v in registry.info(second).verdicts]
    assert decisions == ["refused", "promoted"]
    with pytest.raises(KeyError, match="no version"):
        registry.promote("v0009-0123abcd", {"decision": "promoted"})
    with pytest.raises(KeyError, match="not a version id"):
        registry.version_dir("../../etc")
    assert registry.active_version() == second


def test_a_non_empty_directory_that_is_not_a_registry_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a router registry"):
        RouterRegistry(tmp_path).init()
    assert not is_registry(tmp_path)


def test_active_json_is_replaced_atomically_while_readers_poll(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    versions = [_add(registry, seed=0), _add(registry, seed=1)]
    seen: set[str] = set()
    errors: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        path = registry.root / ACTIVE_FILE
        while not stop.is_set():
            text = path.read_text()  # must always be a whole file: old or new, never empty or partial
            try:
                seen.add(json.loads(text)["version"])
            except (ValueError, KeyError) as exc:
                errors.append(f"{exc}: {text!r}")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            registry.promote(versions[i % 2], {"decision": "promoted", "i": i})
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert seen <= set(versions) and seen
    assert not [p for p in registry.root.iterdir() if p.name.endswith(".tmp")]


def test_concurrent_trainings_get_distinct_sequence_numbers(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    registry.init()
    out: list[str] = []
    lock = threading.Lock()

    def add(seed: int) -> None:
        version = _add(RouterRegistry(registry.root), seed=seed)
        with lock:
            out.append(version)

    threads = [threading.Thread(target=add, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v.split("-")[0] for v in out) == ["v0001", "v0002", "v0003", "v0004"]
    assert len(registry.versions()) == 4 and registry.active_version() in out


def test_resolve_routers_dir_registry_plain_directory_and_shipped_fallback(tmp_path: Path) -> None:
    shipped = resolve_routers_dir(None)
    assert shipped.directory == DEFAULT_ROUTERS_DIR and shipped.version.startswith("bundled-")
    # An empty registry (no active version) serves the shipped artifacts.
    registry = RouterRegistry(tmp_path / "routers")
    registry.init()
    empty = resolve_routers_dir(registry.root)
    assert empty.directory == DEFAULT_ROUTERS_DIR and empty.version == shipped.version
    first = _add(registry, seed=0)
    resolved = resolve_routers_dir(str(registry.root))
    assert resolved.version == first and resolved.directory == registry.root / "versions" / first
    # A plain directory of heads: itself, named by its manifests' hash (which a retrain changes).
    plain = tmp_path / "plain"
    _pair_head_dir(plain, "a", "b", seed=0)
    before = resolve_routers_dir(plain)
    assert before.directory == plain and before.version.startswith("dir-")
    _pair_head_dir(plain, "a", "b", seed=5)
    assert resolve_routers_dir(plain).version != before.version
    # A missing or head-less directory serves the shipped heads and says so (a dir- id of nothing would
    # pass them off as the operator's own router).
    (tmp_path / "empty").mkdir()
    for nothing in (tmp_path / "missing", tmp_path / "empty"):
        assert resolve_routers_dir(nothing) == resolve_routers_dir(None)


def test_active_marker_changes_with_promotion_only(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    registry.init()
    none_active = active_marker(registry.root)
    first = _add(registry, seed=0)
    after_first = active_marker(registry.root)
    assert after_first != none_active
    second = _add(registry, seed=1)
    assert active_marker(registry.root) == after_first  # a new inactive version changes nothing served
    registry.promote(second, {"decision": "promoted"})
    after_second = active_marker(registry.root)
    assert after_second != after_first
    registry.promote(first, {"decision": "promoted"})
    assert active_marker(registry.root) != after_second
    assert active_marker(None) == "bundled"


def test_a_registry_moved_away_reads_as_one_change_even_mid_read(tmp_path: Path) -> None:
    # The marker reads registry.json, then active.json, then the active version's version.json. A registry
    # moved away between those reads gave "no active version" or "active version missing" first and "no
    # registry" on the next poll: two changes, so one move counted two failed reloads in every replica.
    registry = RouterRegistry(tmp_path / "routers")
    _add(registry, seed=0)
    present, gone = active_marker(registry.root), active_marker(tmp_path / "nowhere")
    aside = tmp_path / "aside"
    seen: set[str] = set()
    for _ in range(300):  # one move each, at a moment the reads cannot choose
        mover = threading.Timer(0.0005, registry.root.rename, (aside,))
        mover.start()
        while True:
            marker = active_marker(registry.root)
            seen.add(marker)
            if marker == gone:
                break
        mover.join()
        aside.rename(registry.root)
    assert seen == {present, gone}, seen - {present, gone}


def test_load_router_heads_serves_the_active_versions_pair_heads(tmp_path: Path) -> None:
    registry = RouterRegistry(tmp_path / "routers")
    first = _add(registry, seed=0, pair=("gpt-4o", "gpt-4o-mini"))
    staging = registry.staging_dir()
    _pair_head_dir(staging, "Meta/Llama-3-70B", "Meta/Llama-3-8B", seed=2)
    _pair_head_dir(staging, "other", "model", seed=2, encoder="minilm")  # another encoder: not loaded
    second = registry.add_version(staging, {"encoders": ["static"]})
    heads = load_router_heads("static", registry.root)
    assert heads.version == first and list(heads.pairs) == [("gpt-4o", "gpt-4o-mini")]
    # The shipped GPT-4/Mixtral head stays the generic difficulty prior; domain comes from the package.
    assert heads.sources["difficulty"] == str(DEFAULT_ROUTERS_DIR / "difficulty-gpt4-mixtral-static")
    assert heads.sources["domain"] == str(DEFAULT_ROUTERS_DIR / "domain-static")
    registry.promote(second, {"decision": "promoted"})
    heads = load_router_heads("static", registry.root)
    assert heads.version == second and list(heads.pairs) == [("Meta/Llama-3-70B", "Meta/Llama-3-8B")]
    assert (registry.info(second).path / f"difficulty-{slug('Meta/Llama-3-70B')}--meta-llama-3-8b-static").is_dir()
    # The shipped artifacts alone have no pair heads (their difficulty head is the prior).
    assert load_router_heads("static").pairs == {}


def test_two_heads_for_one_pair_are_ambiguous(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    original = _pair_head_dir(plain, "a", "b", seed=0)
    copy = plain / "difficulty-a--b-extra-static"
    shutil.copytree(original, copy)
    with pytest.raises(ValueError, match="two difficulty heads for a vs b"):
        load_router_heads("static", plain)


def test_a_version_missing_a_pair_head_it_lists_does_not_load(tmp_path: Path) -> None:
    """A head directory that lost its manifest (a partial copy) must fail the load, not be skipped: its route
    would silently fall back to the shipped GPT-4/Mixtral head."""
    registry = RouterRegistry(tmp_path / "routers")
    version = _add(registry, seed=0, pair=("gpt-4o", "gpt-4o-mini"))
    assert list(load_router_heads("static", registry.root).pairs) == [("gpt-4o", "gpt-4o-mini")]
    head_dir = registry.version_dir(version) / pair_artifact("gpt-4o", "gpt-4o-mini", "static")
    (head_dir / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"version\.json lists this pair head \(gpt-4o vs gpt-4o-mini\) but it is "
                                         r"missing or has no manifest\.json"):
        load_router_heads("static", registry.root)
    shutil.rmtree(head_dir)
    with pytest.raises(ValueError, match="the version is incomplete"):
        load_router_heads("static", registry.root)
    # Its heads are for encoder static: loading it for another is refused (its routes would read the shipped
    # head), unless the caller stands the shipped heads in for it (the promotion gate's baseline).
    with pytest.raises(ValueError, match="trained for encoder static, not 'minilm'"):
        load_router_heads("minilm", registry.root)
    assert load_router_heads("minilm", registry.root, other_encoders_ok=True).pairs == {}


def test_a_registry_trained_for_another_encoder_is_refused_not_served_by_the_shipped_heads(tmp_path: Path) -> None:
    """`pointsman train --encoders static` and a gateway with `classifiers.encoder: minilm`: the version has no
    minilm head, and its routes silently read the shipped GPT-4/Mixtral head while /v1/route and every decision
    record named the registry's version. The version cannot serve that encoder: start-up (and a hot reload)
    refuses it, naming the key and the encoders it was trained for."""
    from gateway.cli import main
    from policies.brain import RoutingConfigError, build_brain, parse_routing_config
    from tests.evals.labelled_files import STRONG, WEAK, rows, write_jsonl

    labels = write_jsonl(tmp_path / "labels.jsonl", rows(seed=1, n=60))
    out = tmp_path / "routers"
    assert main(["train", "--data", f"file:{labels}", "--encoders", "static", "--out", str(out), "--no-progress",
                 "--folds", "3"]) == 0

    def routing(encoder: str) -> Any:
        return parse_routing_config({
            "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                          "models": [STRONG, WEAK]}],
            "routes": [{"name": "auto", "cost_quality": {"strong": STRONG, "weak": WEAK, "threshold": 0.5}}],
            "classifiers": {"encoder": encoder, "routers_dir": str(out)},
        }, env={})

    assert build_brain(routing("static")).router_version == RouterRegistry(out).active_version()
    with pytest.raises(RoutingConfigError) as caught:
        build_brain(routing("minilm"))
    message = str(caught.value)
    assert message.startswith("classifiers.routers_dir: ") and "trained for encoder static" in message
    assert "'minilm' (classifiers.encoder)" in message and "--encoders minilm" in message
    # The version's heads copied into a plain directory (no version.json): the same.
    plain = tmp_path / "plain"
    shutil.copytree(RouterRegistry(out).version_dir(RouterRegistry(out).active_version() or ""), plain,
                    ignore=shutil.ignore_patterns("version.json"))
    assert set(load_router_heads("static", plain).pairs) == {(STRONG, WEAK)}
    with pytest.raises(ValueError, match="its pair heads are for encoder static, not 'minilm'"):
        load_router_heads("minilm", plain)
