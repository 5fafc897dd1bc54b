"""The bounded conversation text that routing encodes: layout, truncation invariants, odd shapes."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import orjson
import pytest

from classifiers.conversation import ParsedBody, conversation_text
from classifiers.messages import rewrite_message_texts


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": list(messages), **extra}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_single_user_message_is_exactly_its_text() -> None:
    # Heads are trained on bare benchmark prompts; serving must produce the same text for the same prompt.
    prompt = "What is the derivative of x**2 * sin(x)?"
    assert conversation_text(chat(user(prompt))) == prompt


def test_completions_prompt_is_the_user_turn() -> None:
    assert conversation_text({"model": "auto", "prompt": "Once upon a time"}) == "Once upon a time"
    assert conversation_text({"prompt": ["first", "second"]}) == "first\nsecond"
    assert conversation_text({"prompt": [101, 2023, 102]}) == "[tokens]"


def test_multi_turn_with_tools_covers_every_part_with_the_last_user_turn_first() -> None:
    body = chat(
        {"role": "system", "content": "You are a travel assistant."},
        user("I am going to Lisbon next week."),
        assistant("Great choice! How can I help?"),
        user("What's the weather there right now?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Lisbon"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21C, sunny"},
        tools=[WEATHER_TOOL],
    )
    text = conversation_text(body)
    assert text.startswith("What's the weather there right now?\n\n")
    assert "[system] You are a travel assistant." in text
    history = text.split("[history]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert history == [
        "user: I am going to Lisbon next week.",
        "assistant: Great choice! How can I help?",
        'assistant: [call get_weather({"city":"Lisbon"})]',
        "tool: 21C, sunny",
    ]
    assert text.endswith("[tools] get_weather: Get the current weather for a city.")


def test_multi_part_content_keeps_text_and_marks_other_parts() -> None:
    body = chat(
        user(
            [
                {"type": "text", "text": "What breed is this dog?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ]
        )
    )
    text = conversation_text(body)
    assert text == "What breed is this dog?\n[image]\n[audio]"
    assert "base64" not in text


def test_developer_role_and_legacy_functions_are_understood() -> None:
    body = chat(
        {"role": "developer", "content": [{"type": "text", "text": "Answer in JSON."}]},
        user("List three primes."),
        functions=[{"name": "emit", "description": "Emit the answer."}],
    )
    text = conversation_text(body)
    assert "[system] Answer in JSON." in text
    assert text.endswith("[tools] emit: Emit the answer.")


def test_long_history_keeps_the_most_recent_turns_and_marks_the_rest() -> None:
    turns = [m for i in range(40) for m in (user(f"question {i}: " + "x" * 100), assistant(f"answer {i}"))]
    body = chat(*turns, user("final question"))
    text = conversation_text(body, max_chars=1000)
    assert len(text) <= 1000
    assert text.startswith("final question")
    assert "answer 39" in text and "question 39" in text
    assert "question 0:" not in text
    marker = next(line for line in text.splitlines() if line.startswith("[… "))
    dropped = int(marker.split()[1])
    kept = [line for line in text.split("[history]\n", 1)[1].splitlines()[1:] if line]
    assert dropped + len(kept) == 80  # every earlier message is either shown or counted


def test_a_long_last_user_turn_keeps_its_head_and_tail() -> None:
    document = "START " + "lorem ipsum " * 1000 + " Summarise the document above."
    text = conversation_text(chat({"role": "system", "content": "Be brief."}, user(document)), max_chars=2000)
    assert len(text) <= 2000
    assert text.startswith("START ")
    assert "Summarise the document above." in text
    assert "[…]" in text
    assert "[system] Be brief." in text  # the system prompt keeps its share


def _random_body(rng: random.Random) -> dict[str, Any]:
    def words(n: int) -> str:
        return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "ε", "🙂", "x" * 30]) for _ in range(n))

    messages: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": words(rng.randint(1, 400))})
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.4:
            messages.append(user(words(rng.randint(0, 300))))
        elif kind < 0.7:
            messages.append(assistant(words(rng.randint(0, 300))))
        elif kind < 0.85:
            call = {"type": "function", "function": {"name": "f", "arguments": json.dumps({"q": words(50)})}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": "c", "content": words(rng.randint(0, 200))})
    last = words(rng.randint(0, 600))
    messages.append(user([{"type": "text", "text": last}]) if rng.random() < 0.3 else user(last))
    tools = [WEATHER_TOOL] * rng.randint(0, 30)
    return {"messages": messages, "tools": tools} if tools else {"messages": messages}


@pytest.mark.parametrize("max_chars", [40, 200, 1000, 2000, 8000])
def test_bound_last_user_turn_and_determinism_hold_on_random_conversations(max_chars: int) -> None:
    rng = random.Random(max_chars)
    for _ in range(300):
        body = _random_body(rng)
        before = copy.deepcopy(body)
        text = conversation_text(body, max_chars=max_chars)
        assert len(text) <= max_chars
        assert body == before  # the request is not modified
        assert conversation_text(body, max_chars=max_chars) == text
        last = body["messages"][-1]["content"]
        last = last if isinstance(last, str) else last[0]["text"]
        if len(last) <= int(max_chars * 0.6) - 40:  # its guaranteed share, minus section headers
            assert text.startswith(last), "the last user turn must be kept in full within its share"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": None},
        {"messages": "not a list"},
        {"messages": [None, 3, {"role": "user"}]},
        {"messages": [{"role": "user", "content": 42}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [None, {"type": "web_search"}, {"function": {}}]},
    ],
)
def test_malformed_bodies_render_without_raising(body: dict[str, Any]) -> None:
    # Routing must not fail on shapes the gateway forwards; validation is not this function's job.
    assert len(conversation_text(body, max_chars=300)) <= 300


def test_zero_budget_is_empty() -> None:
    assert conversation_text(chat(user("anything")), max_chars=0) == ""


def test_a_parsed_request_is_rendered_once_per_budget_and_a_rewritten_copy_afresh() -> None:
    """Several readers of one request want its conversation text (the signal provider, conversation
    capture, workflow stages); rendering walks every message (~0.25 s for 200,000 tiny ones, on the event
    loop), so a parsed request keeps the text it was rendered to. A copy, such as a redaction's rewrite,
    is another conversation and is rendered from what it holds."""
    turns = [user("my card is 4111 1111 1111 1111") if i % 2 == 0 else assistant(f"noted {i}") for i in range(41)]
    body = ParsedBody(chat(*turns, user("and the total?")))
    first = conversation_text(body)
    assert conversation_text(body) is first, "the same request's text must not be rendered again"
    assert conversation_text(body, max_chars=500) is conversation_text(body, max_chars=500) != first
    assert first == conversation_text(dict(body)), "remembering must not change the text"
    redacted = rewrite_message_texts(body, lambda piece: piece.text.replace("4111 1111 1111 1111", "[CARD]"))
    assert "[CARD]" in conversation_text(redacted) and "4111" not in conversation_text(redacted)
    assert orjson.loads(orjson.dumps(body)) == body, "a parsed body encodes as the JSON object it is"
