"""``pointsman eval``'s numbers and files: metric functions on cases with known answers, the report
files (JSON, Markdown, HTML with the PNGs it shows) and the command end to end on a labelled file."""

from __future__ import annotations

import html
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from evals.metrics import (
    CurvePoint,
    aiq,
    apgr,
    bootstrap,
    cpt,
    ece,
    ips_qualities,
    oracle_curve,
    percentile_ci,
    random_curves,
    reliability,
    routing_curve,
    upper_frontier,
)
from evals.report import PairTable, compute_report, headline, knn_scores
from evals.report_render import write_report
from gateway.cli import main as pointsman
from tests.evals.labelled_files import rows as labelled_rows
from tests.evals.labelled_files import write_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def table(n: int = 400, seed: int = 0, *, informative: float = 1.0) -> PairTable:
    """Requests whose strong-model gain is 1 exactly where a hidden feature is positive; the route's
    score sees that feature with noise (``informative`` = 0: pure noise)."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=n)
    strong = np.ones(n)
    weak = (hidden < 0).astype(float)
    score = 1 / (1 + np.exp(-(informative * hidden + rng.normal(size=n))))
    emb = np.c_[hidden, rng.normal(size=(n, 7))]
    return PairTable(
        strong_q=strong, weak_q=weak, strong_cost=np.full(n, 0.01), weak_cost=np.full(n, 0.001), scores=score,
        pins=np.zeros(n, dtype=int), knob_strong=score >= 0.5,
        sources=np.array(["a", "b"] * (n // 2), dtype=object), domains=np.array(["x"] * n, dtype=object),
        direct=np.ones(n, dtype=bool), embeddings=emb,
    )


# ----------------------------------------------------------------------------- metrics, known answers


def test_always_weak_is_pgr_0_always_strong_pgr_1() -> None:
    t = table()
    for strong, expected in ((False, 0.0), (True, 1.0)):
        t.knob_strong = np.full(len(t), strong)
        numbers = headline(t, None)
        assert numbers["knob.pgr"] == pytest.approx(expected)
        assert numbers["knob.share"] == float(strong)
        assert numbers["knob.cost"] == pytest.approx(0.01 if strong else 0.001)


def test_random_router_scores_about_half() -> None:
    t = table(n=2000)
    apgrs, shares, qualities = random_curves(t.strong_q, t.weak_q, draws=200, seed=1)
    assert np.mean(apgrs) == pytest.approx(0.5, abs=0.01)
    lo, hi = percentile_ci(apgrs)
    assert lo < 0.5 < hi and hi - lo < 0.1
    assert shares == pytest.approx(np.linspace(1, 0, 11), abs=1e-3)
    # The expected random curve is the straight line between always-weak and always-strong.
    line = t.weak_q.mean() + shares * (t.strong_q.mean() - t.weak_q.mean())
    assert qualities.mean(axis=0) == pytest.approx(line, abs=0.01)


def test_oracle_apgr_by_hand_and_a_perfect_scorer_reaches_it() -> None:
    # Ten requests, the whole gap on one: the oracle recovers it with 10% strong calls, so over the
    # 0, 10, ..., 100% grid it loses only the first half-step: APGR = 1 - 1/(2 * 10).
    strong = np.array([1.0] + [0.5] * 9)
    weak = np.array([0.0] + [0.5] * 9)
    curve = oracle_curve(strong, weak, steps=10)
    assert apgr(curve, float(strong.mean()), float(weak.mean())) == pytest.approx(0.95)
    # Continuous gains, all positive: a router that scores each request by its true gain is the oracle.
    rng = np.random.default_rng(4)
    qw = rng.random(1001) * 0.5
    qs = qw + rng.random(1001) * 0.5
    s, w = float(qs.mean()), float(qw.mean())
    perfect = apgr(routing_curve(qs - qw, qs, qw), s, w)
    oracle = apgr(oracle_curve(qs, qw), s, w)
    assert perfect == pytest.approx(oracle, abs=0.005)
    assert apgr(routing_curve(rng.random(1001), qs, qw), s, w) < perfect


def test_cpt_exact_on_a_toy_curve() -> None:
    curve = [CurvePoint(0.9, 0.0, 0.2), CurvePoint(0.5, 0.5, 0.6), CurvePoint(0.1, 1.0, 1.0)]
    # PGR 0.5 = quality 0.6, reached at exactly 50%; PGR 0.8 = quality 0.84: 60% of the way from 50% to 100%.
    assert cpt(curve, 0.5, strong=1.0, weak=0.2) == pytest.approx(0.5)
    assert cpt(curve, 0.8, strong=1.0, weak=0.2) == pytest.approx(0.8)


def test_ece_of_a_calibrated_scorer_is_near_zero_and_of_an_overconfident_one_is_its_gap() -> None:
    rng = np.random.default_rng(2)
    p = rng.random(200_000)
    y = rng.random(200_000) < p
    assert ece(p, y) < 0.01
    bins = reliability(p, y)
    assert [b.count for b in bins] == pytest.approx([20_000] * 10, rel=0.05)
    assert all(abs(b.mean_predicted - b.observed) < 0.02 for b in bins)
    # Always 0.9, right half the time: ECE 0.4 exactly, all in the last bin.
    assert ece(np.full(100, 0.9), np.arange(100) % 2 == 0) == pytest.approx(0.4)


def test_frontier_is_the_non_decreasing_concave_hull_and_aiq_its_mean() -> None:
    costs = [0.0, 1.0, 2.0, 3.0, 4.0]
    quals = [0.0, 0.2, 0.9, 0.95, 0.9]  # (1, .2) lies under the chord (0,0)-(2,.9); (4, .9) is worse than (3, .95)
    x, y = upper_frontier(costs, quals)
    assert list(x) == [0.0, 2.0, 3.0, 4.0]
    assert list(y) == pytest.approx([0.0, 0.9, 0.95, 0.95])
    # Area: 0.9 (triangle 0..2) + 0.925 (2..3) + 0.95 (3..4) = 2.775 over a range of 4.
    assert aiq(costs, quals, 0.0, 4.0) == pytest.approx(2.775 / 4)
    # Mixing always-weak and always-strong: a straight line, AIQ = the mean of the two ends.
    assert aiq([1.0, 3.0], [0.4, 0.8], 1.0, 3.0) == pytest.approx(0.6)


def test_pinned_requests_keep_their_model_at_every_threshold() -> None:
    scores = np.array([0.1, 0.2, 0.3, 0.4, np.nan, np.nan])
    pins = np.array([0, 0, 0, 0, 1, -1])
    strong = np.array([1.0, 0, 1, 1, 1, 0])
    weak = np.array([1.0, 0, 0, 0, 0, 1])
    curve = routing_curve(scores, strong, weak, 2, pinned=pins)
    # Edges from the four scored requests only; request 4 always strong, request 5 always weak.
    assert [p.threshold for p in curve] == pytest.approx([0.1, 0.25, 0.4])
    assert [p.strong_share for p in curve] == pytest.approx([5 / 6, 3 / 6, 1 / 6])
    assert [p.quality for p in curve] == pytest.approx([5 / 6, 5 / 6, 3 / 6])
    # No pins: exactly RouteLLM's sweep.
    free = routing_curve(scores[:4], strong[:4], weak[:4], 2)
    assert [p.strong_share for p in free] == pytest.approx([1.0, 0.5, 0.0])


def test_ips_estimates_a_policy_from_logs_that_only_show_the_served_model() -> None:
    rng = np.random.default_rng(5)
    n = 200_000
    qs, qw = (rng.random(n) < 0.8).astype(float), (rng.random(n) < 0.5).astype(float)
    # Logging policy: strong with probability 0.3 (exploration); only the served outcome is seen.
    served_strong = rng.random(n) < 0.3
    reward = np.where(served_strong, qs, qw)
    s_col, w_col = ips_qualities(served_strong, reward, np.where(served_strong, 0.3, 0.7))
    assert s_col.mean() == pytest.approx(qs.mean(), abs=0.01)  # always-strong, estimated
    assert w_col.mean() == pytest.approx(qw.mean(), abs=0.01)
    target = rng.random(n) < 0.5  # any fixed policy
    assert np.where(target, s_col, w_col).mean() == pytest.approx(np.where(target, qs, qw).mean(), abs=0.01)


def test_bootstrap_is_paired_and_its_interval_covers_the_mean() -> None:
    x = np.random.default_rng(6).normal(1.0, 1.0, 500)
    draws = bootstrap(lambda i: {"mean": x[i].mean(), "twice": 2 * x[i].mean()}, len(x), 400, seed=0)
    lo, hi = percentile_ci(draws["mean"])
    assert lo < x.mean() < hi and hi - lo == pytest.approx(2 * 1.96 / math.sqrt(500), rel=0.2)
    assert draws["twice"] == pytest.approx(2 * draws["mean"])  # same resample for every key


def test_knn_is_cross_fitted_and_ranks_by_neighbours_gain() -> None:
    t = table(n=400)
    assert t.embeddings is not None
    scores = knn_scores(t.embeddings, t.strong_q - t.weak_q, k=10)
    s, w = float(t.strong_q.mean()), float(t.weak_q.mean())
    assert apgr(routing_curve(scores, t.strong_q, t.weak_q), s, w) > 0.6
    # Cross-fitted: a request's own label never scores it (duplicated rows would otherwise get 1.0).
    one = np.eye(4)[[0, 0, 1, 1, 2, 2, 3, 3]].astype(float)
    gain = np.array([1.0, 0, 1, 0, 1, 0, 1, 0])
    assert set(knn_scores(one, gain, k=1, folds=8).tolist()) <= {0.0, 1.0}
    assert not np.array_equal(knn_scores(one, gain, k=1, folds=8), gain)


# ----------------------------------------------------------------------------- the report files


def _report(t: PairTable, **kwargs: Any) -> dict[str, Any]:
    meta = {"route": "auto", "router_version": "test", "pair": {"strong": "big", "weak": "small"},
            "estimator": {"name": "direct", "text": "direct"}, "cost_basis": {"kind": "labelled", "text": "labelled"},
            "knob": {"threshold": 0.5, "threshold_source": "config"}, "data": [{"source": "test", "rows": len(t)}]}
    return compute_report(t, meta=meta, draws=100, seed=0, **kwargs)


def test_report_numbers_put_a_good_router_above_random_and_a_blind_one_inside_its_band() -> None:
    good = _report(table(n=600, informative=3.0))
    blind = _report(table(n=600, informative=0.0))
    band = good["routers"]["random"]["apgr"]["ci"]
    assert good["routers"]["router"]["apgr"]["ci"][0] > band[1]
    assert band[0] < blind["routers"]["router"]["apgr"]["value"] < band[1]
    for name in ("router", "knn", "oracle"):
        for key in ("apgr", "cpt50", "cpt80", "aiq"):
            lo, hi = good["routers"][name][key]["ci"]
            assert lo <= good["routers"][name][key]["value"] <= hi, (name, key)
    assert good["routers"]["oracle"]["apgr"]["value"] >= good["routers"]["router"]["apgr"]["value"]
    knob = good["knob"]
    assert knob["strong_share"]["value"] == pytest.approx(np.mean(table(n=600, informative=3.0).knob_strong))
    assert {g["group"] for g in good["breakdown"]["source"]} == {"a", "b"}
    assert "router-knn" in good["differences"]


def test_a_route_whose_apgr_clears_the_random_band_is_not_called_indistinguishable_from_random() -> None:
    """The random band is where random scores' APGR falls on these very requests (the null): an APGR above its
    top is better than random. The verdict asked the route's own lower 95% bound to clear the band's top, two
    intervals stacked, and called a route "not distinguishable from random" at APGR 0.600 [0.552, 0.645]
    against random 0.499 [0.449, 0.553] on 1,068 held-out RouterBench prompts."""
    from evals.report_render import render_markdown

    weak_signal = _report(table(n=600, seed=1, informative=0.2))
    route, band = weak_signal["routers"]["router"]["apgr"], weak_signal["routers"]["random"]["apgr"]["ci"]
    assert route["ci"][0] < band[1] < route["value"]  # the case: above the band, its interval reaching into it
    verdict = render_markdown(weak_signal)
    assert "The route ranks requests better than random: its APGR (0.530) is above the random band" in verdict
    assert "not distinguishable from random" not in verdict
    blind = _report(table(n=600, seed=1, informative=0.0))
    assert blind["routers"]["router"]["apgr"]["value"] < blind["routers"]["random"]["apgr"]["ci"][1]
    assert "The route is not distinguishable from random here: its APGR (" in render_markdown(blind)


def test_report_files_are_written_and_the_html_shows_existing_pngs(tmp_path: Path) -> None:
    t = table(n=300)
    t.pins[:10] = 1  # a rule routed some requests: the report says so
    t.scores[:10] = np.nan
    paths = write_report(_report(t), tmp_path / "out", [{"index": 0, "model": "big", "score": None}])
    out = tmp_path / "out"
    data = json.loads((out / "report.json").read_text())  # strict JSON: NaN became null
    assert "NaN" not in (out / "report.json").read_text()
    assert data["rows"]["pinned_by_rules"] == 10
    page = (out / "report.html").read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    assert set(images) == {"pgr_curve.png", "frontier.png", "reliability.png", "breakdown.png"}
    for name in images:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert (out / name).stat().st_size > 10_000
    markdown = (out / "report.md").read_text()
    assert all(f"]({name})" in markdown for name in images)
    for text in (page, markdown):
        assert "APGR" in text and "CPT(50)" in text and "AIQ" in text and "ECE" in text
        assert "random" in text and "kNN" in text and "oracle" in text and "always-weak" in text
    assert "estimator" in page and "direct" in page
    # The verdict: one sentence against random, its own against kNN.
    assert re.search(r"The route .*random.*\)\. Compared with kNN: (better on this data|worse on "
                     r"this data|not distinguishable) \(APGR difference ", markdown)
    assert (out / "decisions.jsonl").read_text().count("\n") == 1
    assert paths["html"] == out / "report.html"


def _png_description(path: Path) -> str | None:
    from PIL import Image

    with Image.open(path) as image:
        description: str | None = getattr(image, "text", {}).get("Description")
        return description


def test_a_pair_the_data_cannot_tell_apart_gets_a_caution_before_its_apgr(tmp_path: Path) -> None:
    t = table(n=400)
    rng = np.random.default_rng(1)
    flips = rng.random(400) < 0.1  # the strong model is the weak one with a tenth of outcomes flipped
    t.strong_q[:] = np.where(flips, 1 - t.weak_q, t.weak_q)
    tie = _report(t)
    lo, hi = tie["quality_gap"]["ci"]
    assert lo < 0 < hi and not tie["quality_gap"]["resolved"]
    (warning,) = tie["warnings"]
    # Nor does any group get an APGR: within a group the gap is just as unresolved.
    assert [("apgr" in g, g["gap_resolved"]) for g in tie["breakdown"]["source"]] == [(False, False)] * 2
    assert all("apgr" in g and g["gap_resolved"] for g in _report(table(n=400))["breakdown"]["source"])
    assert "not told apart" in warning and f"{tie['quality_gap']['value']:+.3f}" in warning
    write_report(tie, tmp_path / "tie", [])
    for name in ("report.md", "report.html"):
        text = html.unescape((tmp_path / "tie" / name).read_text())
        assert "Caution: the two models' mean qualities are not told apart" in text, name
        assert text.index("Caution") < text.index("The route")  # before the verdict it qualifies
    # The PGR plot carries it too: a plot is often looked at (or pasted) on its own.
    assert "not told apart" in (_png_description(tmp_path / "tie" / "pgr_curve.png") or "")
    clear = _report(table(n=400))
    assert clear["quality_gap"]["resolved"] and clear["quality_gap"]["ci"][0] > 0.4 and clear["warnings"] == []
    write_report(clear, tmp_path / "clear", [])
    assert _png_description(tmp_path / "clear" / "pgr_curve.png") is None


def test_a_pair_whose_weak_model_does_better_gets_a_caution(tmp_path: Path) -> None:
    t = table(n=400)
    t.strong_q[:], t.weak_q[:] = t.weak_q.copy(), t.strong_q.copy()  # the configured strong model is worse
    upside_down = _report(t)
    assert upside_down["quality_gap"]["ci"][1] < 0 and upside_down["quality_gap"]["inverted"]
    (warning,) = upside_down["warnings"]
    assert "the weak model does better than the strong one" in warning and "upside down" in warning
    # Nor does a group whose weak model does better get an APGR (it would read upside down too).
    assert [("apgr" in g, g["gap_inverted"]) for g in upside_down["breakdown"]["source"]] == [(False, True)] * 2
    write_report(upside_down, tmp_path / "inv", [])
    assert "Caution: the weak model does better" in html.unescape((tmp_path / "inv" / "report.md").read_text())
    assert "upside down" in (_png_description(tmp_path / "inv" / "pgr_curve.png") or "")
    assert _report(table(n=400))["quality_gap"]["inverted"] is False
    # Its random baseline mixes the two models: the frontier of (cheap, better) and (dear, worse) is flat at
    # the weak model's quality, as it is for the route's own AIQ; the mean of the two ends was below that.
    assert upside_down["routers"]["random"]["aiq"]["value"] == pytest.approx(float(t.weak_q.mean()))
    assert upside_down["routers"]["router"]["aiq"]["value"] >= upside_down["routers"]["random"]["aiq"]["value"]


def test_a_domain_a_rule_routes_entirely_gets_no_apgr_and_the_report_does_not_fail() -> None:
    # A rule sends every "code" request strong: in that domain no threshold moves anything (one point, no
    # share range), so its APGR is undefined; it divided by zero and the whole eval failed.
    t = table(n=400, informative=3.0)
    t.domains = np.array(["code" if i % 4 == 0 else "chat" for i in range(400)], dtype=object)
    code = t.domains == "code"
    t.pins = np.where(code, 1, 0)
    t.scores = np.where(code, np.nan, t.scores)
    t.knob_strong = code | (t.scores >= 0.5)
    groups = {g["group"]: g for g in _report(t)["breakdown"]["domain"]}
    assert math.isnan(groups["code"]["apgr"]["value"]) and groups["code"]["knob_share"] == 1.0
    assert groups["chat"]["apgr"]["value"] > 0.6


def test_the_random_band_keeps_the_requests_a_rule_pinned_on_their_model() -> None:
    # A rule sends 30% of the requests strong, among them most of those where the strong model gains; the
    # knob's score is a coin. The route's APGR then comes from the rule alone: the random band, drawn with
    # the same rule, must hold it (drawn without it, the band sat far below and the coin "beat random").
    t = table(n=600, informative=0.0)
    rng = np.random.default_rng(4)
    gain = t.strong_q - t.weak_q
    t.pins = np.where(rng.random(600) < np.where(gain > 0, 0.5, 0.1), 1, 0)
    t.scores = np.where(t.pins == 0, t.scores, np.nan)
    t.knob_strong = (t.pins > 0) | (t.scores >= 0.5)
    report = _report(t)
    route, band = report["routers"]["router"]["apgr"]["value"], report["routers"]["random"]["apgr"]["ci"]
    assert route > 0.6 and band[0] < route < band[1]
    # Every point of the random curve keeps the pinned requests strong, like the route's.
    pinned_share = float((t.pins > 0).mean())
    assert min(p["share"] for p in report["routers"]["random"]["curve"]) == pytest.approx(pinned_share)
    assert min(p["share"] for p in report["routers"]["router"]["curve"]) == pytest.approx(pinned_share)
    # Every request pinned: no threshold moves anything, so neither the route nor random has an APGR or CPT.
    t.pins = np.where(t.pins == 0, -1, 1)
    t.scores = np.full(600, np.nan)
    everything_pinned = _report(t)["routers"]
    assert all(math.isnan(everything_pinned[name][key]["value"]) for name in ("router", "random")
               for key in ("apgr", "cpt50", "cpt80"))


# ----------------------------------------------------------------------------- the command


def eval_config(path: Path, **cost_quality: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "backends": [{"name": "fake", "base_url": "http://127.0.0.1:9/v1", "models": [
            {"name": "big-model", "input_cost_per_mtok": 10, "output_cost_per_mtok": 30},
            {"name": "small-model", "input_cost_per_mtok": 0.5, "output_cost_per_mtok": 1.5},
        ]}],
        "classifiers": {"encoder": "static"},
        "routes": [{
            "name": "auto", "policy": "rules",
            "signals": {"keywords": {"greet": {"keywords": ["say hello"]}}},
            "rules": [{"name": "hello-small", "when": {"signal": "greet", "op": "truthy"},
                       "action": {"route": "small-model"}}],
            "cost_quality": {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                             **(cost_quality or {"target_strong_share": 0.4})},
            "sticky": {"ttl": 600},
        }],
    }))
    return path


def test_costs_missing_on_some_rows_are_said_to_be_missing_on_some(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One row without its costs sends the report to the configured prices for every row: it says so,
    instead of 'the data has no per-request costs' about data that has them on 59 rows of 60."""
    items = labelled_rows(seed=3, n=60)
    del items[5]["costs"]
    data = write_jsonl(tmp_path / "labels.jsonl", items)
    out = tmp_path / "report"
    code = pointsman(["eval", "--config", str(eval_config(tmp_path / "config.yaml")), "--route", "auto",
                      "--data", f"file:{data}", "--out", str(out), "--bootstrap", "20", "--no-progress"])
    assert code == 0, capsys.readouterr().out
    basis = json.loads((out / "report.json").read_text())["cost_basis"]
    assert basis["kind"] == "prices"
    assert "1 of 60 requests have no cost for both models" in basis["text"]
    assert "the data has no per-request costs" not in basis["text"]


