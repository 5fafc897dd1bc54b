"""The A/B report end to end: an experiment written through the store API (decisions, feedback, shadow
decisions, an arm stop), read by ``pointsman ab report``, rendered as Markdown, HTML, JSON and PNGs.

PostgreSQL is required for the test marked ``postgres`` (as for the store tests): a server that cannot
be reached fails the test; it never skips.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evals.ab import Options, analyze, experiment_data
from evals.ab.render import write_ab_report
from gateway.cli import main as pointsman
from store import (
    DecisionRecord,
    DecisionStore,
    FeedbackRecord,
    LoggedRequest,
    PostgresDecisionStore,
    SQLiteDecisionStore,
)
from tests.store.conftest import pg_schema

ASYNC = pytest.mark.asyncio(loop_scope="session")

NAME = "knob-vs-utility"
START = 1_760_000_000.0
SPEC: dict[str, Any] = {
    "arms": [
        {"name": "control", "weight": 0.5, "control": True, "shadow": False, "kind": "knob"},
        {"name": "utility", "weight": 0.5, "control": False, "shadow": False, "kind": "utility"},
        {"name": "always-big", "weight": 0.0, "control": False, "shadow": True, "kind": "static"},
    ],
    "key": "tenant", "start": None, "end": None, "paused": False,
}
PRICE = {"big": 0.01, "small": 0.001}


@dataclass
class World:
    """An experiment's rows and what the report must find in them."""

    records: list[DecisionRecord] = field(default_factory=list)
    feedback: list[FeedbackRecord] = field(default_factory=list)
    served: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    user_scores: dict[str, list[float]] = field(default_factory=dict)
    costs: dict[str, list[float]] = field(default_factory=dict)
    compared_ids: set[str] = field(default_factory=set)
    shadows: int = 0


def world(n: int = 600, seed: int = 0) -> World:
    """``n`` served requests alternating control / utility (utility answers better and with the big model
    more often), user and judge feedback, implicit re-asks, errors, client disconnects, compared requests,
    and a shadow decision for every third request."""
    rng = np.random.default_rng(seed)
    w = World()
    for i in range(n):
        arm = "control" if i % 2 == 0 else "utility"
        rid = f"req-{i}"
        model = "big" if rng.uniform() < (0.3 if arm == "control" else 0.6) else "small"
        status, outcome = 200, "ok"
        if i % 97 == 5:
            status, outcome = 502, "error"
        disconnected = i % 101 == 7
        if disconnected:
            outcome = "client_disconnected"
        compared = i % 50 == 9
        cost = PRICE[model] * (3 if compared else 1)  # a compared request also paid for the other model and judge
        w.records.append(DecisionRecord(
            request_id=rid, created_at=START + i, endpoint="chat.completions", route="auto", requested_model="auto",
            model=model, backend="fake", status=status, outcome=outcome, latency_ms=100.0 + i % 50, cost_usd=cost,
            prompt_tokens=100, completion_tokens=50, experiment=NAME, experiment_arm=arm, arm_propensity=0.5,
            compared=compared,
        ))
        if disconnected:
            continue
        w.served[arm] = w.served.get(arm, 0) + 1
        w.errors[arm] = w.errors.get(arm, 0) + (status >= 500)
        if compared:
            w.compared_ids.add(rid)
            w.feedback += [FeedbackRecord(rid, 0.9, source="judge", model="big"),
                           FeedbackRecord(rid, 0.2, source="judge", model="small"),
                           FeedbackRecord(rid, 0.0, source="user")]  # must not count by default
        else:
            w.costs.setdefault(arm, []).append(cost)
            score = float(np.clip(rng.normal(0.75 if arm == "utility" else 0.45, 0.2), 0, 1))
            w.user_scores.setdefault(arm, []).append(score)
            w.feedback.append(FeedbackRecord(rid, score, source="user", created_at=START + i + 1))
            w.feedback.append(FeedbackRecord(rid, score, source="judge"))
        if i % 13 == 0:
            w.feedback.append(FeedbackRecord(rid, 0.0, metric="reask", source="implicit"))
        if i % 3 == 0:
            w.shadows += 1
            w.records.append(DecisionRecord(
                request_id=f"{rid}:shadow:always-big", created_at=START + i, endpoint="chat.completions",
                route="auto", requested_model="auto", model="big", experiment=NAME, experiment_arm="always-big",
                shadow_of=rid, status=0, outcome="ok",
            ))
    return w


