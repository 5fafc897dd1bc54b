"""Heads exported to numpy give scikit-learn's probabilities, and survive a save/load round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from classifiers.heads import build_features, cheap_features, load_head
from classifiers.heads.fit import fit_calibration, fit_head


def _data(n_classes: int, n: int = 300, d: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = rng.normal(size=(d, n_classes))
    y = (x @ w + rng.normal(scale=0.5, size=(n, n_classes))).argmax(axis=1)
    return x, y


@pytest.mark.parametrize("n_classes", [2, 4])
@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_numpy_head_matches_sklearn(kind: str, n_classes: int) -> None:
    x, y = _data(n_classes)
    labels = [f"c{i}" for i in range(n_classes)]
    head, model = fit_head(kind, x, y, labels, seed=0, hidden=(16,), max_iter=300)
    z = (x - head.params["mean"]) / head.params["scale"]
    # Weights are stored as float32, so agreement is to float32 precision.
    np.testing.assert_allclose(head.raw_proba(x), model.predict_proba(z), atol=2e-5)


@pytest.mark.parametrize("kind", ["logreg", "mlp", "knn"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_save_load_round_trip_is_exact(tmp_path: Path, kind: str, n_classes: int) -> None:
    x, y = _data(n_classes, seed=1)
    head, _ = fit_head(kind, x[:200], y[:200], [f"c{i}" for i in range(n_classes)], hidden=(8,), k=15)
    fit_calibration(head, x[200:250], y[200:250])
    head.manifest = {"encoder": "test-encoder"}
    head.save(tmp_path / "h")
    loaded = load_head(tmp_path / "h")
    assert loaded.labels == head.labels
    assert loaded.manifest["encoder"] == "test-encoder"
    assert loaded.calibration == head.calibration
    np.testing.assert_array_equal(loaded.predict_proba(x[250:]), head.predict_proba(x[250:]))
    np.testing.assert_allclose(loaded.predict_proba(x[250:]).sum(axis=1), 1.0)


def test_artifact_has_no_pickle_and_rejects_swapped_weights(tmp_path: Path) -> None:
    x, y = _data(2)
    head, _ = fit_head("logreg", x, y, ["no", "yes"])
    head.save(tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["manifest.json", "weights.npz"]
    manifest = json.loads((tmp_path / "h" / "manifest.json").read_text())
    assert manifest["kind"] == "logreg" and manifest["labels"] == ["no", "yes"]
    other, _ = fit_head("logreg", x[:100], y[:100], ["no", "yes"])
    other.save(tmp_path / "other")
    (tmp_path / "h" / "weights.npz").write_bytes((tmp_path / "other" / "weights.npz").read_bytes())
    with pytest.raises(ValueError, match="sha256"):
        load_head(tmp_path / "h")


def test_platt_calibration_keeps_the_ranking() -> None:
    x, y = _data(2, n=400, seed=3)
    head, _ = fit_head("logreg", x[:300], y[:300], ["no", "yes"], C=10.0)
    raw = head.raw_proba(x[300:])[:, 1]
    calib = fit_calibration(head, x[300:], y[300:])
    assert calib["method"] == "platt"
    calibrated = head.predict_proba(x[300:])[:, 1]
    # Monotone map: ordered by the raw score, calibrated scores never decrease (ties may appear at saturation).
    assert np.all(np.diff(calibrated[np.argsort(raw)]) >= 0)


def test_features_append_cheap_text_statistics() -> None:
    emb = np.eye(2, 4, dtype=np.float32)
    feats = build_features(emb, ["What is 2 + 2?", "hello"])
    assert feats.shape == (2, 4 + len(cheap_features("x")))
    np.testing.assert_array_equal(feats[:, :4], emb)
    assert feats[0, 4] > feats[1, 4]  # the longer text has more characters
    with pytest.raises(ValueError):
        build_features(emb, ["only one text"])


def test_saving_twice_gives_identical_bytes(tmp_path: Path) -> None:
    # Reproducible artifacts: no timestamps inside the weights file.
    x, y = _data(2)
    head, _ = fit_head("logreg", x, y, ["no", "yes"])
    head.save(tmp_path / "a")
    head.save(tmp_path / "b")
    assert (tmp_path / "a" / "weights.npz").read_bytes() == (tmp_path / "b" / "weights.npz").read_bytes()


ROUTERS = Path(__file__).resolve().parents[2] / "classifiers" / "artifacts" / "routers"


@pytest.mark.parametrize(
    "name",
    ["difficulty-gpt4-mixtral-minilm", "difficulty-gpt4-mixtral-static", "domain-minilm", "domain-static"],
)
def test_shipped_artifacts_load_and_name_their_data(name: str) -> None:
    head = load_head(ROUTERS / name)
    m = head.manifest
    dim = m["feature_schema"]["embedding"]["dim"]
    assert head.n_features == dim + len(m["feature_schema"]["cheap"])
    # Shipped artifacts are trained on vendorable RouteLLM data only, never RouterBench.
    assert [s["license"] for s in m["data"]["sources"]] == ["Apache-2.0"]
    assert "routerbench" not in json.dumps(m).lower()
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(5, dim)), np.abs(rng.normal(size=(5, head.n_features - dim)))])
    proba = head.predict_proba(x)
    assert proba.shape == (5, len(head.labels))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert (ROUTERS / name / "weights.npz").stat().st_size < 300_000  # small enough to commit


def test_grouped_difficulty_head_round_trip_and_ranking(tmp_path: Path) -> None:
    from evals.data.records import PairRecord
    from evals.dataset import PairData
    from evals.difficulty import Candidate, fit_candidate

    rng = np.random.default_rng(5)
    recs, embs = [], []
    # Two groups with different gain rates, separable in embedding space.
    for i in range(200):
        hard = i % 2 == 0
        e = rng.normal(size=8) + (3.0 if hard else -3.0)
        strong, weak = 1.0, float(rng.random() > (0.7 if hard else 0.1))
        recs.append(PairRecord(f"p{i}", "mmlu", "hard" if hard else "easy", "knowledge", strong, weak, strong > weak))
        embs.append(e / np.linalg.norm(e))
    emb = np.array(embs, dtype=np.float32)
    data = PairData(
        records=recs,
        embeddings=emb,
        features=emb,
        split=np.array(["train"] * 200),
        dataset=np.array(["mmlu"] * 200),
        strong=np.array([r.strong_quality for r in recs]),
        weak=np.array([r.weak_quality for r in recs]),
        needed=np.array([int(r.strong_needed) for r in recs]),
        encoder_id="test",
    )
    fitted = fit_candidate(Candidate("grouped", {"tau": 0.1, "alpha": 10.0}), data, np.ones(200, dtype=bool), seed=0)
    head = fitted.head
    assert head is not None
    scores = head.predict_proba(emb)[:, 1]
    hard = np.array([r.group == "hard" for r in recs])
    assert scores[hard].mean() > scores[~hard].mean()
    head.save(tmp_path / "g")
    np.testing.assert_array_equal(load_head(tmp_path / "g").predict_proba(emb), head.predict_proba(emb))


def test_multilabel_head_fits_each_label_on_its_known_rows_and_round_trips(tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression

    from classifiers.heads.fit import fit_multilabel

    rng = np.random.default_rng(4)
    x = rng.normal(size=(400, 6))
    y = (x[:, :3] + rng.normal(scale=0.7, size=(400, 3)) > 0).astype(float)
    y[::7, 1] = np.nan  # unknown outcomes of label 1: skipped for that label only
    y[:, 2] = 1.0  # a label that is always true
    head = fit_multilabel(x[:300], y[:300], ["a", "b", "c"], C=1.0)
    assert head.kind == "multilabel" and head.config["constant_labels"] == ["c"]
    z = (x - head.params["mean"]) / head.params["scale"]
    known = ~np.isnan(y[:300, 1])
    reference = LogisticRegression(C=1.0, max_iter=2000).fit(z[:300][known], y[:300, 1][known] > 0.5)
    raw = head.raw_proba(x[300:])
    np.testing.assert_allclose(raw[:, 1], reference.predict_proba(z[300:])[:, 1], atol=2e-5)
    assert np.all(raw[:, 2] > 0.99)
    calib = fit_calibration(head, x[300:], y[300:])
    assert calib["method"] == "platt_per_label" and calib["a"][2] == 1.0 and calib["b"][2] == 0.0
    calibrated = head.predict_proba(x[300:])
    assert calibrated.shape == (100, 3) and not np.allclose(calibrated.sum(axis=1), 1.0)
    assert np.all(np.diff(calibrated[np.argsort(raw[:, 0]), 0]) >= 0)  # Platt per label keeps each ranking
    head.save(tmp_path / "q")
    loaded = load_head(tmp_path / "q")
    assert loaded.labels == ("a", "b", "c")
    np.testing.assert_array_equal(loaded.predict_proba(x[300:]), calibrated)


def test_router_heads_come_from_routers_dir_first_then_the_shipped_ones(tmp_path: Path) -> None:
    import shutil

    from classifiers.provider import DEFAULT_ROUTERS_DIR, load_router_heads

    shipped = load_router_heads("static")
    assert shipped.sources == {
        "difficulty": str(DEFAULT_ROUTERS_DIR / "difficulty-gpt4-mixtral-static"),
        "domain": str(DEFAULT_ROUTERS_DIR / "domain-static"),
    }
    # A directory with only its own difficulty head: that one wins, domain still comes from the package.
    own = tmp_path / "routers"
    shutil.copytree(DEFAULT_ROUTERS_DIR / "difficulty-gpt4-mixtral-static", own / "difficulty-gpt4-mixtral-static")
    mixed = load_router_heads("static", own)
    assert mixed.sources["difficulty"] == str(own / "difficulty-gpt4-mixtral-static")
    assert mixed.sources["domain"] == str(DEFAULT_ROUTERS_DIR / "domain-static")
    assert mixed.root == own
    # An empty or missing directory changes nothing.
    assert load_router_heads("static", tmp_path / "missing").sources == shipped.sources


def test_cheap_statistics_count_unicode_digits_and_math_symbols_as_documented() -> None:
    # "digits" is str.isdigit (superscripts and Arabic-Indic digits count), "math_symbols" the share
    # of +-*/=^<>%$ characters; a curly quote makes the text non-ASCII, which the counts must not mind.
    text = "x² + ٣ = 5% of 1,000? It’s 7 / 2"
    stats = dict(
        zip(
            ["log_chars", "log_words", "log_lines", "log_digits", "log_numbers", "math", "non_ascii", "q"],
            cheap_features(text),
            strict=True,
        )
    )
    digits = sum(c.isdigit() for c in text)
    assert digits == 9  # ² ٣ 5 1 0 0 0 7 2
    assert stats["log_digits"] == pytest.approx(np.log1p(digits))
    assert stats["math"] == pytest.approx(4 / len(text))  # + = % / and nothing else
    assert stats["non_ascii"] == pytest.approx(3 / len(text))  # ² ٣ ’
    assert stats["q"] == pytest.approx(np.log1p(1))
    assert cheap_features("") == [0.0] * 8


def test_grouped_head_score_is_the_gate_weighted_rate_plus_family_experts() -> None:
    # The documented formula, written out independently of the serving code, on a random grouped head.
    from classifiers.heads.head import Head

    rng = np.random.default_rng(11)
    dim, n_groups, n_extra = 6, 5, 2
    params = {
        "mean": rng.normal(size=dim + n_extra),
        "scale": rng.uniform(0.5, 2.0, size=dim + n_extra),
        "centroids": rng.normal(size=(n_groups, dim)).astype(np.float32),
        "log_prior": rng.normal(size=n_groups),
        "rates": rng.normal(size=n_groups),
        "family": np.array([0, 0, 1, 2, 1], dtype=np.int8),
        "expert_coef": rng.normal(size=(3, dim + n_extra)).astype(np.float32),
        "expert_intercept": rng.normal(size=3),
    }
    config = {"n_classes": 2, "embedding_dim": dim, "tau": 0.3}
    head = Head(kind="grouped", labels=("weak_ok", "strong_needed"), params=params, config=config)
    x = rng.normal(size=(7, dim + n_extra))
    expected = []
    for row in x:
        e = row[:dim] / np.linalg.norm(row[:dim])
        logits = params["centroids"].astype(float) @ e / 0.3 + params["log_prior"]
        gate = np.exp(logits - logits.max())
        gate /= gate.sum()
        z = (row - params["mean"]) / params["scale"]
        experts = params["expert_coef"].astype(float) @ z + params["expert_intercept"]
        score = gate @ params["rates"] + sum(gate[params["family"] == f].sum() * experts[f] for f in range(3))
        expected.append(1.0 / (1.0 + np.exp(-score)))
    proba = head.predict_proba(x)
    np.testing.assert_allclose(proba[:, 1], expected, rtol=1e-12)
    np.testing.assert_allclose(proba[:, 0], 1.0 - np.array(expected), rtol=1e-12)
