"""Off-policy evaluation on logged traffic: the served answer's outcome from feedback, the IPS / SNIPS /
DR estimators on known answers, and ``pointsman eval`` on a real SQLite decision log written through
the store API by a known epsilon-greedy logging policy with known outcome probabilities.

The logged world: math prompts and chat prompts; the logging policy's greedy choice is the strong
model for math and the weak one for chat, explored with epsilon 0.5 by the gateway's own
``policies.explore.explore_pair`` (so the logged propensities are 0.75 / 0.25, exactly what a gateway
would log). Each answer is good with probability :data:`P_GOOD` [is_math, model]. The replayed route
decides every request with the real brain; its true mean quality on the logged requests is then known
analytically (the mean of :data:`P_GOOD` at its decisions) and must lie inside the estimates' 95% CIs.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from evals.holdout import HOLDOUT_SEED, split_sources
from evals.labelled import load_source
from evals.offpolicy import (
    NO_PROPENSITY,
    LoggedTable,
    compute_offpolicy,
    estimates,
    ips_exclusion,
    outcome_model,
    outcomes_from_logs,
    served_outcome,
)
from gateway.cli import main as pointsman
from policies.explore import explore_pair
from store import ConversationRecord, DecisionRecord, FeedbackRecord, LoggedRequest, SQLiteDecisionStore
from store.base import DecisionStore
from tests.evals.labelled_files import STRONG, WEAK, prompts

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EPSILON = 0.5
P_GOOD = {(True, STRONG): 0.9, (True, WEAK): 0.3, (False, STRONG): 0.85, (False, WEAK): 0.7}
COST = {STRONG: 0.01, WEAK: 0.0005}
N_LOGGED = 1200
# Requests the estimators must leave out, and how many of each.
N_NOT_RANDOMISED, N_NO_FEEDBACK, N_EMBEDDING_ONLY, N_OTHER_MODEL = 60, 20, 10, 5


# ----------------------------------------------------------------------------- the served answer's outcome


def fb(score: float, **kw: Any) -> FeedbackRecord:
    return FeedbackRecord("r", score, **kw)


def test_the_served_outcome_is_explicit_feedback_else_implicit_and_never_the_judge() -> None:
    # Explicit sources are averaged (one row per source); feedback about another model is ignored.
    assert served_outcome("big", [fb(1.0), fb(0.0, source="import"), fb(0.0, source="user", model="small")]) == (
        0.5, "explicit")
    assert served_outcome("big", [fb(0.8, model="big"), fb(0.0, source="implicit", metric="reask")]) == (
        0.8, "explicit")  # explicit wins over the gateway's own signals
    # Only implicit signals (any of them, under their own metric names): the answer did not do.
    assert served_outcome("big", [fb(0.0, source="implicit", metric="finish_length")]) == (0.0, "implicit")
    # Judge comparisons are relative scores of both models: the direct estimator's, not an outcome here.
    assert served_outcome("big", [fb(1.0, source="judge", model="big"), fb(0.0, source="judge", model="small")]) is None
    # Another metric reads only its own feedback (and implicit rows under it).
    assert served_outcome("big", [fb(1.0)], metric="helpfulness") is None
    assert served_outcome("big", [fb(0.3, metric="helpfulness"), fb(1.0)], metric="helpfulness") == (0.3, "explicit")
    assert served_outcome("big", [fb(0.0, source="implicit", metric="reask")], metric="helpfulness") is None


def _logged(model: str | None, propensity: float | None, feedback: list[FeedbackRecord], *,
            text: str | None = '[{"role": "user", "content": "hi"}]', embedding: bool = True) -> LoggedRequest:
    record = DecisionRecord("r", 1.0, "chat.completions", "auto", "auto", model=model, propensity=propensity,
                            cost_usd=0.01, signals={"domain": {"value": "chat"}})
    conversation = ConversationRecord("r", 1.0, encoder_id="static:x",
                                      embedding=b"\x00\x00\x80?" * 4 if embedding else None, text=text)
    return LoggedRequest(record=record, conversation=conversation, feedback=feedback)


def test_outcomes_from_logs_yields_served_model_propensity_and_counts_what_it_skips() -> None:
    rows, skipped = outcomes_from_logs([
        _logged("big", 0.25, [fb(1.0)]),
        _logged("small", None, [fb(0.0, source="implicit", metric="reask")]),
        _logged("big", 0.75, [fb(1.0, source="judge", model="big")]),  # a comparison only
        _logged(None, None, [fb(1.0)]),  # blocked: nothing served
        _logged("big", 0.75, [fb(1.0)], text=None, embedding=False),
        _logged("big", 0.75, [fb(0.6)], text=None),  # embedding only: kept, for features
    ])
    assert [(r.served_model, r.propensity, r.quality, r.outcome_from) for r in rows] == [
        ("big", 0.25, 1.0, "explicit"), ("small", None, 0.0, "implicit"), ("big", 0.75, 0.6, "explicit")]
    assert rows[0].messages == [{"role": "user", "content": "hi"}] and rows[0].domain == "chat"
    assert rows[0].cost_usd == 0.01 and rows[2].messages == [] and rows[2].embedding is not None
    assert skipped == {"no quality feedback on the served answer": 1, "no served model": 1,
                       "neither text nor embedding stored": 1}
    assert ips_exclusion(rows[0], "big", "small") is None
    assert ips_exclusion(rows[1], "big", "small") == NO_PROPENSITY
    assert ips_exclusion(rows[0], "huge", "small") == "served a model outside the pair"
    assert ips_exclusion(rows[2], "big", "small") == "no conversation text (only its embedding was stored)"


# ----------------------------------------------------------------------------- estimators on known answers


def synthetic(n: int, rng: np.random.Generator) -> tuple[LoggedTable, dict[str, float]]:
    """Logs of an epsilon-greedy policy over a context x ~ U(0, 1) and the true values of the policies.

    The strong model is good with probability 0.9, the weak one with 1 - x; logging is greedy on
    x > 0.3 -> strong with epsilon 0.4; the target goes strong on x > 0.6 (its score is x).
    """
    x = rng.random(n)
    greedy_strong = x > 0.3
    explored = rng.random(n) < 0.4
    served = np.where(explored, rng.random(n) < 0.5, greedy_strong)
    propensity = np.where(served == greedy_strong, 0.8, 0.2)
    p_good = np.where(served, 0.9, 1 - x)
    target = x > 0.6
    table = LoggedTable(served_strong=served, propensity=propensity, reward=(rng.random(n) < p_good).astype(float),
                        cost=served.astype(float), target_strong=target, scores=x)
    # E over x of 0.9 on x > 0.6 plus (1 - x) on x < 0.6: 0.36 + 0.6 - 0.18.
    truth = {"router": 0.36 + 0.6 - 0.18, "always_strong": 0.9, "always_weak": 0.5, "share": 0.4}
    return table, truth


def test_ips_snips_and_dr_are_unbiased_for_a_known_policy() -> None:
    t, truth = synthetic(200_000, np.random.default_rng(0))
    q_strong, q_weak = outcome_model(t)
    out = estimates(t, q_strong, q_weak)
    for policy in ("router", "always_strong", "always_weak"):
        for est in ("ips", "snips", "dr"):
            assert out[f"{policy}.{est}"] == pytest.approx(truth[policy], abs=0.01), (policy, est)
    assert out["router.share.replayed"] == pytest.approx(truth["share"], abs=0.01)
    assert out["router.share.snips"] == pytest.approx(truth["share"], abs=0.01)
    assert out["router.cost.snips"] == pytest.approx(truth["share"], abs=0.01)  # cost basis: the share
    assert out["router.weight_mean"] == pytest.approx(1.0, abs=0.01)  # the propensities are right
    assert out["router.pgr.snips"] == pytest.approx((0.78 - 0.5) / (0.9 - 0.5), abs=0.03)
    # The DR outcome model (linear in the score) fits the weak model's 1 - x: less variance than IPS.
    w = (t.served_strong == t.target_strong) / t.propensity
    ips_terms = w * t.reward
    dr_terms = np.where(t.target_strong, q_strong, q_weak) + w * (t.reward - np.where(t.served_strong, q_strong,
                                                                                     q_weak))
    assert dr_terms.var() < 0.7 * ips_terms.var()
    assert 0.3 * len(t) < out["router.ess"] < len(t)


def test_bootstrap_intervals_cover_the_truth_at_about_their_level() -> None:
    rng = np.random.default_rng(1)
    covered = {est: 0 for est in ("ips", "snips", "dr")}
    runs = 100
    for _ in range(runs):
        t, truth = synthetic(400, rng)
        section = compute_offpolicy(t, draws=200, seed=int(rng.integers(1 << 30)))
        for est in covered:
            lo, hi = section["policies"]["router"]["quality"][est]["ci"]
            covered[est] += lo <= truth["router"] <= hi
    for est, hits in covered.items():
        assert 0.86 <= hits / runs <= 1.0, (est, hits)


# ----------------------------------------------------------------------------- a real decision log


@dataclass
class Logged:
    """One logged request of the synthetic world, with what the test knows about it."""

    request_id: str
    prompt: str
    is_math: bool
    served: str
    propensity: float | None


def world(n: int = N_LOGGED, seed: int = 11, *, judged: int = 0) -> tuple[list[DecisionRecord],
                                                                            list[FeedbackRecord], list[Logged]]:
    """Decision records, feedback and the truth of the logged world (see the module docstring).

    ``judged``: that many of the explored requests also get a judge comparison of both models
    (labelled rows for the direct section), drawn from the same outcome probabilities.
    """
    rng = random.Random(seed)
    kinds = ["logged"] * n + ["not-randomised"] * N_NOT_RANDOMISED + ["no-feedback"] * N_NO_FEEDBACK + [
        "embedding-only"] * N_EMBEDDING_ONLY + ["other-model"] * N_OTHER_MODEL
    records, feedback, truth = [], [], []
    for i, ((text, is_math), kind) in enumerate(zip(prompts(seed, len(kinds)), kinds, strict=True)):
        rid = f"req_{seed}_{i:05d}"
        greedy, other = (STRONG, WEAK) if is_math else (WEAK, STRONG)
        draw = explore_pair(rid, EPSILON, greedy, other)
        served, propensity = draw.served, draw.probability(draw.served)
        if kind == "not-randomised":
            served, propensity = greedy, None
        elif kind == "other-model":
            served = "third-model"
        messages = [{"role": "user", "content": text}]
        records.append(DecisionRecord(
            request_id=rid, created_at=1_700_000_000.0 + i, endpoint="chat.completions", route="auto",
            requested_model="auto", model=served, propensity=propensity, cost_usd=COST.get(served, 0.002),
            status=200, conversation=ConversationRecord(
                request_id=rid, created_at=1_700_000_000.0 + i, encoder_id="static:test",
                embedding=np.ones(4, dtype="<f4").tobytes(),
                text=None if kind == "embedding-only" else json.dumps(messages)),
        ))
        good = rng.random() < P_GOOD.get((is_math, served), 0.5)
        if kind != "no-feedback":
            if not good and rng.random() < 0.5:  # a failure only the gateway noticed (a re-ask)
                feedback.append(FeedbackRecord(rid, 0.0, metric="reask", source="implicit"))
            else:
                feedback.append(FeedbackRecord(rid, float(good)))
        if kind == "logged" and i < judged:
            for model in (STRONG, WEAK):
                feedback.append(FeedbackRecord(rid, float(rng.random() < P_GOOD[(is_math, model)]),
                                               source="judge", model=model))
        truth.append(Logged(rid, text, is_math, served, propensity))
    return records, feedback, truth


async def fill(store: DecisionStore, records: list[DecisionRecord], feedback: list[FeedbackRecord]) -> None:
    """Write the world through the store API, in the store's own batches."""
    await store.open()
    try:
        for start in range(0, len(records), 500):
            await store.write_batch(records[start:start + 500])
        await store.write_feedback(feedback)
    finally:
        await store.close()


