"""A gateway with keys, a cost-quality route, a failing route, a direct model and an experiment,
and a fixed mix of real traffic through it: what the dashboard tests read back.

Prices (per million tokens) and the fake's usage (11 prompt + 7 completion tokens per answer) make
every answer's cost exact: ``strong`` 320e-6 USD, ``weak`` 16e-6, ``ctl``/``alt`` 25e-6.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.auth import hash_key
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

CLIENT_KEY = "sk-client-" + uuid.uuid4().hex
ADMIN_KEY = "sk-admin-" + uuid.uuid4().hex
#: Put in every prompt: the dashboard's JSON must never contain it (decisions hold no text).
SECRET = "prompt-marker-" + uuid.uuid4().hex[:12]

PRICES = {"strong": (10.0, 30.0), "weak": (0.5, 1.5), "ctl": (1.0, 2.0), "alt": (1.0, 2.0)}


def answer_cost(model: str) -> float:
    inp, out = PRICES[model]
    return (11 * inp + 7 * out) / 1e6


def config(upstream: FakeUpstream, *, keys: bool = True, slow_strong: float = 0.0) -> dict[str, Any]:
    """``slow_strong``: the strong model answers after that many seconds (latency worth drawing)."""
    scripts = {"strong": f"slow:{slow_strong}"} if slow_strong else {}
    models = [
        {"name": name, "upstream_name": scripts.get(name, "ok"), "input_cost_per_mtok": inp,
         "output_cost_per_mtok": out}
        for name, (inp, out) in PRICES.items()
    ]
    models += [{"name": "broken", "upstream_name": "always-500"}, {"name": "picky", "upstream_name": "bad-request"}]
    cfg: dict[str, Any] = {
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "timeouts": {"connect": 2, "first_byte": 10, "total": 20, "idle": 5}, "models": models}],
        "retry": {"attempts": 1},
        "breaker": {"failure_threshold": 1000, "min_requests": 1000},
        "classifiers": {"encoder": "static"},
        "routes": [
            {"name": "auto", "policy": "rules",
             "cost_quality": {"signal": "difficulty", "strong": "strong", "weak": "weak", "threshold": 0.5}},
            {"name": "flaky", "model": "broken"},
            {"name": "split", "model": "ctl"},
            {"name": "faq", "model": "weak", "cache": {"mode": "exact", "ttl": 600}},
        ],
        "experiments": [
            {"name": "ab-alt", "route": "split", "key": "user",
             "arms": [{"name": "control", "control": True}, {"name": "alt", "model": "alt"}]},
        ],
    }
    if keys:
        cfg["auth"] = {"api_keys": [{"name": "app", "sha256": hash_key(CLIENT_KEY)}],
                       "admin_keys": [{"name": "ops", "sha256": hash_key(ADMIN_KEY)}]}
    return cfg


@dataclass
class Sent:
    """What :func:`drive` sent and what the gateway answered."""

    ids: list[str] = field(default_factory=list)
    by_route: dict[str, dict[str, int]] = field(default_factory=dict)  # route -> model -> answers
    statuses: dict[int, int] = field(default_factory=dict)
    arms: dict[str, int] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)  # x-pointsman-cache-ish outcome -> count (faq route)
    cost: float = 0.0
    baseline: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.ids)


def drive(gateway: GatewayProcess, *, strong: int = 3, weak: int = 9, failing: int = 2, rejected: int = 1,
          split: int = 6, cached: int = 0, key: str | None = CLIENT_KEY, users: str = "user") -> Sent:
    """Send the mix; returns what was sent and what each should cost (actual and always-strong).
    ``cached`` requests go to the ``faq`` route (an exact response cache) with 2 distinct questions
    of this call's ``users``: the first of each is a miss, the rest hits."""
    sent = Sent()
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as client:
        def post(model: str, extra_headers: dict[str, str] | None = None, user: str | None = None,
                 text: str = "Please help") -> httpx.Response:
            body: dict[str, Any] = {"model": model, "max_tokens": 8,
                                    "messages": [{"role": "user", "content": f"{text} {SECRET}"}]}
            if user:
                body["user"] = user
            reply = client.post("/chat/completions", json=body, headers=extra_headers or {})
            sent.ids.append(reply.headers["x-pointsman-request-id"])
            sent.statuses[reply.status_code] = sent.statuses.get(reply.status_code, 0) + 1
            return reply

        for i in range(strong + weak):
            threshold = "0" if i < strong else "1"  # 0: every request is hard enough; 1: none is
            reply = post("auto", {"x-pointsman-threshold": threshold})
            model = reply.headers["x-pointsman-model"]
            assert reply.status_code == 200 and model == ("strong" if i < strong else "weak"), reply.text
            sent.by_route.setdefault("auto", {}).setdefault(model, 0)
            sent.by_route["auto"][model] += 1
            sent.cost += answer_cost(model)
            sent.baseline += answer_cost("strong")
        for _ in range(failing):
            assert post("flaky").status_code == 502
            sent.by_route.setdefault("flaky", {}).setdefault("broken", 0)
            sent.by_route["flaky"]["broken"] += 1
        for _ in range(rejected):
            assert post("picky").status_code == 400
            sent.by_route.setdefault("(direct)", {}).setdefault("picky", 0)
            sent.by_route["(direct)"]["picky"] += 1
        for i in range(split):
            reply = post("split", user=f"{users}-{i}")
            assert reply.status_code == 200, reply.text
            arm = reply.headers["x-pointsman-arm"].split("/", 1)[1]
            model = reply.headers["x-pointsman-model"]
            sent.arms[arm] = sent.arms.get(arm, 0) + 1
            sent.by_route.setdefault("split", {}).setdefault(model, 0)
            sent.by_route["split"][model] += 1
            sent.cost += answer_cost(model)
            sent.baseline += answer_cost("strong")  # no cost-quality pair: the dearest model
        for i in range(cached):
            reply = post("faq", text=f"FAQ {users} {i % 2}")
            assert reply.status_code == 200, reply.text
            model = reply.headers["x-pointsman-model"]
            sent.cache["hit" if i >= 2 else "miss"] = sent.cache.get("hit" if i >= 2 else "miss", 0) + 1
            sent.by_route.setdefault("faq", {}).setdefault(model, 0)
            sent.by_route["faq"][model] += 1
            record = gateway.decision(reply.headers["x-pointsman-request-id"], timeout=10)
            sent.cost += record["cost_usd"] or 0.0
            inp, out = PRICES["strong"]
            sent.baseline += ((record["prompt_tokens"] or 0) * inp + (record["completion_tokens"] or 0) * out) / 1e6
    eventually(lambda: len({r["request_id"] for r in gateway.decisions()} & set(sent.ids)) == sent.requests,
               "every decision written", timeout=10)
    return sent


def start(upstream: FakeUpstream, workdir: Path, *, keys: bool = True, slow_strong: float = 0.0) -> GatewayProcess:
    return GatewayProcess(config(upstream, keys=keys, slow_strong=slow_strong), workdir).start(timeout=90)
