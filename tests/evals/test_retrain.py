"""``pointsman train --data ... --out REGISTRY``: labelled files (JSONL, CSV) and logged traffic in, a
registry version out, served by ``load_router_heads``. Real files, a real SQLite store, the real
static encoder."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from classifiers.conversation import conversation_text
from classifiers.heads import build_features
from classifiers.provider import load_router_heads
from classifiers.registry import RouterRegistry
from evals.data.prior import load_prior_rows
from evals.labelled import DataError, load_source
from evals.trained_rows import key_hashes, load_trained_rows
from gateway.cli import main
from tests.evals.labelled_files import STRONG, TWIN, WEAK, prompts, rows, with_twin, write_csv, write_jsonl

TRAIN = ["--encoders", "static", "--no-progress"]


def _train(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["train", *args, *TRAIN])
    out = capsys.readouterr()
    return code, out.out, out.err


def _p_strong(heads: Any, pair: tuple[str, str], texts: list[str]) -> np.ndarray:
    from evals.embeddings import get_encoder

    encoder = get_encoder("static")
    rendered = [conversation_text({"messages": [{"role": "user", "content": t}]}) for t in texts]
    head = heads.pairs[pair]
    cheap = bool(head.manifest["feature_schema"]["cheap"])
    x = build_features(encoder.encode(rendered), rendered if cheap else None)
    return np.asarray(head.predict_proba(x)[:, 1])


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("labelled") / "labels.jsonl"
    return write_jsonl(path, rows(seed=1, n=160))


def test_train_from_a_labelled_file_writes_the_active_version_and_serves_it(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "routers"
    code, stdout, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(out))
    assert code == 0, stderr
    registry = RouterRegistry(out)
    (info,) = registry.versions()
    assert registry.active_version() == info.version
    assert f"wrote router version {info.version}" in stdout and "active version (its first)" in stdout
    # Strong = the model with the higher mean quality (big-model answers everything well).
    assert info.pairs == [{"strong": STRONG, "weak": WEAK, "artifact": "difficulty-big-model--small-model-static",
                           "encoder": "static"}]
    assert info.parent is None and info.created_at and info.encoders == ["static"]
    (data,) = info.data
    assert data["source"] == f"file:{labelled}" and data["rows"] == 160 and len(data["sha256"]) == 64
    (pair,) = info.metrics["pairs"]
    lo, hi = pair["cv_apgr_ci95"]
    assert pair["rows"] == 160 and pair["folds"] == 5 and lo <= pair["cv_apgr"] <= hi
    # The prompt decides who is needed, so the cross-validated figure clears the random band.
    assert pair["cv_apgr"] > 0.65 and lo > pair["random_apgr_band95"][1]
    assert f"CV APGR {pair['cv_apgr']:.3f}" in stdout
    # What it was trained on, as hashes the promotion gate reads: the file's prompts and the warm-start prior's.
    trained = load_trained_rows(info.path, info.raw["trained_rows"])
    assert trained is not None and info.raw["trained_rows"]["count"] == len(trained)
    expected = np.union1d(key_hashes(load_source(f"file:{labelled}").rows), key_hashes(load_prior_rows()))
    assert trained.normalised and np.array_equal(trained.hashes, expected)
    # Served: the registry as routers_dir gives the pair head, which sends math to the strong model.
    heads = load_router_heads("static", out)
    assert heads.version == info.version and set(heads.pairs) == {(STRONG, WEAK)}
    held = prompts(seed=99, n=40)
    p = _p_strong(heads, (STRONG, WEAK), [t for t, _ in held])
    is_math = np.array([m for _, m in held])
    assert p[is_math].mean() > p[~is_math].mean() + 0.3


async def test_a_target_share_knob_on_a_trained_version_is_calibrated_from_the_first_request(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from policies.brain import build_brain, explain_request, parse_routing_config

    out = tmp_path / "routers"
    assert _train(capsys, "--data", f"file:{labelled}", "--out", str(out))[0] == 0
    (head_dir,) = [p for p in (out / "versions").glob("*/difficulty-*") if p.is_dir()]
    recorded = json.loads((head_dir / "manifest.json").read_text())["score_quantiles"]["values"]
    assert len(recorded) == 101 and recorded == sorted(recorded)
    config = {
        "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False},
                      "models": [STRONG, WEAK]}],
        "routes": [{"name": "auto", "cost_quality": {"strong": STRONG, "weak": WEAK, "target_strong_share": 0.3}}],
        "classifiers": {"encoder": "static", "routers_dir": str(out)},
    }
    brain = build_brain(parse_routing_config(config, env={}), sticky=False, explore=False)
    await brain.start()
    try:
        held = prompts(seed=99, n=300)
        decided = [
            await explain_request(brain, "auto", {"model": "auto", "messages": [{"role": "user", "content": text}]})
            for text, _ in held
        ]
    finally:
        await brain.close()
    # No traffic yet, yet no "1 - target" threshold: the window starts as the head's out-of-fold scores.
    first = decided[0]["knob"]
    assert (first["threshold_source"], first["samples"]) == ("calibrated", 101)
    strong_share = np.mean([d["model"] == STRONG for d in decided])
    assert 0.2 <= strong_share <= 0.4, strong_share  # measured 0.273: the scores cluster, so not exactly 0.3


def test_a_second_training_is_inactive_reproducible_and_names_its_parent(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "routers"
    assert _train(capsys, "--data", f"file:{labelled}", "--out", str(out), "--folds", "3")[0] == 0
    code, stdout, _ = _train(capsys, "--data", f"file:{labelled}", "--out", str(out), "--folds", "3")
    assert code == 0
    registry = RouterRegistry(out)
    first, second = registry.versions()
    assert registry.active_version() == first.version
    assert second.parent == first.version
    assert f"pointsman promote {second.version} --registry {out}" in stdout
    # Same inputs and seed: the same weights, byte for byte.
    assert first.raw["weights_sha256"] == second.raw["weights_sha256"]
    assert (first.path / "trained_rows.npy").read_bytes() == (second.path / "trained_rows.npy").read_bytes()
    assert first.version.split("-")[1] == second.version.split("-")[1]
    assert second.raw["training"]["seed"] == 0 and second.raw["training"]["folds"] == 3


def test_strong_and_weak_can_be_named(tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "routers"
    data = f"file:{labelled}"
    named = ["--strong", WEAK, "--weak", STRONG, "--folds", "2"]
    code, _, stderr = _train(capsys, "--data", data, "--out", str(out), *named)
    assert code == 0, stderr
    heads = load_router_heads("static", out)
    assert set(heads.pairs) == {(WEAK, STRONG)}
    code, _, stderr = _train(capsys, "--data", data, "--out", str(out), "--strong", "gpt-9", "--weak", WEAK)
    assert code == 2 and "--strong 'gpt-9' has no quality in the data" in stderr


def test_csv_loads_like_the_same_rows_in_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = rows(seed=4, n=60)
    items[0]["weight"] = 2.5
    items[1]["scores"][WEAK] = None  # unknown: an empty cell in CSV
    jsonl = load_source(f"file:{write_jsonl(tmp_path / 'labels.jsonl', items)}").rows
    csv_rows = load_source(f"file:{write_csv(tmp_path / 'labels.csv', items)}").rows
    assert [(r.messages, r.qualities, r.costs, r.weight) for r in csv_rows] == [
        (r.messages, r.qualities, r.costs, r.weight) for r in jsonl
    ]
    assert csv_rows[1].qualities == {STRONG: 1.0, WEAK: None} and not csv_rows[1].labelled_for(STRONG, WEAK)
    # A CSV file trains like any other source.
    code, _, stderr = _train(capsys, "--data", f"file:{tmp_path / 'labels.csv'}", "--out", str(tmp_path / "routers"))
    assert code == 0, stderr
    # A directory of labelled files is a source too (both files, sorted by name).
    assert len(load_source(str(tmp_path)).rows) == 120


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "hi", "scores": {"a": 1.5, "b": 0}}', "scores.a: 1.5 is not a quality in [0, 1] (a 1-5 rating?"),
        ('{"prompt": "hi", "scores": {"a": 8, "b": 0}}', "scores.a: 8 is not a quality in [0, 1] (a 1-10 judge score? "
         "map it as (s - 1) / 9"),
        ('{"prompt": "hi", "scores": {"a": 85, "b": 0}}', "(a percentage? divide by 100)"),
        ('{"prompt": "hi", "scores": {"a": -0.5, "b": 0}}', "scores.a: -0.5 is not a quality in [0, 1]"),
        ('{"scores": {"a": 1, "b": 0}}', "needs messages (a list) or prompt"),
        ('{"prompt": "hi", "scores": {}}', "scores must be an object"),
        ('{"prompt": "hi", "scores": {"a": 1}, "weight": -1}', "weight: -1 is not a number >= 0"),
        ("not json", "not JSON"),
    ],
)
def test_bad_labelled_lines_name_the_file_line_and_field(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok", "scores": {"a": 1, "b": 0}}\n' + line + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: ") as err:
        load_source(f"file:{path}")
    assert message in str(err.value)
    code, _, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(tmp_path / "routers"))
    assert code == 2 and message in stderr


def test_spreadsheet_exports_load_and_other_encodings_are_named(tmp_path: Path) -> None:
    # Spreadsheets save "CSV UTF-8" with a byte-order mark and CRLF line ends.
    excel = tmp_path / "excel.csv"
    excel.write_bytes(b'\xef\xbb\xbfprompt,score:a,score:b\r\n"Caf\xc3\xa9 hours?",1,0\r\n"2+2",0.5,1\r\n')
    loaded = load_source(f"file:{excel}").rows
    assert [(r.messages[0]["content"], r.qualities) for r in loaded] == [
        ("Café hours?", {"a": 1.0, "b": 0.0}),
        ("2+2", {"a": 0.5, "b": 1.0}),
    ]
    bom_jsonl = tmp_path / "bom.jsonl"
    bom_jsonl.write_bytes(b'\xef\xbb\xbf{"prompt": "hi", "scores": {"a": 1, "b": 0}}\r\n')
    assert load_source(f"file:{bom_jsonl}").rows[0].qualities == {"a": 1.0, "b": 0.0}
    # A Latin-1 export: the file and line of the first byte that is not UTF-8, not a decoder's traceback.
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"prompt,score:a,score:b\n" + b"fine,1,0\n" * 3 + b'"caf\xe9",1,0\n')
    with pytest.raises(DataError, match=r"latin\.csv: line 5: not UTF-8 text \(byte 0xe9\); save the file as UTF-8"):
        load_source(f"file:{latin}")


def test_pandas_and_correct_incorrect_exports_load(tmp_path: Path) -> None:
    # json.dumps of a pandas row writes a missing value as NaN, and correct/incorrect columns as booleans.
    jsonl = tmp_path / "export.jsonl"
    jsonl.write_text(
        '{"prompt": "a", "scores": {"big": true, "small": NaN}, "costs": {"big": 0.01, "small": NaN}}\n'
        '{"prompt": "b", "scores": {"big": false, "small": 0.5}}\n'
    )
    loaded = load_source(f"file:{jsonl}").rows
    assert [(r.qualities, r.costs) for r in loaded] == [
        ({"big": 1.0, "small": None}, {"big": 0.01}),
        ({"big": 0.0, "small": 0.5}, {}),
    ]
    assert not loaded[0].labelled_for("big", "small") and loaded[1].labelled_for("big", "small")
    # The same in CSV: True/False as pandas writes bools, NaN or an empty cell for unknown.
    csv_path = tmp_path / "export.csv"
    csv_path.write_text("prompt,score:big,score:small,cost:small\na,True,nan,\nb,FALSE,0.5,NaN\n")
    assert [r.qualities for r in load_source(f"file:{csv_path}").rows] == [
        {"big": 1.0, "small": None},
        {"big": 0.0, "small": 0.5},
    ]
    # Anything else that is not a number is still named.
    csv_path.write_text("prompt,score:big,score:small\na,yes,0\n")
    with pytest.raises(DataError, match=r"export\.csv:2: column score:big: 'yes' is not a number"):
        load_source(f"file:{csv_path}")


def test_csv_without_score_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("prompt,quality\nhello,1\n")
    with pytest.raises(DataError, match=r"no score:<model> columns") as refused:
        load_source(f"file:{path}")
    assert "score:quality" in str(refused.value)  # 0/1 cells: named as a column that wants renaming


def test_csv_with_bare_model_columns_names_the_rename_it_needs(tmp_path: Path) -> None:
    # RouteLLM's and RouterBench's exports: one column per model, True/False or 0/1, a cost column each.
    path = tmp_path / "export.csv"
    path.write_text(
        ",sample_id,prompt,gpt-4,mixtral,gpt-4|total_cost,gpt-4|model_response\n"
        "0,arc.1,hello,True,False,0.0031,Hi there\n"
        "1,arc.2,bye,1,,0.0029,Bye\n"
    )
    with pytest.raises(DataError) as refused:
        load_source(f"file:{path}")
    message = str(refused.value)
    assert "2 columns look like per-model qualities" in message
    assert "'gpt-4' -> 'score:gpt-4'" in message and "'mixtral' -> 'score:mixtral'" in message
    # Neither the row index (0, 1), the ids, the cost nor the answer text is taken for a model.
    assert "score:sample_id" not in message and "score:gpt-4|total_cost" not in message
    assert "score:gpt-4|model_response" not in message and "score:'" not in message


def test_more_than_two_models_train_the_quality_head_and_every_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = rows(seed=2, n=120)
    rng = np.random.default_rng(0)
    for r in items:  # a middle model: right on half the prompts the weak one gets wrong
        r["scores"]["mid-model"] = r["scores"][STRONG] if rng.random() < 0.5 else r["scores"][WEAK]
        r["costs"]["mid-model"] = 0.003
    path = write_jsonl(tmp_path / "three.jsonl", items)
    out = tmp_path / "routers"
    code, stdout, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(out), "--folds", "3")
    assert code == 0, stderr
    heads = load_router_heads("static", out)
    assert set(heads.pairs) == {(STRONG, "mid-model"), (STRONG, WEAK), ("mid-model", WEAK)}
    assert heads.quality is not None and heads.quality.labels == ("big-model", "mid-model", "small-model")
    assert heads.quality.manifest["model_costs"]["values"] == {STRONG: 0.01, "mid-model": 0.003, WEAK: 0.0005}
    assert "quality head [static]: quality-labelled-static" in stdout


def test_a_pair_the_data_cannot_tell_apart_is_flagged_next_to_its_apgr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "twin.jsonl", with_twin(rows(seed=2, n=120), 2))
    code, stdout, stderr = _train(capsys, "--data", f"file:{path}", "--out", str(tmp_path / "routers"), "--folds", "3")
    assert code == 0, stderr
    info = RouterRegistry(tmp_path / "routers").versions()[-1]
    gaps = {frozenset((p["strong"], p["weak"])): p["quality_gap"] for p in info.raw["metrics"]["pairs"]}
    tie = gaps[frozenset((WEAK, TWIN))]
    assert tie["ci95"][0] < 0 < tie["ci95"][1] and not tie["resolved"]
    assert gaps[frozenset((STRONG, WEAK))]["ci95"][0] > 0.3 and gaps[frozenset((STRONG, WEAK))]["resolved"]
    # One note, under the near-tied pair's line, saying why its APGR means little.
    assert stdout.count("note: the two models' mean qualities are not told apart") == 1
    lines = stdout.splitlines()
    noted = next(i for i, line in enumerate(lines) if "note:" in line)
    assert {WEAK, TWIN} <= set(lines[noted - 1].replace("(", " ").split())


def test_an_existing_directory_that_is_not_a_registry_is_refused(
    tmp_path: Path, labelled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.txt").write_text("x")
    code, _, stderr = _train(capsys, "--data", f"file:{labelled}", "--out", str(tmp_path))
    assert code == 2 and "not a router registry" in stderr


def test_todays_calls_keep_rebuilding_the_shipped_artifacts() -> None:
    import argparse

    from evals.train import _labelled_mode

    def ns(**kw: Any) -> argparse.Namespace:
        base = {"data": None, "strong": None, "weak": None, "warm_start": None, "prior_weight": None, "out": None,
                "holdout": None}
        return argparse.Namespace(**{**base, **kw})

    from evals.data import resolve_data_dir

    shared = resolve_data_dir()
    assert not _labelled_mode(ns())
    assert not _labelled_mode(ns(out="./routers"))
    if (shared / "routellm").is_dir():
        assert not _labelled_mode(ns(data=[str(shared)]))
    assert _labelled_mode(ns(data=["bundled"], out="./routers"))
    assert _labelled_mode(ns(data=["file:x.jsonl"]))
    assert _labelled_mode(ns(data=["logs:sqlite:///x.db"]))


# --- logged traffic --------------------------------------------------------------------------------


def _write_store(path: Path, records: list[Any], feedback: list[Any]) -> None:
    from store import open_store_url

    async def write() -> None:
        store = open_store_url(f"sqlite:///{path}")
        await store.open()
        try:
            await store.write_batch(records)
            await store.write_feedback(feedback)
        finally:
            await store.close()

    asyncio.run(write())


def _record(request_id: str, model: str, conversation: Any) -> Any:
    from store import DecisionRecord

    return DecisionRecord(
        request_id=request_id, created_at=1_700_000_000.0, endpoint="chat.completions", route="auto",
        requested_model="auto", model=model, status=200, cost_usd=0.0005 if model == WEAK else 0.01,
        signals={"domain": {"value": "math"}}, conversation=conversation,
    )


def _conversation(request_id: str, *, text: str | None, embedding: np.ndarray | None) -> Any:
    from store import ConversationRecord

    return ConversationRecord(
        request_id=request_id, created_at=1_700_000_000.0, encoder_id="minilm-static-256" if embedding is not None
        else None, embedding=None if embedding is None else embedding.astype("<f4").tobytes(),
        text=None if text is None else json.dumps([{"role": "user", "content": text}]),
    )


def test_training_from_a_busy_store_reads_only_the_requests_with_feedback(tmp_path: Path) -> None:
    import tracemalloc

    from store import FeedbackRecord

    # 20,000 served requests, each with its conversation's embedding; 20 of them compared. Reading every
    # decision (about 6 KB each in memory: a store of millions did not fit) to keep the 20 is what it did.
    db = tmp_path / "pointsman.db"
    rng = np.random.default_rng(0)
    records = [_record(f"r{i}", WEAK, _conversation(f"r{i}", text=None, embedding=rng.normal(size=256)))
               for i in range(20_000)]
    feedback = [FeedbackRecord(f"r{i}", float(i % 2), source="judge", model=model)
                for i in range(0, 20_000, 1_000) for model in (STRONG, WEAK)]
    _write_store(db, records, feedback)
    del records
    tracemalloc.start()
    try:
        src = load_source(f"logs:sqlite:///{db}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(src.rows) == 20 and all(r.labelled_for(STRONG, WEAK) for r in src.rows)
    assert src.skipped == {"no quality feedback": 19_980}  # counted, as before, without being read
    assert src.logged_skipped == {"no quality feedback on the served answer": 20_000}  # judged, not served
    assert peak < 20 * 2**20, f"peak {peak / 2**20:.0f} MB to read 20 labelled requests"


def test_logs_join_feedback_per_model_and_skip_what_cannot_train(tmp_path: Path) -> None:
    from store import FeedbackRecord

    db = tmp_path / "pointsman.db"
    records = [
        _record("r1", WEAK, _conversation("r1", text="What is 12 * 13?", embedding=None)),
        _record("r2", STRONG, _conversation("r2", text="Say hi to Anna.", embedding=None)),
        _record("r3", WEAK, _conversation("r3", text="No feedback on this one.", embedding=None)),
        _record("r4", WEAK, None),  # feedback, but nothing of the conversation kept
    ]
    feedback = [
        FeedbackRecord("r1", 0.0, source="user"),  # about the served answer: small-model
        FeedbackRecord("r1", 1.0, source="judge", model=STRONG, metadata={"cost_usd": 0.02}),
        FeedbackRecord("r1", 1.0, source="judge", model=WEAK),  # a second opinion on small-model: averaged
        FeedbackRecord("r1", 0.2, metric="helpfulness", source="user"),  # another metric: ignored
        FeedbackRecord("r2", 1.0, source="user"),
        FeedbackRecord("r4", 1.0, source="user"),
    ]
    _write_store(db, records, feedback)
    src = load_source(f"logs:sqlite:///{db}")
    by_id = {r.request_id: r for r in src.rows}
    assert set(by_id) == {"r1", "r2"}
    assert by_id["r1"].qualities == {STRONG: 1.0, WEAK: 0.5}
    assert by_id["r1"].costs == {STRONG: 0.02, WEAK: 0.0005}
    assert by_id["r1"].messages == [{"role": "user", "content": "What is 12 * 13?"}]
    assert by_id["r1"].labelled_for(STRONG, WEAK) and not by_id["r2"].labelled_for(STRONG, WEAK)
    assert by_id["r1"].domain == "math" and by_id["r1"].source == "logs:auto"
    assert src.skipped == {"no quality feedback": 1, "neither text nor embedding stored": 1}
    assert src.describe()["skipped"] == src.skipped


def test_logs_never_read_a_conversation_text_past_its_retention(tmp_path: Path) -> None:
    """A route keeps the text for text_retention_days; a store not yet purged (the gateway was stopped, or
    its 10-minute purge has not come round) still holds it, but training reads it as deleted: the
    embedding stands in, and a request with only its text is left out."""
    import time

    from store import ConversationRecord, FeedbackRecord

    db = tmp_path / "pointsman.db"
    past, future = time.time() - 60, time.time() + 86_400
    vector = np.ones(256, dtype="<f4") / 16.0

    def kept(request_id: str, expires_at: float, embedding: bool) -> Any:
        return ConversationRecord(
            request_id=request_id, created_at=1_700_000_000.0, encoder_id="minilm-static-256" if embedding else None,
            embedding=vector.tobytes() if embedding else None, expires_at=expires_at,
            text=json.dumps([{"role": "user", "content": f"private question {request_id}"}]),
        )

    records = [
        _record("expired-with-embedding", WEAK, kept("expired-with-embedding", past, embedding=True)),
        _record("expired-text-only", WEAK, kept("expired-text-only", past, embedding=False)),
        _record("still-kept", WEAK, kept("still-kept", future, embedding=False)),
    ]
    feedback = [FeedbackRecord(r.request_id, 1.0, source="user") for r in records]
    _write_store(db, records, feedback)

    src = load_source(f"logs:sqlite:///{db}")
    by_id = {r.request_id: r for r in src.rows}
    assert set(by_id) == {"expired-with-embedding", "still-kept"}
    assert not by_id["expired-with-embedding"].has_text and by_id["expired-with-embedding"].embedding is not None
    assert by_id["still-kept"].messages == [{"role": "user", "content": "private question still-kept"}]
    assert src.skipped == {"neither text nor embedding stored": 1}
    assert all("private question expired" not in json.dumps(r.messages) for r in src.rows + src.logged)


def test_a_store_that_cannot_be_read_is_one_line_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from evals.labelled import display_spec

    out = str(tmp_path / "routers")
    code, stdout, stderr = _train(capsys, "--data", f"logs:sqlite:///{tmp_path / 'typo.db'}", "--out", out)
    assert code == 2 and "no SQLite database at" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "typo.db").exists()
    dsn = "postgresql://ops:s3cret@127.0.0.1:1/pointsman"
    code, stdout, stderr = _train(capsys, "--data", f"logs:{dsn}", "--out", out)
    assert code == 2 and "store postgresql://ops:***@127.0.0.1:1/pointsman: " in stderr
    assert "s3cret" not in stdout + stderr and "Traceback" not in stderr
    # What a version records of its sources and command line is masked the same way.
    assert display_spec(f"logs:{dsn}") == "logs:postgresql://ops:***@127.0.0.1:1/pointsman"
    assert display_spec("file:labels.jsonl") == "file:labels.jsonl"


def test_train_from_logs_uses_stored_embeddings_when_the_text_was_not_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from evals.embeddings import get_encoder
    from store import FeedbackRecord

    encoder = get_encoder("static")
    items = rows(seed=8, n=120)
    texts = [r["prompt"] for r in items]
    vectors = encoder.encode([conversation_text({"messages": [{"role": "user", "content": t}]}) for t in texts])
    records, feedback = [], []
    for i, (item, vector) in enumerate(zip(items, vectors, strict=True)):
        rid = f"req-{i}"
        keep_text = i % 2 == 0  # half the routes keep text; the others only the embedding
        conversation = _conversation(rid, text=item["prompt"] if keep_text else None, embedding=vector)
        served = WEAK if i % 3 else STRONG
        records.append(_record(rid, served, conversation))
        feedback.append(FeedbackRecord(rid, item["scores"][served], source="user"))
        other = STRONG if served == WEAK else WEAK
        feedback.append(FeedbackRecord(rid, item["scores"][other], source="judge", model=other))
    db = tmp_path / "pointsman.db"
    _write_store(db, records, feedback)
    out = tmp_path / "routers"
    code, _, stderr = _train(capsys, "--data", f"logs:sqlite:///{db}", "--out", str(out))
    assert code == 0, stderr
    heads = load_router_heads("static", out)
    head = heads.pairs[(STRONG, WEAK)]
    # Some requests have only their embedding: the head reads the embedding alone (no text statistics).
    assert head.manifest["feature_schema"]["cheap"] == []
    (pair,) = RouterRegistry(out).versions()[0].metrics["pairs"]
    assert pair["rows"] == 120 and pair["cv_apgr"] > 0.6
    assert RouterRegistry(out).versions()[0].data[0]["source"] == f"logs:sqlite:///{db}"


def test_warm_start_uses_the_bundled_data_as_a_prior(
    tmp_path: Path, labelled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evals.retrain import TrainOptions, train_registry_version

    # The prior ships in the package: no routing data directory is needed (an installed Pointsman has none).
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "no-data-here"))
    out = tmp_path / "routers"
    # The command's path with a smaller prior sample (the CLI's default is 3,000 prompts) to stay quick.
    opts = TrainOptions(sources=[f"file:{labelled}"], encoders=["static"], out=out, warm_start=True, folds=2,
                        prior_rows=600, progress=False)
    result = train_registry_version(opts, log=lambda _: None)
    (info,) = RouterRegistry(out).versions()
    assert info.version == result.version and info.raw["training"]["warm_start"] is True
    (pair,) = info.metrics["pairs"]
    assert pair["fit"]["prior_rows"] == 600 and pair["cv_apgr"] > 0.6
    prior = load_router_heads("static", out).pairs[(STRONG, WEAK)].manifest["data"]["prior"]
    assert prior["used"] and prior["source"] == "bundled" and prior["matches_pair"] is False
    assert prior["rows"] == 600


def test_a_prior_weight_without_a_prior_is_a_usage_error(tmp_path: Path, labelled: Path) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["train", "--data", f"file:{labelled}", "--out", str(tmp_path / "r"), "--prior-weight", "0.2",
              "--no-warm-start", *TRAIN])
    assert usage.value.code == 2


def test_the_shipped_prior_is_the_seeded_sample_of_the_bundled_data() -> None:
    # What `python -m evals.data.prior` rebuilds, byte for byte, from the routing data.
    import tempfile

    from evals.data import STRONG as GPT4
    from evals.data import WEAK as MIXTRAL
    from evals.data.prior import PRIOR_FILE, PRIOR_ROWS, build_prior_file, load_prior_rows
    from tests.conftest import routing_data_dir

    data = routing_data_dir("routellm")
    rows = load_prior_rows()
    assert len(rows) == PRIOR_ROWS
    assert all(set(r.qualities) == {GPT4, MIXTRAL} and r.source.startswith("bundled:") for r in rows)
    assert all(0.0 <= q <= 1.0 for r in rows for q in r.qualities.values() if q is not None)
    with tempfile.TemporaryDirectory() as tmp:
        rebuilt = Path(tmp) / "prior.jsonl.gz"
        build_prior_file(data, rebuilt)
        assert rebuilt.read_bytes() == PRIOR_FILE.read_bytes()


def _cv_interval_widths(out: str) -> tuple[float, float]:
    """The widths of the CV APGR interval and of the random band in ``pointsman train``'s summary."""
    found = re.search(r"CI ([0-9.]+) to ([0-9.]+)\] .*random(?: router)? ([0-9.]+) to ([0-9.]+)", out)
    assert found, out
    lo, hi, r_lo, r_hi = map(float, found.groups())
    return hi - lo, r_hi - r_lo