def eval_config(path: Path) -> Path:
    """A rules route with a greeting rule (pins the weak model) and a knob sending half of the rest strong."""
    path.write_text(yaml.safe_dump({
        "backends": [{"name": "fake", "base_url": "http://127.0.0.1:9/v1", "models": [
            {"name": STRONG, "input_cost_per_mtok": 10, "output_cost_per_mtok": 30},
            {"name": WEAK, "input_cost_per_mtok": 0.5, "output_cost_per_mtok": 1.5},
        ]}],
        "classifiers": {"encoder": "static"},
        "routes": [{
            "name": "auto", "policy": "rules",
            "signals": {"keywords": {"greet": {"keywords": ["say hello"]}}},
            "rules": [{"name": "hello-small", "when": {"signal": "greet", "op": "truthy"},
                       "action": {"route": WEAK}}],
            "cost_quality": {"signal": "difficulty", "strong": STRONG, "weak": WEAK, "target_strong_share": 0.5},
            "explore": {"epsilon": EPSILON},
        }],
    }))
    return path


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two SQLite decision logs of the world: without comparisons, and with 300 judged requests."""
    root = tmp_path_factory.mktemp("offpolicy")
    out: dict[str, Any] = {"root": root, "config": eval_config(root / "config.yaml")}
    for name, judged in (("plain", 0), ("judged", 300)):
        records, feedback, truth = world(judged=judged)
        db = root / f"{name}.db"
        asyncio.run(fill(SQLiteDecisionStore(str(db)), records, feedback))
        out[name] = {"url": f"logs:sqlite:///{db}", "truth": truth}
    yield out


def run_eval(logs: dict[str, Any], name: str, *extra: str) -> tuple[int, Path]:
    out = logs["root"] / f"report-{name}"
    code = pointsman(["eval", "--config", str(logs["config"]), "--route", "auto", "--data", logs[name]["url"],
                      "--out", str(out), "--bootstrap", "500", "--no-progress", *extra])
    return code, out


def replayed(out: Path) -> dict[str, str]:
    """The replayed route's model per request id (``decisions.jsonl``)."""
    lines = (out / "decisions.jsonl").read_text().splitlines()
    return {d["request_id"]: d["model"] for d in map(json.loads, lines)}


