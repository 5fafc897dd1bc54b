"""A ``target_strong_share`` route measured as an operator would: real gateway replicas sharing the real
Redis, varied prompts from the bundled RouteLLM data, the share read from ``x-pointsman-model``."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import random
from pathlib import Path

import httpx
import pytest

from tests.blackbox.test_auto_routing import routing_config
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import REPO, GatewayProcess
from tests.shared_state.conftest import REDIS_URL

PROMPTS = REPO / "evals" / "data" / "prior" / "routellm-gpt4-mixtral.jsonl.gz"


def _prompts(n: int) -> list[str]:
    with gzip.open(PROMPTS, "rt", encoding="utf-8") as fh:
        texts = [json.loads(line)["messages"][-1]["content"] for line in fh]
    random.Random(7).shuffle(texts)
    return texts[:n]


@pytest.mark.timeout(240)
def test_identical_prompts_split_and_two_replicas_hold_the_target_share_together(
    upstream: FakeUpstream, prefix: str, tmp_path: Path
) -> None:
    config = routing_config(upstream)
    route = config["routes"][0]  # type: ignore[index]
    route["rules"] = []
    route.pop("sticky")
    route["cost_quality"] = {"signal": "difficulty", "strong": "big-model", "weak": "small-model",
                             "target_strong_share": 0.3, "window": 500, "min_samples": 50}
    config["shared_state"] = {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "knob_sync_interval": 0.2}
    replicas = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        replicas.append(GatewayProcess(config, tmp_path / name).start(timeout=60))
    clients = [httpx.Client(base_url=g.base_url, timeout=30) for g in replicas]
    try:
        diverse = _prompts(1400)

        def score(text: str) -> float:
            body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
            return float(clients[0].post("/route", json=body).json()["knob"]["score"])

        # One prompt sent over and over (a template, a retry loop): a score above 60% of the others.
        ranked = sorted(diverse[:200], key=score)
        repeated = ranked[int(len(ranked) * 0.6)]
        traffic = [(repeated if i % 2 else diverse[200 + i // 2]) for i in range(2400)]

        def ask(i: int) -> bool:
            body = {"model": "auto", "messages": [{"role": "user", "content": traffic[i]}], "max_tokens": 4}
            reply = clients[i % 2].post("/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.headers["x-pointsman-model"] == "big-model"

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            strong = list(pool.map(ask, range(len(traffic))))
        later = strong[1200:]  # both replicas calibrated on the shared window by now
        assert sum(later) / len(later) == pytest.approx(0.3, abs=0.07)
        repeats = [s for i, s in enumerate(later) if i % 2]
        assert 0.05 < sum(repeats) / len(repeats) < 0.95, "the repeated prompt is split, not sent all one way"
    finally:
        for client in clients:
            client.close()
        for gateway in replicas:
            gateway.terminate()