def test_a_file_judging_each_prompt_four_times_gets_the_cv_interval_of_its_distinct_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Four judgments of one prompt are not four prompts' worth of evidence: resampled row by row they
    # halved the interval (and the random band), making a head look surely better than a coin.
    once = write_jsonl(tmp_path / "once.jsonl", rows(seed=1, n=120))
    four = tmp_path / "four.jsonl"
    four.write_text(once.read_text() * 4)
    widths = []
    for data in (once, four):
        code = main(["train", "--data", f"file:{data}", "--encoders", "static", "--out", str(tmp_path / data.stem),
                     "--no-progress", "--folds", "3"])
        assert code == 0
        widths.append(_cv_interval_widths(capsys.readouterr().out))
    (ci_once, band_once), (ci_four, band_four) = widths
    assert 0.75 < ci_four / ci_once < 1.33 and 0.75 < band_four / band_once < 1.33, widths


def test_train_counts_rows_read_and_the_distinct_prompts_labelled_for_the_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file judging some prompts twice and holding rows with one model's score only: train said
    # "over 30 labelled prompts" for 30 rows labelled for both models of 24 distinct prompts.
    distinct = list({r["prompt"]: r for r in rows(seed=3, n=60)}.values())[:24]
    again = [{**r, "scores": {STRONG: 0.9, WEAK: 0.4}} for r in distinct[:6]]  # a second judgment
    strong_only = [{"prompt": f"Say good night to {name} in French.", "scores": {STRONG: 1.0}}
                   for name in ("Anna", "Ben", "Chloe", "Dev", "Emma")]
    weak_only = [{"prompt": r["prompt"], "scores": {WEAK: 0.5}} for r in distinct[6:9]]
    data = write_jsonl(tmp_path / "labels.jsonl", distinct + again + strong_only + weak_only)
    out = tmp_path / "routers"
    code, stdout, stderr = _train(capsys, "--data", f"file:{data}", "--out", str(out), "--no-warm-start",
                                  "--folds", "2")
    assert code == 0, stderr
    assert "  38 rows, models: big-model, small-model" in stdout
    assert "over 24 labelled prompts (30 rows labelled for both models)" in stdout
    # The registry records the same kinds of number: rows read per source, rows and prompts per pair head.
    (info,) = RouterRegistry(out).versions()
    assert info.data[0]["rows"] == 38
    (pair,) = info.metrics["pairs"]
    assert (pair["rows"], pair["prompts"]) == (30, 24)
    manifest = json.loads((info.path / pair["artifact"] / "manifest.json").read_text())
    assert (manifest["data"]["rows"], manifest["data"]["prompts"]) == (30, 24)