async def fill(store: DecisionStore, w: World, *, stop: bool = True) -> None:
    """Write the world through the store API: decisions, feedback, the registered spec, an arm stop."""
    await store.open()
    try:
        await store.write_batch(w.records)
        await store.write_feedback(w.feedback)
        await store.register_experiment(NAME, "auto", {**SPEC, "strong": "big", "weak": "small"})
        await store.register_experiment("other-experiment", "auto", SPEC)
        if stop:
            await store.stop_arm(NAME, "utility", "cost", {"ratio": 4.2, "bound": 1.5}, "replica-a", START + 10_000)
    finally:
        await store.close()


def logged(w: World) -> list[LoggedRequest]:
    """The world as the store returns it (without going through one)."""
    by_id: dict[str, list[FeedbackRecord]] = {}
    for fb in w.feedback:
        by_id.setdefault(fb.request_id, []).append(fb)
    return [LoggedRequest(r, None, by_id.get(r.request_id, [])) for r in w.records]


# ----------------------------------------------------------------------------- the data model


def test_served_rows_exclude_shadows_and_disconnects_and_compared_quality_and_cost() -> None:
    w = world()
    data = experiment_data(NAME, "auto", {**SPEC, "strong": "big"}, logged(w))
    report = analyze(data)
    assert report["rows"]["served"] == sum(w.served.values())
    assert report["rows"]["excluded"] == {"client disconnected": 6}
    assert report["rows"]["shadow"] == w.shadows == 198
    assert report["control"] == "control" and report["arms_order"] == ["control", "utility"]
    for arm in ("control", "utility"):
        stats = report["arms"][arm]
        assert stats["requests"] == w.served[arm]
        assert stats["error_rate"]["count"] == w.errors[arm]
        explicit = stats["quality"]["explicit"]
        assert explicit["n"] == len(w.user_scores[arm])  # the compared requests' 0.0 user scores left out
        assert explicit["mean"] == pytest.approx(np.mean(w.user_scores[arm]))
        assert stats["cost_per_request"]["mean"] == pytest.approx(np.mean(w.costs[arm]))
        assert stats["compared"] == sum(1 for rid in w.compared_ids if (int(rid[4:]) % 2 == 1) == (arm == "utility"))
    # Explicit feedback exists, so it decides; the shadow arm is never a served arm.
    assert report["primary_source"] == "explicit"
    assert "always-big" not in report["arms"]
    shadow = report["shadow"]["always-big"]
    assert shadow["decisions"] == w.shadows and shadow["strong_share"] == 1.0
    assert shadow["agreement"] == pytest.approx(shadow["served_strong_share"])  # it always picks big
    # Implicit: a re-ask makes that request's implicit score 0.
    assert report["arms"]["control"]["quality"]["implicit"]["mean"] < 1.0

    with_compared = analyze(experiment_data(NAME, "auto", SPEC, logged(w), include_compared=True))
    n_user = sum(len(v) for v in w.user_scores.values())
    assert sum(with_compared["arms"][a]["quality"]["explicit"]["n"] for a in ("control", "utility")) == (
        n_user + len(w.compared_ids))


def test_strong_model_defaults_to_the_priciest_model_seen() -> None:
    data = experiment_data(NAME, "auto", SPEC, logged(world(n=100)))
    assert (data.strong_model, data.strong_basis) == ("big", "priciest model seen")
    share = analyze(data)["arms"]["utility"]["strong_share"]
    assert 0.4 < share["value"] < 0.8 and share["ci"][0] < share["value"] < share["ci"][1]


# ----------------------------------------------------------------------------- rendering