def truths(truth: list[Logged], decisions: dict[str, str]) -> dict[str, float]:
    """The analytic values on the rows the estimators use (explored, in the pair, with text and feedback)."""
    rows = truth[:N_LOGGED]
    assert all(t.request_id in decisions for t in rows)

    def mean(choose: Any) -> float:
        return float(np.mean([P_GOOD[(t.is_math, choose(t))] for t in rows]))

    def logging_value(t: Logged) -> float:
        greedy, other = (STRONG, WEAK) if t.is_math else (WEAK, STRONG)
        return (1 - EPSILON / 2) * P_GOOD[(t.is_math, greedy)] + EPSILON / 2 * P_GOOD[(t.is_math, other)]

    return {
        "router": mean(lambda t: decisions[t.request_id]),
        "always_strong": mean(lambda t: STRONG),
        "always_weak": mean(lambda t: WEAK),
        "logging": float(np.mean([logging_value(t) for t in rows])),
        "share": float(np.mean([decisions[t.request_id] == STRONG for t in rows])),
        "cost": float(np.mean([COST[decisions[t.request_id]] for t in rows])),
    }


def inside(entry: dict[str, Any], value: float) -> bool:
    lo, hi = entry["ci"]
    return bool(lo <= value <= hi)


def test_eval_on_logs_alone_estimates_the_route_by_inverse_propensity(
    logs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_eval(logs, "plain")
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "SNIPS" in printed.out and "not randomised" not in printed.err
    report = json.loads((out / "report.json").read_text())
    decisions = replayed(out)
    truth = truths(logs["plain"]["truth"], decisions)
    # No labelled request (no comparisons): no direct section, and the report says why.
    assert "routers" not in report and report["estimator"]["direct"]["rows"] == 0
    assert "no quality for both" in report["estimator"]["direct"]["text"]
    assert report["estimator"]["name"] == "ips+snips+dr"
    est = report["estimator"]["offpolicy"]
    assert est["rows"] == N_LOGGED and est["rows_without_propensity"] == N_NOT_RANDOMISED
    assert est["numbers"] == ["offpolicy"] and {"ips", "snips", "dr", "logging"} <= set(est["estimators"])
    off = report["offpolicy"]
    assert off["rows"]["used"] == N_LOGGED
    assert off["rows"]["excluded"] == {
        NO_PROPENSITY: N_NOT_RANDOMISED, "no quality feedback on the served answer": N_NO_FEEDBACK,
        "no conversation text (only its embedding was stored)": N_EMBEDDING_ONLY,
        "served a model outside the pair": N_OTHER_MODEL,
    }
    assert off["rows"]["outcome_from"]["implicit"] > 50
    assert off["rows"]["outcome_from"]["explicit"] + off["rows"]["outcome_from"]["implicit"] == N_LOGGED
    assert off["propensity"] == {"min": 0.25, "max": 0.75, "mean": pytest.approx(0.625, abs=0.03)}
    pol = off["policies"]
    # The route decided some requests each way: its value is not one of the baselines'.
    assert 0.2 < truth["share"] < 0.8
    for name in ("router", "always_strong", "always_weak"):
        for estimator in ("ips", "snips", "dr"):
            entry = pol[name]["quality"][estimator]
            assert inside(entry, truth[name]), (name, estimator, entry, truth[name])
            assert entry["ci"][1] - entry["ci"][0] < 0.2  # informative: not the whole [0, 1]
    assert inside(pol["logging"]["quality"], truth["logging"])
    assert pol["router"]["strong_share"]["replayed"]["value"] == pytest.approx(truth["share"])
    for estimator in ("ips", "snips"):
        assert inside(pol["router"]["strong_share"][estimator], truth["share"])
        assert inside(pol["router"]["cost"][estimator], truth["cost"])
    assert inside(off["differences"]["router-logging"]["snips"], truth["router"] - truth["logging"])
    assert inside(pol["router"]["weight_mean"], 1.0)
    assert off["cost_basis"]["kind"] == "logged" and pol["router"]["unsupported"] == 0
    assert 0.2 * N_LOGGED < pol["router"]["ess"] < N_LOGGED
    # The files say which estimator produced what, and why rows were left out.
    markdown, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in (markdown, page):
        assert "SNIPS" in text and "IPS" in text and "DR" in text and "Estimators" in text
        assert f"{N_NOT_RANDOMISED} not randomised (no propensity)" in text
        assert "direct section not computed" in text
    assert report["plots"] == {"offpolicy": "offpolicy.png"}
    assert (out / "offpolicy.png").read_bytes()[:8] == PNG_MAGIC
    assert 'src="offpolicy.png"' in page and "](offpolicy.png)" in markdown


def test_eval_with_comparisons_reports_both_estimators_each_on_its_rows(logs: dict[str, Any]) -> None:
    code, out = run_eval(logs, "judged")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["estimator"]["name"] == "direct+ips+snips+dr"
    assert report["estimator"]["direct"]["rows"] == report["rows"]["evaluated"] == 300
    assert report["estimator"]["offpolicy"]["rows"] == report["offpolicy"]["rows"]["used"] == N_LOGGED
    assert report["routers"]["router"]["apgr"]["value"] is not None and "offpolicy" in report["plots"]
    # Every request was replayed once, whichever estimator reads it (the judged ones are logged rows too).
    assert report["rows"]["replayed"] == N_LOGGED
    ids = [json.loads(line)["request_id"] for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == N_LOGGED
    decisions = replayed(out)
    truth = truths(logs["judged"]["truth"], decisions)
    assert inside(report["offpolicy"]["policies"]["router"]["quality"]["snips"], truth["router"])
    markdown = (out / "report.md").read_text()
    assert "APGR" in markdown and "Off-policy" in markdown and "direct" in markdown


def test_eval_without_labelled_or_randomised_rows_says_why(
    tmp_path: Path, logs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    records, feedback, _ = world(n=0)  # only the extras: none explored, no comparisons
    db = tmp_path / "unexplored.db"
    asyncio.run(fill(SQLiteDecisionStore(str(db)), records, feedback))
    code = pointsman(["eval", "--config", str(logs["config"]), "--data", f"logs:sqlite:///{db}", "--out",
                      str(tmp_path / "o"), "--bootstrap", "20", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "nothing to evaluate" in err and f"{N_NOT_RANDOMISED} {NO_PROPENSITY}" in err
    assert "explore.epsilon" in err and "compare" in err
    assert not (tmp_path / "o" / "report.json").exists()


def test_eval_holdout_reads_the_same_part_of_the_logs_that_train_holdout_left_out(logs: dict[str, Any]) -> None:
    """--holdout F on eval keeps the labelled rows and the logged outcomes that pointsman train --holdout F
    left out of training, by the same key, so two routers can be compared on the same requests."""
    full = load_source(logs["judged"]["url"])
    held = split_sources([full], 0.3, "heldout")[0]
    code, out = run_eval(logs, "judged", "--holdout", "0.3")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["data"][0]["holdout"] == {"fraction": 0.3, "part": "heldout", "seed": HOLDOUT_SEED}
    judged = [r for r in held.rows if r.labelled_for(STRONG, WEAK) and r.has_text]
    assert report["rows"]["evaluated"] == len(judged) and 60 < len(judged) < 120  # ~30% of the 300 judged
    replayed_ids = set(replayed(out))
    assert {r.request_id for r in judged} <= replayed_ids
    assert replayed_ids <= {r.request_id for r in held.rows} | {r.request_id for r in held.logged}
    assert report["offpolicy"]["rows"]["used"] < 0.4 * N_LOGGED
    # A labelled row and the logged outcome of the same request fall on the same side.
    both = {r.request_id for r in full.rows} & {o.request_id for o in full.logged}
    assert len(both) > 100
    assert both & {r.request_id for r in held.rows} == both & {o.request_id for o in held.logged}
    assert 0.2 < len(held.logged) / len(full.logged) < 0.4