def test_pointsman_eval_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = labelled_rows(seed=7, n=240)
    for i, item in enumerate(items):
        item["source"] = "tickets" if i % 2 else "chat"
    data = write_jsonl(tmp_path / "labels.jsonl", items)
    config = eval_config(tmp_path / "config.yaml")
    out = tmp_path / "report"
    code = pointsman(["eval", "--config", str(config), "--route", "auto", "--data", f"file:{data}",
                      "--out", str(out), "--bootstrap", "200", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "APGR" in printed and str(out / "report.html") in printed
    report = json.loads((out / "report.json").read_text())
    assert report["rows"]["evaluated"] == 240
    assert report["pair"] == {"strong": "big-model", "weak": "small-model", "strong_data": "big-model",
                              "weak_data": "small-model"}
    assert report["estimator"]["name"] == "direct"
    assert report["cost_basis"]["kind"] == "labelled"
    assert report["knob"]["target_share"] == 0.4
    assert report["knob"]["threshold_source"] == "target share over the replayed set"
    # The rule's requests are pinned to the weak model; the knob sends ~40% of the others strong.
    said_hello = sum("Say hello" in item["prompt"] for item in items)
    assert report["rows"]["decided_by"]["rule"] == said_hello > 0
    assert report["rows"]["pinned_by_rules"] == said_hello
    knob_decided = 240 - said_hello
    assert report["knob"]["strong_share"]["value"] * 240 == pytest.approx(0.4 * knob_decided, abs=1.5)
    assert {g["group"] for g in report["breakdown"]["source"]} == {"tickets", "chat"}
    for name in ("router", "knn", "oracle", "random"):
        assert report["routers"][name]["apgr"]["value"] is not None
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert len(decisions) == 240 and {d["by"] for d in decisions} == {"knob", "rule"}
    for name in report["plots"].values():
        assert (out / name).read_bytes()[:8] == PNG_MAGIC


def test_pointsman_eval_names_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_jsonl(tmp_path / "labels.jsonl", labelled_rows(seed=1, n=30, models=("model-a", "model-b"))
                       + labelled_rows(seed=2, n=5, models=("model-c", "model-d")))
    config = eval_config(tmp_path / "config.yaml", threshold=0.5)
    base = ["eval", "--config", str(config), "--data", f"file:{data}", "--out", str(tmp_path / "o"),
            "--bootstrap", "20", "--no-progress"]
    assert pointsman([*base, "--route", "nope"]) == 2
    assert "routes: auto" in capsys.readouterr().err
    # Four models and none named like the route's: the user must say which pair to evaluate.
    assert pointsman(base) == 2
    err = capsys.readouterr().err
    assert "--strong" in err and "model-a" in err
    assert pointsman([*base, "--strong", "model-x", "--weak", "model-b"]) == 2
    assert "--strong model-x" in capsys.readouterr().err
    assert pointsman([*base, "--data", "file:/nonexistent.jsonl"]) == 2
    assert "nonexistent" in capsys.readouterr().err
    # An --out that cannot hold the report fails before the replay, not after it.
    (tmp_path / "a-file").write_text("x")
    assert pointsman([*base, "--out", str(tmp_path / "a-file")]) == 2
    assert "a-file: is a file; give a directory for the report" in capsys.readouterr().err
    assert pointsman([*base, "--strong", "model-a", "--weak", "model-b"]) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    # Rows labelled for another pair are left out, and the report says how many and why.
    assert report["rows"]["evaluated"] == 30
    assert report["rows"]["excluded"] == {"no quality for both model-a and model-b": 5}


def test_the_direct_table_reads_only_rows_with_both_qualities_and_the_estimator_block_says_so() -> None:
    from evals.labelled import LabelledRequest
    from evals.offpolicy import NO_PROPENSITY, offpolicy_estimator
    from evals.replay import Replay, ReplayDecision
    from evals.report import build_table, estimator_block

    rows, decisions = [], []
    for i in range(40):
        labelled = i < 20
        rows.append(LabelledRequest(messages=[{"role": "user", "content": f"q{i}"}],
                                    qualities={"big": 1.0, "small": 0.0} if labelled else {"small": 0.5},
                                    costs={}, source="logs:auto"))
        decisions.append(ReplayDecision(index=i, model="big" if i % 2 else "small", by="knob", score=(i % 2) * 0.9,
                                        reason=""))
    replay = Replay(route="auto", router_version="v", decisions=decisions, strong="big", weak="small", threshold=0.5)
    t, excluded, basis = build_table(rows, replay, "big", "small")
    # Rows with only the served model's outcome are not direct rows: the off-policy section reads them.
    assert len(t) == 20 and t.direct.all() and excluded == {"no quality for both big and small": 20}
    assert basis["kind"] == "share"  # no costs, no prices: cost is the strong-call share
    off = offpolicy_estimator(used=30, logged=45, excluded={NO_PROPENSITY: 15}, metric="quality")
    block = estimator_block(len(t), off)
    assert block["name"] == "direct+ips+snips+dr"
    assert block["direct"]["rows"] == 20 and "routers" in block["direct"]["numbers"]
    assert block["offpolicy"]["rows"] == 30 and block["offpolicy"]["rows_without_propensity"] == 15
    assert block["offpolicy"]["numbers"] == ["offpolicy"] and set(block["offpolicy"]["estimators"]) >= {
        "ips", "snips", "dr", "logging"}
    assert "15 logged requests had no propensity" in block["text"]
    # Labelled data only: the name stays "direct" and nothing is said about logs.
    assert estimator_block(20, None)["name"] == "direct" and "offpolicy" not in estimator_block(20, None)
    # Logs without a usable row: named, with why.
    none = estimator_block(0, offpolicy_estimator(used=0, logged=5, excluded={NO_PROPENSITY: 5}, metric="quality",
                                                  missing="5 not randomised"), direct_missing="no labelled request")
    assert none["name"] == "none" and "not computed: 5 not randomised" in none["text"]
    assert "not computed: no labelled request" in none["text"]


def test_the_pair_is_read_from_the_route_then_the_data() -> None:
    from evals.labelled import LabelledRequest
    from evals.report_cli import EvalError, resolve_pair
    from policies.config import CostQuality

    def rows(scores: dict[str, float]) -> list[LabelledRequest]:
        return [LabelledRequest(messages=[{"role": "user", "content": "q"}], qualities=dict(scores), costs={},
                                source="s")]

    named = CostQuality(strong="big-model", weak="small-model")
    assert resolve_pair(named, rows({"big-model": 1, "small-model": 0, "x": 1}), None, None) == (
        "big-model", "small-model")
    mapped = CostQuality(strong="big-model", weak="small-model",
                         difficulty_models={"big-model": "gpt-4", "small-model": "mixtral"})
    assert resolve_pair(mapped, rows({"gpt-4": 1, "mixtral": 0, "x": 1}), None, None) == ("gpt-4", "mixtral")
    # Two other models: the better one on average is the strong one.
    assert resolve_pair(named, rows({"m-a": 0.2, "m-b": 0.9}), None, None) == ("m-b", "m-a")
    assert resolve_pair(named, rows({"m-a": 0.2, "m-b": 0.9}), "m-a", None) == ("m-a", "m-b")
    with pytest.raises(EvalError, match="same model"):
        resolve_pair(named, rows({"m-a": 0.2, "m-b": 0.9}), "m-a", "m-a")


def test_a_registry_version_directory_reports_its_version_id(tmp_path: Path) -> None:
    import shutil

    from classifiers.registry import SHIPPED_ROUTERS_DIR

    version = tmp_path / "registry" / "versions" / "v0007-0123abcd"
    shutil.copytree(SHIPPED_ROUTERS_DIR, version)
    plain = tmp_path / "plain-heads"
    shutil.copytree(SHIPPED_ROUTERS_DIR, plain)
    (version / "version.json").write_text(json.dumps({"version": "v0007-0123abcd", "parent": None}))
    data = write_jsonl(tmp_path / "labels.jsonl", labelled_rows(seed=3, n=30))
    config = eval_config(tmp_path / "config.yaml", threshold=0.5)
    versions = {}
    for name, routers in (("version", version), ("plain", plain)):
        out = tmp_path / name
        assert pointsman(["eval", "--config", str(config), "--data", f"file:{data}", "--routers-dir", str(routers),
                          "--out", str(out), "--bootstrap", "20", "--no-progress"]) == 0
        versions[name] = json.loads((out / "report.json").read_text())["router_version"]
        assert versions[name] in (out / "report.md").read_text()
    # The registry's id (version.json), not a hash of the directory; a plain directory keeps its dir-<hash>.
    assert versions["version"] == "v0007-0123abcd"
    assert versions["plain"].startswith("dir-")


def test_requests_the_router_was_trained_on_are_left_out_of_its_evaluation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Graded on its own training rows a router looks better than it is: pointsman eval leaves them out,
    counts them, and refuses data that holds nothing else."""
    train = write_jsonl(tmp_path / "train.jsonl", labelled_rows(seed=1, n=120))
    fresh = labelled_rows(seed=5, n=120)
    held = write_jsonl(tmp_path / "held.jsonl", fresh)
    registry = tmp_path / "routers"
    assert pointsman(["train", "--data", f"file:{train}", "--encoders", "static", "--out", str(registry),
                      "--no-progress", "--folds", "3"]) == 0
    version = json.loads((registry / "active.json").read_text())["version"]
    config = eval_config(tmp_path / "config.yaml", threshold=0.5)
    capsys.readouterr()

    code = pointsman(["eval", "--config", str(config), "--route", "auto", "--data", f"file:{train}",
                      "--routers-dir", str(registry), "--out", str(tmp_path / "own"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"router {version} was trained on every one of these 120 requests" in err
    assert not (tmp_path / "own" / "report.json").exists()

    out = tmp_path / "mixed"
    code = pointsman(["eval", "--config", str(config), "--route", "auto", "--data", f"file:{train}",
                      "--data", f"file:{held}", "--routers-dir", str(registry), "--out", str(out),
                      "--bootstrap", "50", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # Left out: the training file, and the held-out prompts that repeat one of its prompts (short chat asks do).
    seen = {item["prompt"] for item in labelled_rows(seed=1, n=120)}
    repeats = sum(item["prompt"] in seen for item in fresh)
    report = json.loads((out / "report.json").read_text())
    assert report["rows"]["excluded"] == {f"training data of router {version}": 120 + repeats}
    assert report["rows"]["evaluated"] == 120 - repeats > 60
    assert f"direct, on {120 - repeats} labelled requests ({120 + repeats} more left out" in printed
    assert f"{120 + repeats} training data of router {version}" in (out / "report.md").read_text()


# ----------------------------------------------------------------------------- review fixes


def test_the_oracle_never_scores_below_the_route_where_the_strong_model_always_wins() -> None:
    # 206 requests (not a multiple of 10), the strong model better on every one by the same margin: every
    # ranking is as good as any other, so route and oracle both score APGR 0.5 and CPT(50) 50%.
    t = table(n=206)
    t.strong_q[:], t.weak_q[:] = 1.0, 0.0
    report = _report(t)
    route, oracle = report["routers"]["router"], report["routers"]["oracle"]
    assert route["apgr"]["value"] == pytest.approx(0.5) == oracle["apgr"]["value"]
    assert oracle["cpt50"]["value"] == pytest.approx(0.5) == route["cpt50"]["value"]
    # The oracle's points are on the route's share grid.
    assert [p["share"] for p in oracle["curve"]] == pytest.approx([p["share"] for p in route["curve"]])
    for seed in range(5):  # and on random data, in the report as in the metric
        random_table = table(n=150 + 38 * seed, seed=seed, informative=seed / 2)
        numbers = _report(random_table)["routers"]
        assert numbers["oracle"]["apgr"]["value"] >= numbers["router"]["apgr"]["value"]
        assert numbers["oracle"]["apgr"]["value"] >= numbers["knn"]["apgr"]["value"]


def test_a_tied_pair_gives_a_report_without_numpy_warnings(tmp_path: Path) -> None:
    t = table(n=200)
    t.strong_q[:] = t.weak_q  # the models tie on every request: APGR undefined everywhere
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Mean of empty slice" from the random baseline's APGR was one
        report = _report(t)
    assert report["routers"]["random"]["apgr"]["value"] != report["routers"]["random"]["apgr"]["value"]  # NaN
    write_report(report, tmp_path / "tie", [])
    markdown = (tmp_path / "tie" / "report.md").read_text()
    assert "n/a [" not in markdown  # no interval printed beside a missing value


def test_no_interval_is_printed_beside_a_missing_value() -> None:
    from evals.report_plots import _ci
    from evals.report_render import _est

    assert _est({"value": None, "ci": [-2.112, 2.528]}) == "n/a"
    assert _est({"value": 0.5, "ci": [0.4, 0.6]}) == "0.500 [0.400, 0.600]"
    assert _ci({"value": None, "ci": [-2.112, 2.528]}) == "n/a"
    assert _ci({"value": 0.5, "ci": [0.4, None]}) == "0.50"


def test_every_file_the_report_writes_is_checked_before_the_eval_starts(tmp_path: Path) -> None:
    from evals.report import report_dir
    from evals.report_plots import PLOT_NAMES
    from evals.report_render import REPORT_FILES

    t = table(n=120)
    paths = write_report(_report(t), tmp_path / "all", [])
    assert {p.name for p in paths.values()} <= set(REPORT_FILES)
    assert {f"{name}.png" for name in PLOT_NAMES} <= set(REPORT_FILES)
    report_dir(tmp_path / "all", REPORT_FILES)  # files from an earlier run are overwritten: fine
    (tmp_path / "all" / "report.md").unlink()
    (tmp_path / "all" / "report.md").mkdir()
    with pytest.raises(ValueError, match=r"report\.md exists and is not a regular file"):
        report_dir(tmp_path / "all", REPORT_FILES)


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the eval started although its options were wrong")


def test_bad_eval_options_are_usage_errors_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import evals.report_cli

    data = write_jsonl(tmp_path / "labels.jsonl", labelled_rows(seed=1, n=30))
    config = eval_config(tmp_path / "config.yaml", threshold=0.5)
    base = ["eval", "--config", str(config), "--data", f"file:{data}", "--out", str(tmp_path / "o"), "--no-progress"]
    monkeypatch.setattr(evals.report_cli, "run", _must_not_run)
    for args, option in ((["--seed", "-1"], "--seed"), (["--knn-k", "0"], "--knn-k"), (["--knn-k", "-3"], "--knn-k"),
                         (["--seed", "x"], "--seed")):
        with pytest.raises(SystemExit) as exit_info:
            pointsman([*base, *args])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and f"argument {option}:" in err and "Traceback" not in err, args
    (tmp_path / "empty").mkdir()
    (tmp_path / "o-md" / "report.md").mkdir(parents=True)
    (tmp_path / "o-png" / "pgr_curve.png").mkdir(parents=True)
    for args, message in (
        (["--routers-dir", str(tmp_path / "missing")], f"--routers-dir {tmp_path / 'missing'}: no such directory"),
        (["--routers-dir", str(data)], f"--routers-dir {data}: is a file"),
        (["--routers-dir", str(tmp_path / "empty")], "holds no router"),
        (["--out", str(tmp_path / "o-md")], f"{tmp_path / 'o-md' / 'report.md'} exists and is not a regular file"),
        (["--out", str(tmp_path / "o-png")],
         f"{tmp_path / 'o-png' / 'pgr_curve.png'} exists and is not a regular file"),
    ):
        assert pointsman([*base, *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (args, err)


def test_labelled_data_with_one_model_is_named_as_such_not_sent_to_strong_and_weak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file scoring only the strong model: eval asked which models are strong and weak and told the user
    # to pass --strong/--weak, which cannot help: there is no second model to compare.
    one = [{"prompt": r["prompt"], "scores": {"big-model": r["scores"]["big-model"]}}
           for r in labelled_rows(seed=5, n=30)]
    data = write_jsonl(tmp_path / "one.jsonl", one)
    config = eval_config(tmp_path / "config.yaml", threshold=0.5)
    code = pointsman(["eval", "--config", str(config), "--route", "auto", "--data", f"file:{data}",
                      "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the labelled data has qualities for big-model only" in err and "small-model" in err
    assert "pass --strong" not in err and "Traceback" not in err
