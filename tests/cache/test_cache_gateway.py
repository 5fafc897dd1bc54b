"""The response cache through a real gateway (in-memory store): scope, what is never cached, replay.

Every test primes an entry, then checks a request that must hit (no upstream call: the fake counts
calls per ``user``, a field the cache leaves out of its scope) or must miss (the fake is called again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.cache.helpers import (
    AUTH,
    KEY_A,
    KEY_B,
    PairedUpstream,
    ask,
    ask_together,
    backend,
    calls,
    paired_backend,
    unique,
    user_id,
)
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess

CACHE: dict[str, Any] = {}
RULES = [
    {"name": "no-forbidden", "priority": 100, "when": {"signal": "banned", "op": "truthy"},
     "action": {"block": "Blocked by policy."}},
    {"name": "redact-email", "priority": 90, "when": {"signal": "pii", "op": "truthy"},
     "action": {"redact": ["email"]}},
]


@pytest.fixture(scope="module")
def gw(upstream: FakeUpstream, paired: PairedUpstream,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [backend(upstream), paired_backend(paired)],
        "auth": AUTH,
        "retry": {"attempts": 1},
        "classifiers": {"encoder": "static"},
        "routes": [
            {"name": "exact", "model": "echo-model", "cache": CACHE},
            {"name": "exact-b", "model": "echo-model", "cache": CACHE},
            {"name": "uncached", "model": "echo-model"},
            {"name": "tools", "model": "text-model", "cache": CACHE},
            {"name": "knob", "policy": "rules", "cache": CACHE,
             "cost_quality": {"strong": "big", "weak": "small", "threshold": 0.5}},
            {"name": "guarded", "policy": "rules", "model": "echo-model", "rules": RULES, "cache": CACHE,
             "signals": {"keywords": {"banned": {"keywords": ["forbidden"]}}}},
            {"name": "sem", "model": "echo-model", "cache": {"mode": "semantic"}},
            {"name": "sem-95", "model": "echo-model", "cache": {"mode": "semantic", "similarity": 0.95}},
            {"name": "sem-2", "model": "echo-model", "cache": {"mode": "semantic", "max_entries": 2}},
            {"name": "sem-3", "model": "echo-model",
             "cache": {"mode": "semantic", "similarity": 0.85, "max_entries": 3}},
            {"name": "sem-pair", "model": "paired-model", "cache": {"mode": "semantic", "bucket_size": 2}},
            {"name": "sem-2x2", "model": "echo-model",
             "cache": {"mode": "semantic", "max_entries": 2, "bucket_size": 2}},
            {"name": "strict", "model": "echo-model", "cache": {"sampled": False}},
            {"name": "peruser", "model": "echo-model", "cache": {"per_user": True}},
            {"name": "c-err", "model": "err-model", "cache": CACHE},
            {"name": "c-bad", "model": "bad-model", "cache": CACHE},
            {"name": "c-len", "model": "len-model", "cache": CACHE},
            {"name": "c-trunc", "model": "trunc-model", "cache": CACHE},
            {"name": "c-reset", "model": "reset-model", "cache": CACHE},
        ],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("cache")).start(timeout=60)
    yield proc
    proc.terminate()


def user_msg(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def decision(gw: GatewayProcess, request_id: str) -> dict[str, Any]:
    raw = gw.decision(request_id)["decision"]
    return dict(json.loads(raw) if isinstance(raw, str) else raw)


# --- hits ----------------------------------------------------------------------------------------


def test_the_same_request_hits_without_an_upstream_call(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    user, prompt = user_id(), unique("What is a cache?")
    first = ask(gw.base_url, "exact", user_msg(prompt), user=user)
    assert first.status == 200 and first.cache == "miss"
    second = ask(gw.base_url, "exact", user_msg(prompt), user=user)
    assert second.status == 200 and second.cache == "hit"
    assert calls(upstream, "echo", user) == 1  # the hit cost no upstream call
    assert second.text == first.text == f"ECHO: {prompt}"
    assert second.headers["x-pointsman-model"] == "echo-model"
    assert second.headers["x-pointsman-backend"] == "cache"
    assert second.body["id"] != first.body["id"]  # a fresh id per replay
    assert second.body["usage"] == first.body["usage"]  # the original answer's usage
    rec = gw.decision(second.headers["x-pointsman-request-id"])
    cache = decision(gw, second.headers["x-pointsman-request-id"])["cache"]
    assert cache["hit"] is True and cache["match"] == "exact" and cache["similarity"] == 1.0
    assert cache["age_s"] >= 0 and len(cache["key"]) == 12 and cache["lookup_ms"] >= 0
    assert rec["status"] == 200 and rec["cost_usd"] == 0 and rec["model"] == "echo-model"
    missed = decision(gw, first.headers["x-pointsman-request-id"])["cache"]
    assert missed["hit"] is False and missed["result"] == "miss" and missed["key"] == cache["key"]


def test_user_field_is_not_in_the_scope_unless_per_user(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    prompt, one, two = unique("Shared FAQ"), user_id(), user_id()
    ask(gw.base_url, "exact", user_msg(prompt), user=one)
    assert ask(gw.base_url, "exact", user_msg(prompt), user=two).cache == "hit"
    assert calls(upstream, "echo", two) == 0
    ask(gw.base_url, "peruser", user_msg(prompt), user=one)
    assert ask(gw.base_url, "peruser", user_msg(prompt), user=two).cache == "miss"
    assert ask(gw.base_url, "peruser", user_msg(prompt), user=two).cache == "hit"


def test_routes_without_cache_say_nothing(gw: GatewayProcess) -> None:
    reply = ask(gw.base_url, "uncached", user_msg(unique("hi")))
    assert reply.status == 200 and reply.cache is None


# --- scope: each must miss --------------------------------------------------------------------------


def _primed(gw: GatewayProcess, route: str, messages: list[dict[str, Any]], **fields: Any) -> str:
    user = user_id()
    assert ask(gw.base_url, route, messages, user=user, **fields).cache == "miss"
    assert ask(gw.base_url, route, messages, user=user, **fields).cache == "hit"
    return user


def test_a_different_system_prompt_misses(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    q = unique("Summarise the plot of Hamlet")
    user = _primed(gw, "exact", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}])
    other = ask(gw.base_url, "exact", [{"role": "system", "content": "Be verbose."}, {"role": "user", "content": q}],
                user=user)
    assert other.cache == "miss" and calls(upstream, "echo", user) == 2
    assert ask(gw.base_url, "exact", user_msg(q), user=user).cache == "miss"  # no system prompt at all


def test_a_different_earlier_turn_misses(gw: GatewayProcess) -> None:
    q = unique("And what about the second one?")
    history = [{"role": "user", "content": "Name two rivers."}, {"role": "assistant", "content": "Nile and Amazon."}]
    user = _primed(gw, "exact", [*history, {"role": "user", "content": q}])
    changed = [{"role": "user", "content": "Name two mountains."}, {"role": "assistant", "content": "K2 and Fuji."}]
    assert ask(gw.base_url, "exact", [*changed, {"role": "user", "content": q}], user=user).cache == "miss"
    assert ask(gw.base_url, "exact", [history[0], {"role": "user", "content": q}], user=user).cache == "miss"


def test_different_tools_or_tool_choice_miss(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    def tool(name: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}

    q = user_msg(unique("What's the weather?"))
    user = _primed(gw, "tools", q, tools=[tool("get_weather")])
    assert ask(gw.base_url, "tools", q, user=user, tools=[tool("get_forecast")]).cache == "miss"
    assert ask(gw.base_url, "tools", q, user=user).cache == "miss"  # no tools
    assert ask(gw.base_url, "tools", q, user=user, tools=[tool("get_weather")], tool_choice="none").cache == "miss"
    assert calls(upstream, "text-only", user) == 4


def test_a_different_api_key_misses(gw: GatewayProcess) -> None:
    q = user_msg(unique("Tenant-scoped question"))
    user = _primed(gw, "exact", q)
    assert ask(gw.base_url, "exact", q, user=user, key=KEY_B).cache == "miss"
    assert ask(gw.base_url, "exact", q, user=user, key=KEY_B).cache == "hit"
    assert ask(gw.base_url, "exact", q, user=user, key=KEY_A).cache == "hit"


def test_a_different_route_misses(gw: GatewayProcess) -> None:
    q = user_msg(unique("Route-scoped question"))
    user = _primed(gw, "exact", q)
    assert ask(gw.base_url, "exact-b", q, user=user).cache == "miss"


def test_a_different_chosen_model_misses(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    q = user_msg(unique("Prove that there are infinitely many primes."))
    strong, weak = {"x-pointsman-threshold": "0"}, {"x-pointsman-threshold": "1"}
    user = user_id()
    first = ask(gw.base_url, "knob", q, user=user, headers=strong)
    assert first.headers["x-pointsman-model"] == "big" and first.cache == "miss"
    assert ask(gw.base_url, "knob", q, user=user, headers=strong).cache == "hit"
    other = ask(gw.base_url, "knob", q, user=user, headers=weak)
    assert other.headers["x-pointsman-model"] == "small" and other.cache == "miss"


@pytest.mark.parametrize("field,first,second", [
    ("response_format", {"type": "json_object"}, {"type": "text"}),
    ("temperature", 0, 0.7),
    ("top_p", 0.5, 0.9),
    ("max_tokens", 16, 32),
    ("seed", 1, 2),
    ("stop", ["\n"], ["."]),
    ("presence_penalty", 0.0, 0.5),
    ("frequency_penalty", 0.1, 0.2),
    ("logprobs", False, True),
])
def test_a_different_format_or_sampling_parameter_misses(gw: GatewayProcess, field: str, first: Any,
                                                          second: Any) -> None:
    q = user_msg(unique(f"Parameter scope {field}"))
    user = _primed(gw, "exact", q, **{field: first})
    assert ask(gw.base_url, "exact", q, user=user, **{field: second}).cache == "miss"
    assert ask(gw.base_url, "exact", q, user=user).cache == "miss"  # the parameter left out


def test_the_last_turn_is_in_the_exact_key(gw: GatewayProcess) -> None:
    user = _primed(gw, "exact", user_msg(unique("one question")))
    assert ask(gw.base_url, "exact", user_msg(unique("one question")), user=user).cache == "miss"


# --- block and redact rules run first -----------------------------------------------------------------


def test_lookup_runs_after_redaction_and_never_for_blocked_requests(gw: GatewayProcess) -> None:
    tag = unique("Please email")
    first = ask(gw.base_url, "guarded", user_msg(f"{tag} alice.martin@gmail.com about it"))
    assert first.cache == "miss" and "alice.martin@gmail.com" not in first.text
    # Another address redacts to the same forwarded body: the same entry.
    second = ask(gw.base_url, "guarded", user_msg(f"{tag} bob.jones@proton.me about it"))
    assert second.cache == "hit" and second.text == first.text
    blocked = ask(gw.base_url, "guarded", user_msg(unique("a forbidden thing")))
    assert blocked.status == 403 and blocked.cache is None


# --- never cached ---------------------------------------------------------------------------------


@pytest.mark.parametrize("route,fake,status", [("c-err", "always-500", 502), ("c-bad", "bad-request", 400)])
def test_error_responses_are_never_cached(gw: GatewayProcess, upstream: FakeUpstream, route: str, fake: str,
                                          status: int) -> None:
    q, user = user_msg(unique("fail me")), user_id()
    for n in (1, 2):
        reply = ask(gw.base_url, route, q, user=user)
        assert reply.status == status and reply.cache == "miss"
        assert calls(upstream, fake, user) == n


@pytest.mark.parametrize("stream", [False, True])
def test_truncated_answers_are_never_cached(gw: GatewayProcess, upstream: FakeUpstream, stream: bool) -> None:
    q, user = unique("write a long essay"), user_id()
    client = OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    for n in (1, 2):
        if stream:
            chunks = list(client.chat.completions.create(model="c-len", messages=user_msg(q), user=user, stream=True))
            assert chunks[-1].choices[0].finish_reason == "length"
        else:
            out = client.chat.completions.create(model="c-len", messages=user_msg(q), user=user)
            assert out.choices[0].finish_reason == "length"
        assert calls(upstream, "length", user) == n


@pytest.mark.parametrize("route,fake", [("c-trunc", "truncated-stream"), ("c-reset", "reset-midstream")])
def test_broken_streams_are_never_cached(gw: GatewayProcess, upstream: FakeUpstream, route: str, fake: str) -> None:
    q, user = user_msg(unique("stream and break")), user_id()
    for n in (1, 2):
        with httpx.stream("POST", f"{gw.base_url}/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {KEY_A}"},
                          json={"model": route, "messages": q, "user": user, "stream": True}) as response:
            body = response.read()
        assert response.headers["x-pointsman-cache"] == "miss"
        assert b'"error"' in body
        assert calls(upstream, fake, user) == n


def test_n_above_one_bypasses(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    q, user = user_msg(unique("two samples please")), user_id()
    for n in (1, 2):
        reply = ask(gw.base_url, "exact", q, user=user, n=2)
        assert reply.cache == "bypass" and calls(upstream, "echo", user) == n
    cache = decision(gw, reply.headers["x-pointsman-request-id"])["cache"]
    assert cache == {"hit": False, "result": "bypass", "reason": "n", "lookup_ms": cache["lookup_ms"]}


def test_sampled_false_caches_only_temperature_zero(gw: GatewayProcess) -> None:
    q = user_msg(unique("deterministic please"))
    assert ask(gw.base_url, "strict", q).cache == "bypass"  # temperature absent: the API default samples
    assert ask(gw.base_url, "strict", q, temperature=0.7).cache == "bypass"
    assert ask(gw.base_url, "strict", q, temperature=0).cache == "miss"
    assert ask(gw.base_url, "strict", q, temperature=0).cache == "hit"


def test_sampled_requests_are_cached_by_default(gw: GatewayProcess) -> None:
    q = user_msg(unique("sampled"))
    assert ask(gw.base_url, "exact", q, temperature=1.0).cache == "miss"
    assert ask(gw.base_url, "exact", q, temperature=1.0).cache == "hit"  # one stored sample, replayed


# --- streaming replay -------------------------------------------------------------------------------


def test_a_cached_answer_replays_as_a_valid_stream_for_the_sdk(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    client = OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    q, user = user_msg(unique("Stream me")), user_id()
    plain = client.chat.completions.create(model="exact", messages=q, user=user)  # stored from JSON
    raw = client.chat.completions.with_raw_response.create(
        model="exact", messages=q, user=user, stream=True, stream_options={"include_usage": True})
    assert raw.headers["x-pointsman-cache"] == "hit"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == plain.usage.total_tokens  # type: ignore[union-attr]
    assert calls(upstream, "echo", user) == 1
    # Without include_usage: no usage chunk.
    again = list(client.chat.completions.create(model="exact", messages=q, user=user, stream=True))
    assert all(c.usage is None for c in again) and all(c.choices for c in again)


def test_a_complete_stream_is_stored_and_replayed_either_way(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    client = OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    q, user = user_msg(unique("Stored from a stream")), user_id()
    first = list(client.chat.completions.create(model="exact", messages=q, user=user, stream=True,
                                                stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in first if c.choices)

    def hit() -> bool:
        raw = client.chat.completions.with_raw_response.create(model="exact", messages=q, user=user)
        return raw.headers["x-pointsman-cache"] == "hit" and raw.parse().choices[0].message.content == streamed

    assert hit()
    replay = list(client.chat.completions.create(model="exact", messages=q, user=user, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in replay if c.choices) == streamed
    assert calls(upstream, "echo", user) == 1


# --- semantic ----------------------------------------------------------------------------------------


def test_semantic_near_duplicates_hit_and_others_miss(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    tag, user = time.time_ns(), user_id()
    system = {"role": "system", "content": f"FAQ bot {tag}"}
    first = ask(gw.base_url, "sem", [system, {"role": "user", "content": "What is the capital of France?"}], user=user)
    assert first.cache == "miss"
    near = ask(gw.base_url, "sem", [system, {"role": "user", "content": "what is the capital of france"}], user=user)
    assert near.cache == "hit" and near.text == first.text  # the stored answer, to the first wording
    cache = decision(gw, near.headers["x-pointsman-request-id"])["cache"]
    assert cache["match"] == "semantic" and 0.95 <= cache["similarity"] < 1.0
    far = ask(gw.base_url, "sem", [system, {"role": "user", "content": "Explain recursion to a child"}], user=user)
    assert far.cache == "miss"
    # Same words, another system prompt: another scope.
    other = ask(gw.base_url, "sem", [{"role": "system", "content": f"Other bot {tag}"},
                                      {"role": "user", "content": "what is the capital of france"}], user=user)
    assert other.cache == "miss"
    assert calls(upstream, "echo", user) == 3


def test_semantic_never_matches_other_numbers(gw: GatewayProcess) -> None:
    system = {"role": "system", "content": f"Calculator {time.time_ns()}"}
    assert ask(gw.base_url, "sem", [system, {"role": "user", "content": "what is 2+2?"}]).cache == "miss"
    # The static encoder scores these two 0.9999 alike; the numbers differ, so it is a miss.
    other = ask(gw.base_url, "sem", [system, {"role": "user", "content": "what is 2+3?"}])
    assert other.cache == "miss" and other.text == "ECHO: what is 2+3?"
    assert ask(gw.base_url, "sem", [system, {"role": "user", "content": "What is 2+2"}]).cache == "hit"


@pytest.mark.parametrize(("first", "others", "paraphrase"), [
    ("What is 12+4?", ["What is 12-4?", "What is 12*4?", "What is 12/4?", "What is 12^4?"], "what is 12 + 4"),
    ("Is 10 > 5?", ["Is 10 < 5?", "Is 10 >= 5?"], "is 10 > 5"),
    ("Is 7 prime?", ["Is -7 prime?"], "is 7 prime"),
    ("Convert 30 C to F", ["Convert 30 F to C"], "convert 30 c to f"),
    ("Which foods are safe for dogs?", ["Which foods are not safe for dogs?"], "which foods are safe for dogs"),
    ("Convert USD to EUR", ["Convert EUR to USD"], "convert usd to eur"),
    ("Convert 30 degrees C to F", ["Convert 30 degrees F to C"], "convert 30 degrees c to f"),
    ("What is two plus two?", ["What is two plus three?"], "what is two plus two"),
    ("What is 5 & 3?", ["What is 5 | 3?"], "what is 5 & 3"),
])
def test_semantic_never_answers_another_sign_unit_or_negation(
    gw: GatewayProcess, upstream: FakeUpstream, first: str, others: list[str], paraphrase: str,
) -> None:
    # The static encoder scores each of these 0.98-1.0 alike with the first: only the guard tells them apart.
    system, user = {"role": "system", "content": f"Calculator {time.time_ns()}"}, user_id()
    assert ask(gw.base_url, "sem-95", [system, {"role": "user", "content": first}], user=user).cache == "miss"
    for other in others:
        reply = ask(gw.base_url, "sem-95", [system, {"role": "user", "content": other}], user=user)
        assert (reply.cache, reply.text) == ("miss", f"ECHO: {other}")  # its own answer, from the model
    same = ask(gw.base_url, "sem-95", [system, {"role": "user", "content": paraphrase}], user=user)
    assert (same.cache, same.text) == ("hit", f"ECHO: {first}")  # the paraphrase still hits
    assert decision(gw, same.headers["x-pointsman-request-id"])["cache"]["match"] == "semantic"
    assert calls(upstream, "echo", user) == 1 + len(others)
    if "What is 12*4?" in others:  # one multiplication spelled another way is the same question
        times = ask(gw.base_url, "sem-95", [system, {"role": "user", "content": "What is 12 × 4?"}], user=user)
        assert (times.cache, times.text) == ("hit", "ECHO: What is 12*4?")


def test_a_scope_in_use_keeps_its_semantic_matches_while_other_scopes_come_and_go(
    gw: GatewayProcess, upstream: FakeUpstream,
) -> None:
    # max_entries 2: the least recently used entry goes, and with it its scope's semantic index; a scope
    # whose entry keeps being hit is the most recently used one and must keep being found by similarity.
    tag, user = time.time_ns(), user_id()

    def faq(bot: str, question: str) -> Any:
        return ask(gw.base_url, "sem-2", [{"role": "system", "content": f"{bot} bot {tag}"},
                                          {"role": "user", "content": question}], user=user)

    assert faq("Shop", "How do I reset my password?").cache == "miss"
    assert faq("Bank", "How do I open an account?").cache == "miss"
    assert faq("Shop", "how do i reset my password").cache == "hit"  # the shop's entry is the recent one now
    assert faq("Travel", "How do I book a flight?").cache == "miss"  # stored: the bank's entry goes
    again = faq("Shop", "how do I reset my password")
    assert (again.cache, again.text) == ("hit", "ECHO: How do I reset my password?")
    assert calls(upstream, "echo", user) == 3


def test_a_semantic_lookup_falls_through_an_evicted_best_match_to_the_next_one(
    gw: GatewayProcess, upstream: FakeUpstream,
) -> None:
    # Static encoder: "how can i reset my password" scores 0.947 with A and 0.880 with B (route similarity
    # 0.85), A and B 0.773 with each other, so both are stored. Once A's answer is evicted (max_entries 3),
    # A is still the best match in the scope's index, but B's answer must be served, not a miss.
    tag, user = time.time_ns(), user_id()

    def faq(question: str) -> Any:
        return ask(gw.base_url, "sem-3", [{"role": "system", "content": f"Help bot {tag}"},
                                          {"role": "user", "content": question}], user=user)

    assert faq("reset my password").cache == "miss"  # A
    assert faq("How can I change my password?").cache == "miss"  # B
    assert faq("Explain recursion to a child").cache == "miss"
    assert faq("What is the weather like today?").cache == "miss"  # the fourth answer: A's is evicted
    near = faq("how can i reset my password")
    assert (near.cache, near.text) == ("hit", "ECHO: How can I change my password?")
    assert decision(gw, near.headers["x-pointsman-request-id"])["cache"]["match"] == "semantic"
    assert calls(upstream, "echo", user) == 4


def test_identical_requests_in_flight_together_index_one_entry(gw: GatewayProcess, paired: PairedUpstream) -> None:
    # bucket_size 2: a scope's index holds its newest two answers. Two identical requests answered at once
    # used to add two copies, pushing the scope's other answer out of the index.
    system, pair = {"role": "system", "content": f"Bank bot {time.time_ns()}"}, f"pair-{user_id()}"
    assert ask(gw.base_url, "sem-pair", [system, {"role": "user", "content": "How do I open an account?"}],
               user=user_id()).cache == "miss"
    both = ask_together(gw.base_url, "sem-pair", [system, {"role": "user", "content": "Explain recursion"}],
                        user=pair)
    assert [r.cache for r in both] == ["miss", "miss"] and paired.counts[pair] == 2  # in flight together
    again = ask(gw.base_url, "sem-pair", [system, {"role": "user", "content": "how do i open an account"}],
                user=user_id())
    assert (again.cache, again.text) == ("hit", "ECHO: How do I open an account?")


def test_an_evicted_answer_leaves_the_scope_index_to_the_live_ones(gw: GatewayProcess, upstream: FakeUpstream) -> None:
    # max_entries 2, bucket_size 2: a scope's index holds its newest two items. An answer evicted from the
    # store must leave the index with it, or its dead item pushes the scope's live, hot answer out of reach.
    tag, user = time.time_ns(), user_id()

    def faq(bot: str, question: str) -> Any:
        return ask(gw.base_url, "sem-2x2", [{"role": "system", "content": f"{bot} bot {tag}"},
                                            {"role": "user", "content": question}], user=user)

    assert faq("Bank", "How do I open an account?").cache == "miss"  # the hot answer
    assert faq("Bank", "Explain recursion to a child").cache == "miss"
    assert faq("Bank", "how do i open an account").cache == "hit"
    assert faq("Shop", "How do I reset my password?").cache == "miss"  # evicts "Explain recursion ..."
    assert faq("Bank", "how do I open an account").cache == "hit"
    assert faq("Bank", "What is the weather like today?").cache == "miss"  # evicts the shop's answer
    again = faq("Bank", "How do i open an account")
    assert (again.cache, again.text) == ("hit", "ECHO: How do I open an account?")
    assert calls(upstream, "echo", user) == 4


def test_metrics_count_cache_results(gw: GatewayProcess) -> None:
    q = user_msg(unique("metrics"))
    ask(gw.base_url, "exact-b", q)
    ask(gw.base_url, "exact-b", q)
    text = httpx.get(f"{gw.url}/metrics").text
    assert 'pointsman_cache_requests_total{result="hit",route="exact-b"}' in text
    assert 'pointsman_cache_requests_total{result="miss",route="exact-b"}' in text