def test_report_files_hold_the_numbers_and_valid_pngs(tmp_path: Path) -> None:
    report = analyze(experiment_data(NAME, "auto", {**SPEC, "strong": "big"}, logged(world())), Options())
    paths = write_ab_report(report, tmp_path)
    assert set(paths) == {"md", "html", "json", "quality_over_time", "difference_over_time", "requests_over_time"}
    for name in ("quality_over_time", "difference_over_time", "requests_over_time"):
        png = paths[name].read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000

    data = json.loads(paths["json"].read_text())
    verdict = data["verdicts"]["utility"]
    assert verdict["kind"] == "better" and verdict["winner"] == "utility"
    diff = data["differences"]["utility"]["quality"]["explicit"]
    assert 0.2 < diff["estimate"] < 0.4 and diff["ci"][0] > 0 and diff["significant"]
    assert data["timeline"]["differences"]["utility"]["estimate"][-1] == pytest.approx(diff["estimate"])
    assert data["srm"]["mismatch"] is False
    assert data["plots"]["quality_over_time"] == "quality_over_time.png"

    md = paths["md"].read_text()
    html = paths["html"].read_text()
    cost = data["arms"]["control"]["cost_per_request"]["mean"]
    for text in (md, html):
        assert "utility better than control on quality (explicit) by" in text
        assert f"{diff['estimate']:+.3f}" in text  # the difference and its interval
        assert f"{data['arms']['utility']['quality']['explicit']['mean']:.3f}" in text
        assert f"${cost:.4g}" in text
        assert "Shadow decisions" in text and "always-big" in text
        assert "Waudby-Smith" in text
    assert "![Quality per arm over time (always-valid bands)](quality_over_time.png)" in md
    assert html.count('src="data:image/png;base64,') == 3  # self-contained
    assert "costs $" in verdict["text"] and "more per request" in verdict["text"]


def test_json_only_writes_no_plots(tmp_path: Path) -> None:
    report = analyze(experiment_data(NAME, "auto", SPEC, logged(world(n=40))))
    paths = write_ab_report(report, tmp_path, {"json"})
    assert set(paths) == {"json"} and not list(tmp_path.glob("*.png"))
    data = json.loads(paths["json"].read_text())
    assert all(v is None or math.isfinite(v) for v in data["timeline"]["differences"]["utility"]["upper"])


# ----------------------------------------------------------------------------- the command


