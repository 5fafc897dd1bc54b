"""Assignment by key: the same key always gets the same arm (in another process too), keys spread over
the arms by their weights, two experiments split the same keys independently, and a request without
its key falls back as configured."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter

import pytest

from policies.experiments.assign import ArmTable, assignment_key, conversation_hash, key_value
from tests.gatewayproc import REPO

N = 10_000


def arm_of(experiment: str, user: str, table: ArmTable) -> str:
    point = assignment_key(experiment, "user", "exclude", {"user": user}, {}, "unused")
    assert point is not None
    return table.pick(point.fraction)


def test_the_same_key_gets_the_same_arm_in_another_process_with_another_hash_seed() -> None:
    table = ArmTable({"control": 2.0, "a": 1.0, "b": 1.0})
    here = [arm_of("exp", f"user-{i}", table) for i in range(200)]
    script = (
        "import json; from policies.experiments.assign import ArmTable, assignment_key\n"
        "t = ArmTable({'control': 2.0, 'a': 1.0, 'b': 1.0})\n"
        "print(json.dumps([t.pick(assignment_key('exp', 'user', 'exclude', {'user': f'user-{i}'}, {}, 'x').fraction)"
        " for i in range(200)]))"
    )
    there = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(there.stdout) == here
    assert [arm_of("exp", f"user-{i}", table) for i in range(200)] == here  # and again here


def test_keys_spread_over_arms_by_weight() -> None:
    table = ArmTable({"control": 2.0, "a": 1.0, "b": 1.0})
    counts = Counter(arm_of("spread", f"k{i}", table) for i in range(N))
    for arm, share in {"control": 0.5, "a": 0.25, "b": 0.25}.items():
        sd = math.sqrt(N * share * (1 - share))
        assert abs(counts[arm] - N * share) < 4 * sd, (arm, counts)


def test_two_experiments_split_the_same_keys_independently() -> None:
    table = ArmTable({"x": 1.0, "y": 1.0})
    joint = Counter((arm_of("first", f"k{i}", table), arm_of("second", f"k{i}", table)) for i in range(N))
    sd = math.sqrt(N * 0.25 * 0.75)
    for cell in (("x", "x"), ("x", "y"), ("y", "x"), ("y", "y")):
        assert abs(joint[cell] - N / 4) < 4 * sd, joint


def test_a_zero_share_arm_is_never_picked_and_every_point_lands_somewhere() -> None:
    table = ArmTable({"a": 1.0, "never": 0.0, "b": 1.0, "last": 0.0})
    assert {table.pick(i / 1000) for i in range(1000)} | {table.pick(0.999999999999)} == {"a", "b"}
    with pytest.raises(ValueError):
        ArmTable({"a": 0.0})


def test_key_kinds_and_the_missing_key_fallbacks() -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    headers = {"authorization": "Bearer sk-abc", "x-pointsman-session-id": "s-1"}
    assert key_value("api_key", body, headers) == "sk-abc"
    assert key_value("session", body, headers) == "s-1"
    assert key_value("user", {**body, "user": "alice"}, headers) == "alice"
    assert key_value("user", {**body, "user": 42}, headers) is None  # not a string: no key
    # Later turns repeat the conversation's start: the same conversation hash.
    later = {"messages": [*body["messages"], {"role": "assistant", "content": "Hello"},
                          {"role": "user", "content": "More"}]}
    assert conversation_hash(later) == conversation_hash(body)
    assert conversation_hash({"messages": [{"role": "user", "content": "Other"}]}) != conversation_hash(body)

    assert assignment_key("e", "user", "exclude", body, {}, "req-1") is None
    by_conversation = assignment_key("e", "user", "conversation", body, {}, "req-1")
    assert by_conversation is not None and by_conversation.source == "conversation"
    assert by_conversation == assignment_key("e", "user", "conversation", later, {}, "req-2")
    by_request = assignment_key("e", "user", "request", body, {}, "req-1")
    assert by_request is not None and by_request.source == "request"
    assert by_request != assignment_key("e", "user", "request", body, {}, "req-2")
    # The stored identity is a hash, never the key.
    stored = assignment_key("e", "api_key", "exclude", body, headers, "r")
    assert stored is not None and "sk-abc" not in stored.hash and len(stored.hash) == 32


def test_a_long_conversation_start_is_hashed_in_bounded_time_and_still_told_apart() -> None:
    long = "x" * 200_000
    first = {"messages": [{"role": "user", "content": long + "a"}]}
    assert conversation_hash(first) == conversation_hash({"messages": [{"role": "user", "content": long + "a"}]})
    assert conversation_hash(first) != conversation_hash({"messages": [{"role": "user", "content": long + "b"}]})
    assert conversation_hash(first) != conversation_hash({"messages": [{"role": "user", "content": long + "ab"}]})
