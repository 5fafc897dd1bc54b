"""The whole eval loop on a running gateway, every step through the product's public surface.

A router is first trained on a labelled file from an "old" world where the weak model fails math
prompts (so math goes to the strong model and chat to the weak one). The live traffic comes from a
different world: the graded fake upstream's weak model fails the *chat* prompts instead. Then:

1. traffic through the real gateway with the openai SDK; every answer is compared with the other
   model's by a fake judge (``compare.share: 1``) and the client posts explicit feedback;
2. ``pointsman train --data logs:sqlite:///...`` learns a new version from the decision log;
3. ``pointsman eval`` on held-out prompts of the live world shows the new version beating the old;
4. ``pointsman promote`` passes the gate;
5. the still-running gateway now sends the chat prompts to the strong model.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.evals.labelled_files import STRONG, WEAK, prompts, rows, write_jsonl
from tests.fakes.graded import GradedUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

TRAFFIC = prompts(seed=101, n=160)
HELDOUT = rows(seed=202, n=120, relation="chat-needs-strong", noise=0.0)
IS_MATH = {text: is_math for text, is_math in [*TRAFFIC, *prompts(seed=202, n=120)]}
GRADE = re.compile(r"\[\[grade:([0-9.]+)\]\]")


def live_quality(model: str, prompt: str) -> float:
    """The live world: the strong model answers everything well, the weak one only the math."""
    if model == STRONG:
        return 1.0
    return 1.0 if IS_MATH.get(prompt, False) else 0.0


def pointsman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def gateway_config(upstream: GradedUpstream, registry: Path) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "graded", "base_url": upstream.base_url, "health": {"enabled": False},
            "models": [
                {"name": STRONG, "input_cost_per_mtok": 10.0, "output_cost_per_mtok": 30.0},
                {"name": WEAK, "input_cost_per_mtok": 0.5, "output_cost_per_mtok": 1.5},
                {"name": "judge"},
            ],
        }],
        "routes": [{
            "name": "auto", "policy": "rules",
            "cost_quality": {"strong": STRONG, "weak": WEAK, "threshold": 0.5},
            "compare": {"share": 1.0, "judge": "judge", "max_concurrency": 8},
            "record": {"embedding": True, "text": True},
        }],
        "classifiers": {"encoder": "static", "routers_dir": str(registry), "reload_interval": 0.2},
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("eval-loop")
    registry = root / "routers"
    old = write_jsonl(root / "old-world.jsonl", rows(seed=303, n=240, relation="math-needs-strong", noise=0.0))
    trained = pointsman("train", "--data", f"file:{old}", "--encoders", "static", "--out", str(registry),
                        "--no-progress")
    assert trained.returncode == 0, trained.stderr
    upstream = GradedUpstream(live_quality).start()
    (root / "gw").mkdir()
    gateway = GatewayProcess(gateway_config(upstream, registry), root / "gw").start()
    try:
        yield {"root": root, "registry": registry, "gateway": gateway, "upstream": upstream,
               "heldout": write_jsonl(root / "heldout.jsonl", HELDOUT)}
    finally:
        gateway.terminate()
        upstream.stop()


def active_version(registry: Path) -> str:
    return str(json.loads((registry / "active.json").read_text())["version"])


def route_of(gateway: GatewayProcess, text: str) -> dict[str, Any]:
    response = httpx.post(f"{gateway.base_url}/route",
                          json={"model": "auto", "messages": [{"role": "user", "content": text}]}, timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json())


def feedback_rows(db: Path, source: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM feedback WHERE source = ?", (source,)).fetchone()[0])


@pytest.mark.timeout(600)  # three trainings (with the default warm start), two replays, a promotion
def test_the_gateway_learns_from_its_own_traffic(world: dict[str, Any]) -> None:
    gateway: GatewayProcess = world["gateway"]
    registry: Path = world["registry"]
    first = active_version(registry)
    chat_prompts = [text for text, is_math in TRAFFIC if not is_math]

    # Before: the old router sends chat to the weak model.
    before = [route_of(gateway, text) for text in chat_prompts[:10]]
    assert {r["router_version"] for r in before} == {first}
    assert sum(r["model"] == WEAK for r in before) >= 8, [r["model"] for r in before]

    # 1. Traffic, explicit feedback on every answer, a judge comparison of every answer.
    client = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    for text, _ in TRAFFIC:
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": text}])
        assert raw.headers["x-pointsman-router"] == first
        completion = raw.parse()
        grade = GRADE.search(completion.choices[0].message.content or "")
        assert grade is not None
        posted = httpx.post(f"{gateway.base_url}/feedback", timeout=30, json={
            "request_id": raw.headers["x-pointsman-request-id"], "score": float(grade.group(1))})
        assert posted.status_code == 200, posted.text
    assert feedback_rows(gateway.db_path, "user") == len(TRAFFIC)
    # One judge row per model of every compared request.
    eventually(lambda: feedback_rows(gateway.db_path, "judge") == 2 * len(TRAFFIC),
               "judge feedback on every request", timeout=120)
    verdicts = world["upstream"].state.verdicts
    assert len(verdicts) == 2 * len(TRAFFIC)  # both orders of every pair

    # 2. Retrain from the decision log into a new, inactive version.
    trained = pointsman("train", "--data", f"logs:sqlite:///{gateway.db_path}", "--encoders", "static",
                        "--out", str(registry), "--no-progress")
    assert trained.returncode == 0, trained.stderr
    versions = sorted(p.name for p in (registry / "versions").iterdir())
    assert len(versions) == 2 and active_version(registry) == first
    second = next(v for v in versions if v != first)

    # 3. Offline replay on held-out prompts of the live world: the new version beats the old.
    apgr = {}
    for version in (first, second):
        out = world["root"] / f"eval-{version}"
        report = pointsman("eval", "--config", str(gateway.config_path), "--route", "auto",
                           "--data", f"file:{world['heldout']}", "--routers-dir", str(registry / "versions" / version),
                           "--out", str(out), "--bootstrap", "200", "--no-progress")
        assert report.returncode == 0, report.stderr
        assert (out / "report.html").exists()
        apgr[version] = json.loads((out / "report.json").read_text())["routers"]["router"]["apgr"]["value"]
    assert apgr[second] > apgr[first] + 0.2, apgr

    # 4. The promotion gate.
    promoted = pointsman("promote", second, "--registry", str(registry), "--data", f"file:{world['heldout']}",
                         "--no-progress")
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    assert active_version(registry) == second

    # 5. The running gateway picks it up and routes the chat prompts to the strong model.
    eventually(lambda: route_of(gateway, chat_prompts[0])["router_version"] == second,
               "the promoted version serving", timeout=30)
    after = [route_of(gateway, text) for text in chat_prompts[:10]]
    assert sum(r["model"] == STRONG for r in after) >= 8, [r["model"] for r in after]
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": chat_prompts[1]}])
    assert raw.headers["x-pointsman-router"] == second
    assert gateway.decision(raw.headers["x-pointsman-request-id"])["router_version"] == second