@ASYNC
async def test_cli_reports_an_experiment_from_a_sqlite_store(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "store.db"
    w = world()
    await fill(SQLiteDecisionStore(str(db)), w)
    out = tmp_path / "report"
    code = await asyncio.to_thread(pointsman, [
        "ab", "report", NAME, "--store", f"sqlite:///{db}", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "utility better than control on quality (explicit) by" in printed
    assert "(utility was stopped at" in printed and ": cost)" in printed
    data = json.loads((out / "ab-report.json").read_text())
    assert data["strong_model"] == {"name": "big", "basis": "spec"}
    assert data["arms"]["utility"]["stopped"]["reason"] == "cost"
    assert data["arms"]["utility"]["stopped"]["detail"] == {"ratio": 4.2, "bound": 1.5}
    assert data["arms"]["control"]["requests"] == w.served["control"]
    assert data["shadow"]["always-big"]["decisions"] == w.shadows
    assert {p.name for p in out.iterdir()} == {"ab-report.json", "ab-report.md", "ab-report.html",
                                               "quality_over_time.png", "difference_over_time.png",
                                               "requests_over_time.png"}

    # --since keeps the later requests only; --format json writes only the JSON.
    later = tmp_path / "later"
    since_iso = dt.datetime.fromtimestamp(START + 300, tz=dt.UTC).isoformat()
    code = await asyncio.to_thread(pointsman, [
        "ab", "report", NAME, "--store", str(db), "--out", str(later), "--format", "json", "--no-progress",
        "--since", since_iso])
    assert code == 0
    since = json.loads((later / "ab-report.json").read_text())
    assert since["rows"]["served"] == sum(
        1 for r in w.records if r.created_at >= START + 300 and not r.shadow_of and r.outcome != "client_disconnected")
    assert [p.name for p in later.iterdir()] == ["ab-report.json"]


@ASYNC
async def test_cli_usage_errors_exit_2_naming_known_experiments(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "store.db"
    await fill(SQLiteDecisionStore(str(db)), world(n=20), stop=False)
    code = await asyncio.to_thread(pointsman, ["ab", "report", "nope", "--store", str(db), "--out", str(tmp_path)])
    assert code == 2
    assert "unknown experiment 'nope' (known experiments: knob-vs-utility, other-experiment)" in capsys.readouterr().err
    missing = tmp_path / "missing.db"
    assert await asyncio.to_thread(pointsman, ["ab", "report", NAME, "--store", str(missing)]) == 2
    assert "no SQLite database" in capsys.readouterr().err and not missing.exists()
    for bad in (["--format", "pdf"], ["--alpha", "1.5"], ["--since", "yesterday"]):
        assert await asyncio.to_thread(pointsman, ["ab", "report", NAME, "--store", str(db), *bad]) == 2
        assert "pointsman ab:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        pointsman(["ab", "report", NAME])  # --store is required
    assert exc.value.code == 2


@pytest.mark.postgres
@ASYNC
async def test_cli_reads_postgres_like_sqlite(tmp_path: Path) -> None:
    w = world(n=300, seed=4)
    db = tmp_path / "store.db"
    await fill(SQLiteDecisionStore(str(db)), w)
    reports = []
    async with pg_schema() as dsn:
        await fill(PostgresDecisionStore(dsn), w)
        for url, out in ((f"sqlite:///{db}", tmp_path / "sqlite"), (dsn, tmp_path / "pg")):
            code = await asyncio.to_thread(pointsman, [
                "ab", "report", NAME, "--store", url, "--out", str(out), "--format", "json", "--no-progress"])
            assert code == 0
            reports.append(json.loads((out / "ab-report.json").read_text()))
    for report in reports:
        report.pop("created_at")
    assert reports[0] == reports[1]
    assert reports[0]["arms"]["utility"]["stopped"]["reason"] == "cost"


def test_several_treatments_share_alpha_and_adaptive_allocation_skips_srm() -> None:
    rng = np.random.default_rng(6)
    arms = rng.choice(["a", "b", "base"], size=3000, p=[0.6, 0.3, 0.1])  # far from the weights: adaptive
    records = [DecisionRecord(f"r{i}", START + i, "chat.completions", "auto", "auto", model="m", experiment=NAME,
                              experiment_arm=str(arm), arm_propensity=0.2 + (i % 7) / 10, status=200)
               for i, arm in enumerate(arms)]
    feedback = {f"r{i}": [FeedbackRecord(f"r{i}", float(rng.uniform()), source="user")] for i in range(3000)}
    spec = {"control": "base", "allocation": {"kind": "thompson"},
            "arms": [{"name": n, "weight": 1 / 3} for n in ("a", "b", "base")]}
    report = analyze(experiment_data(NAME, "auto", spec, [LoggedRequest(r, None, feedback[r.request_id])
                                                          for r in records]))
    assert report["control"] == "base" and report["arms_order"] == ["base", "a", "b"]
    assert report["method"]["alpha_per_comparison"] == pytest.approx(0.025)
    assert report["differences"]["a"]["quality"]["explicit"]["alpha"] == pytest.approx(0.025)
    assert report["srm"] is None and report["srm_note"].startswith("skipped: adaptive allocation (thompson")
    assert any("adaptively" in c for c in report["caveats"])
    assert set(report["verdicts"]) == {"a", "b"}


def test_cache_hits_are_left_out_of_quality_and_cost_like_compared_requests() -> None:
    w = world()
    plain = analyze(experiment_data(NAME, "auto", SPEC, logged(w)))
    items = logged(w)
    hit_ids = set()
    for item in items:
        r = item.record
        if r.shadow_of is None and r.experiment_arm == "control" and not r.compared and len(hit_ids) < 20:
            r.decision = {**r.decision, "cache": {"hit": True, "result": "hit"}}
            r.cost_usd = 0.0
            hit_ids.add(r.request_id)
    cached = analyze(experiment_data(NAME, "auto", SPEC, items))
    assert cached["arms"]["control"]["requests"] == plain["arms"]["control"]["requests"]  # still served
    scored = sum(1 for i in items if i.record.request_id in hit_ids and any(f.source == "user" for f in i.feedback))
    assert cached["arms"]["control"]["quality"]["explicit"]["n"] == plain["arms"]["control"]["quality"]["explicit"][
        "n"] - scored
    assert cached["arms"]["control"]["cost_per_request"]["mean"] == pytest.approx(
        plain["arms"]["control"]["cost_per_request"]["mean"], rel=0.2)  # the zero-cost hits do not drag it down
    assert cached["arms"]["control"]["cost_per_request"]["n"] == plain["arms"]["control"]["cost_per_request"][
        "n"] - len(hit_ids)
