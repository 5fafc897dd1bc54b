"""One gateway subprocess serving every test workflow, against the scripted fake upstream.

The fake's model names carry their script (``tests/fakes/upstream.py``): ``lp-0.35`` answers with
token logprobs of -0.35 (confidence exp(-0.35) = 0.705), ``say:<text>`` answers that text,
``cycle:a|b`` takes turns, ``hang:<tag>`` never answers, ``slow:<s>`` answers after ``s`` seconds,
``rater`` / ``pairjudge`` are judges that read ``quality=<x>`` markers. Every answer reports 11
prompt and 7 completion tokens; ``cheap`` models cost 1/2 USD per million tokens in/out, ``strong``
ones 10/30, so the cost of every sub-call is known exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

CHEAP = {"input_cost_per_mtok": 1.0, "output_cost_per_mtok": 2.0}
STRONG = {"input_cost_per_mtok": 10.0, "output_cost_per_mtok": 30.0}
#: What one fake answer (11 prompt, 7 completion tokens) costs on a cheap and on a strong model.
CHEAP_CALL = (11 * 1.0 + 7 * 2.0) / 1e6
STRONG_CALL = (11 * 10.0 + 7 * 30.0) / 1e6
STRONG_TEXT = "The strong answer."
MESSAGES = [{"role": "user", "content": "Say hello."}]
THRESHOLD = 0.7

MODELS: dict[str, tuple[str, dict[str, float]]] = {
    # name: (the fake's script, prices)
    "above": ("lp-0.35", CHEAP),  # exp(-0.35) = 0.7047: just above the threshold
    "below": ("lp-0.36", CHEAP),  # exp(-0.36) = 0.6977: just below it
    "unsure": ("lp-0.60", CHEAP),  # 0.5488
    "nolp": ("ok", CHEAP),  # never returns logprobs
    "strong": (f"say:{STRONG_TEXT}", STRONG),
    "voter": ("cycle:x = 42|The answer is 42.|17", CHEAP),  # honours n: 42, 42, 17 -> 2/3 agree
    "split": ("cycle1:42|17|9", CHEAP),  # ignores n: three single calls, all different
    "yes": ("say:Yes.", CHEAP),
    "no": ("say:No, it is wrong.", CHEAP),
    "babble": ("say:Perhaps, who knows", CHEAP),
    "cand-a": ("say:Answer A quality=0.9", CHEAP),
    "cand-b": ("say:Answer B quality=0.4", CHEAP),
    "cand-c": ("say:Answer C quality=0.7", CHEAP),
    "failing": ("always-500", CHEAP),
    "stuck": ("hang:stuck", CHEAP),
    "stuck-2": ("hang:stuck-2", CHEAP),
    "stuck-3": ("hang:stuck-3", CHEAP),
    "rater": ("rater", CHEAP),
    "pairjudge": ("pairjudge", CHEAP),
    "fuser": ("say:The fused answer.", STRONG),
    "echo": ("echo", CHEAP),
    "slow": ("slow:3", CHEAP),
    **{f"slow-{i}": (f"slow:0.3#{i}", CHEAP) for i in range(4)},
}


def cascade(name: str, stages: list[Any], **confidence: Any) -> dict[str, Any]:
    caps = confidence.pop("caps", {})
    return {"name": name, "kind": "cascade", "stages": stages,
            "confidence": {"source": "logprobs", "threshold": THRESHOLD, **confidence}, "caps": caps}


WORKFLOWS: list[dict[str, Any]] = [
    cascade("accept", ["above", "strong"]),
    cascade("escalate", ["below", "strong"]),
    cascade("three", [{"name": "small", "model": "below"}, {"name": "medium", "model": "unsure"},
                      {"name": "large", "model": "strong"}]),
    cascade("missing", ["nolp", "strong"]),
    cascade("missing-ok", ["nolp", "strong"], on_missing="accept"),
    cascade("margin", ["above", "strong"], stat="margin", threshold=0.5),
    cascade("lowest", ["above", "strong"], stat="min"),
    cascade("agree", ["voter", "strong"], source="agreement", threshold=0.6, samples=3),
    cascade("disagree", ["split", "strong"], source="agreement", threshold=0.6, samples=3),
    cascade("verified", ["unsure", "strong"], source="verifier", verifier={"model": "yes"}),
    cascade("refuted", ["unsure", "strong"], source="verifier", verifier={"model": "no"}),
    cascade("unreadable", ["unsure", "strong"], source="verifier", verifier={"model": "babble"}),
    cascade("fragile", ["unsure", "failing"]),  # the last stage fails: the checked answer is the best
    {"name": "moa", "kind": "fusion", "candidates": ["cand-a", "failing", "stuck"], "timeout": 1.0,
     "combine": {"fuser": "fuser"}},
    {"name": "scored", "kind": "fusion", "candidates": ["cand-b", "cand-a", "cand-c"],
     "combine": {"judge": "rater"}},
    {"name": "duel", "kind": "fusion", "candidates": ["cand-b", "cand-a"],
     "combine": {"judge": "pairjudge", "mode": "pairwise"}},
    {"name": "quorum", "kind": "fusion", "candidates": ["cand-a", "failing", "stuck"], "timeout": 1.0,
     "min_answers": 2, "combine": {"fuser": "fuser"}},
    {"name": "panel", "kind": "ratings", "candidates": ["cand-b", "cand-a", "cand-c"], "judge": "rater"},
    {"name": "dcr", "kind": "graph", "output": "revise", "steps": [
        {"name": "draft", "model": "echo"},
        {"name": "critique", "model": "echo", "after": ["draft"], "prompt": "Critique [{draft}] of [{input}]"},
        {"name": "revise", "model": "echo", "after": ["draft", "critique"], "system": "Be brief.",
         "prompt": "Revise [{draft}] given [{critique}]"},
    ]},
    {"name": "wide", "kind": "graph", "output": "join", "caps": {"max_fanout": 2}, "steps": [
        *({"name": f"s{i}", "model": f"slow-{i}"} for i in range(4)),
        {"name": "join", "model": "echo", "after": [f"s{i}" for i in range(4)],
         "prompt": "{s0} {s1} {s2} {s3}"},
    ]},
    {"name": "stalled", "kind": "graph", "output": "second", "caps": {"max_seconds": 1.0}, "steps": [
        {"name": "first", "model": "unsure"},
        {"name": "second", "model": "slow", "after": ["first"], "prompt": "Improve: {first}"},
    ]},
    {"name": "hung", "kind": "fusion", "candidates": ["stuck", "stuck-2", "stuck-3"], "timeout": 60,
     "combine": {"fuser": "fuser"}},
    cascade("few-steps", ["unsure", "strong"], caps={"max_steps": 1}),
    cascade("few-tokens", ["unsure", "strong"], caps={"max_tokens": 20}),
    cascade("cheapskate", ["unsure", "strong"], caps={"max_cost_usd": 5e-5}),
    cascade("hasty", ["unsure", "slow"], caps={"max_seconds": 1.0}),
    {"name": "too-slow", "kind": "fusion", "candidates": ["slow", "stuck"], "caps": {"max_seconds": 0.5},
     "combine": {"fuser": "fuser"}},
    cascade("broke", ["strong", "unsure"], caps={"max_cost_usd": 1e-7}),
]


def workflow_config(upstream: FakeUpstream) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
            "timeouts": {"connect": 2, "first_byte": 30, "total": 60, "idle": 10},
            "models": [{"name": name, "upstream_name": script, **prices} for name, (script, prices) in MODELS.items()],
        }],
        "workflows": WORKFLOWS,
        "workflow_limits": {"max_concurrent_subcalls": 32},
        "retry": {"attempts": 2, "backoff_base": 0.01, "backoff_max": 0.02},
        "breaker": {"failure_threshold": 1000, "cooldown": 1},
        "classifiers": {"encoder": "static"},
        "routes": [
            {"name": "careful", "model": "cascade/escalate"},
            {"name": "mixed", "policy": "rules", "model": "strong", "rules": [
                {"name": "tools-to-panel", "when": {"signal": "tools", "op": "truthy"},
                 "action": {"workflow": "panel"}},
            ]},
            {"name": "banded", "policy": "rules", "cost_quality": {
                "strong": "strong", "weak": "unsure", "threshold": 0.5,
                "middle": {"band": [0.0, 1.0], "workflow": "accept"}}},
        ],
    }


@pytest.fixture(scope="session")
def wf_gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(workflow_config(upstream), tmp_path_factory.mktemp("workflows")).start(timeout=60)
    yield proc
    proc.terminate()


@pytest.fixture
def sdk(wf_gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=wf_gateway.base_url, api_key="unused", max_retries=0, timeout=30)


def key() -> str:
    """A fresh ``user``: the fake counts requests (and cycles its answers) per user."""
    return uuid.uuid4().hex
