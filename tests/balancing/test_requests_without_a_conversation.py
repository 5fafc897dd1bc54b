"""Requests that carry no conversation (embeddings: an ``input``, no messages or prompt) have no session
to keep: a backend with ``session_affinity`` (or ``cache_aware``'s session fallback) spreads them by
load, as ``least_outstanding`` would, instead of pinning every one of a tenant's requests to the replica
the first one went to. Through a real gateway process in front of two fake replicas, with the openai SDK.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from gateway.balancing import Affinity, make_policy
from gateway.balancing.request import affinity_of, session_hash
from gateway.config import BackendConfig
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[FakeUpstream]]:
    fakes = [FakeUpstream().start() for _ in range(2)]
    yield fakes
    for fake in fakes:
        fake.stop()


def _config(replicas: list[FakeUpstream], policy: str) -> dict[str, Any]:
    return {
        "backends": [{
            "name": "engines", "replicas": [r.base_url for r in replicas], "health": {"enabled": False},
            "models": [{"name": "emb", "upstream_name": "ok"}, {"name": "chat", "upstream_name": "ok"}],
            "balancing": {"policy": policy},
        }],
        "retry": {"attempts": 1},
        "routes": [{"name": "auto", "model": "chat"}],
    }


@pytest.mark.parametrize("policy", ["session_affinity", "cache_aware"])
def test_embeddings_are_spread_over_the_replicas_not_pinned_to_one(
    replicas: list[FakeUpstream], policy: str, tmp_path: Path
) -> None:
    gateway = GatewayProcess(_config(replicas, policy), tmp_path).start(timeout=60)
    try:
        sdk = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=30)
        user = f"{policy}-embeddings"
        ids = []
        for i in range(6):  # one after the other: the replicas are equally loaded (idle) every time
            raw = sdk.embeddings.with_raw_response.create(model="emb", input=[f"document {i}"], user=user)
            ids.append(raw.headers["x-pointsman-request-id"])
        served = [sum(n for (model, key), n in r.state.requests.items() if key == user) for r in replicas]
        assert sum(served) == 6
        assert min(served) >= 2, f"every request went to one replica: {served}"
        reasons = {json.loads(gateway.decision(i)["decision"])["replica"]["reason"] for i in ids}
        assert "session" not in reasons
    finally:
        gateway.terminate()


def test_a_body_without_a_conversation_has_no_session_key() -> None:
    for body in ({"input": "a"}, {"input": ["a", "b"]}, {}, {"messages": []}, {"prompt": None}):
        assert session_hash("t", None, body) is None
    # A session id still makes one, and a conversation's start does.
    assert session_hash("t", "s-1", {"input": "a"}) is not None
    assert session_hash("t", None, {"messages": [{"role": "user", "content": "hi"}]}) is not None
    assert session_hash("t", None, {"prompt": "Once upon a time"}) is not None
    settings = BackendConfig.model_validate({
        "name": "b", "base_url": "http://127.0.0.1:1/v1", "models": [{"name": "m"}],
        "balancing": {"policy": "session_affinity"},
    }).balancing
    affinity = affinity_of(make_policy("session_affinity"), settings, b'{"input": "a"}', "t", None, {"input": "a"}, {})
    assert isinstance(affinity, Affinity) and affinity.session is None
