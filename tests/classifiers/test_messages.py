"""The one walker over a request's messages: what counts as text, where it is, and copy-on-write rewrites."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from classifiers.messages import (
    SYSTEM_ROLES,
    TextPiece,
    content_texts,
    iter_message_texts,
    iter_messages,
    last_user_index,
    messages_of,
    rewrite_message_texts,
    text_chars,
    tool_calls_of,
)

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}


def conversation() -> dict[str, Any]:
    """Every place a chat request keeps text, plus parts and fields that are not text."""
    return {
        "model": "auto",
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "name": "jane", "content": [{"type": "text", "text": "What is this?"}, IMAGE, AUDIO]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q": "cat"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "noop", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "look", "content": "A cat."},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I won't say."}]},
            {"role": "assistant", "content": None, "function_call": {"name": "old", "arguments": '{"x": 1}'}},
            {"role": "user", "content": "And now?"},
        ],
    }


def pieces(body: dict[str, Any], **options: Any) -> list[tuple[int, str, str, int, str]]:
    return [(p.message, p.role, p.source, p.part, p.text) for p in iter_message_texts(body, **options)]


def test_every_text_with_where_it_is() -> None:
    assert pieces(conversation()) == [
        (0, "system", "content", -1, "Be brief."),
        (1, "developer", "content", 0, "Answer in French."),
        (2, "user", "content", 0, "What is this?"),  # the image and audio parts are not text
        (3, "assistant", "tool_call", 0, '{"q": "cat"}'),  # the empty arguments of c2 are skipped
        (4, "tool", "content", -1, "A cat."),
        # the refusal part (message 5) has no ``text``: a scanner does not read it
        (6, "assistant", "tool_call", -1, '{"x": 1}'),  # the legacy function_call
        (7, "user", "content", -1, "And now?"),
    ]


def test_roles_tool_calls_and_last_user_select() -> None:
    body = conversation()
    assert [p[0] for p in pieces(body, roles=SYSTEM_ROLES)] == [0, 1]
    assert [p[0] for p in pieces(body, roles={"assistant"})] == [3, 6]
    assert [p[0] for p in pieces(body, roles={"assistant"}, tool_calls=False)] == []
    assert pieces(body, last_user=True) == [(7, "user", "content", -1, "And now?")]
    body["messages"].pop()
    assert pieces(body, last_user=True) == [(2, "user", "content", 0, "What is this?")]
    with pytest.raises(ValueError, match="exclude"):
        pieces(body, last_user=True, roles={"user"})


def test_a_reader_sees_typed_text_refusals_and_markers() -> None:
    body = conversation()
    assert [p.text for p in iter_message_texts(body, roles={"user", "assistant"}, tool_calls=False, markers=True)] == [
        "What is this?", "[image]", "[audio]", "I won't say.", "And now?",
    ]
    parts = ["raw", {"text": "untyped"}, {"type": "output_text", "text": "typed"}, {"type": "text", "text": None},
             {"type": "video"}, {"type": "image_url", "text": "odd"}, 7, None, {"type": "text", "text": ""}]
    assert list(content_texts(parts)) == [(0, "raw"), (1, "untyped"), (2, "typed"), (5, "odd")]
    assert list(content_texts(parts, markers=True)) == [
        (0, "raw"), (2, "typed"), (3, "[text]"), (4, "[video]"), (5, "[image]"),
    ]
    assert list(content_texts({"not": "content"})) == []
    assert list(content_texts({"not": "content"}, markers=True)) == [(-1, "{'not': 'content'}")]
    assert list(content_texts(None, markers=True)) == [] and list(content_texts("")) == []


def test_legacy_prompt_is_the_users_turn() -> None:
    assert pieces({"prompt": "Once upon"}) == [(-1, "user", "prompt", -1, "Once upon")]
    assert pieces({"prompt": ["a", 5, "", "b"]}) == [(-1, "user", "prompt", 0, "a"), (-1, "user", "prompt", 3, "b")]
    assert pieces({"prompt": [101, 102]}) == []
    assert pieces({"prompt": "p"}, prompt=False) == []
    assert pieces({"prompt": "p"}, last_user=True) == [(-1, "user", "prompt", -1, "p")]  # no user message
    with_user = {"messages": [{"role": "user", "content": "u"}], "prompt": "p"}
    assert pieces(with_user, last_user=True) == [(0, "user", "content", -1, "u")]
    assert [p[2] for p in pieces(with_user)] == ["content", "prompt"]


def test_an_embeddings_input_is_the_prompt() -> None:
    assert pieces({"model": "e", "input": "a b"}) == [(-1, "user", "prompt", -1, "a b")]
    assert pieces({"model": "e", "input": ["a", [1, 2], "b"]}) == [(-1, "user", "prompt", 0, "a"),
                                                                  (-1, "user", "prompt", 2, "b")]
    body = {"model": "e", "input": ["a cat", "dog"]}
    new = rewrite_message_texts(body, lambda piece: piece.text.replace("cat", "[X]"))
    assert new == {"model": "e", "input": ["a [X]", "dog"]} and body["input"] == ["a cat", "dog"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": "hello"},
        {"messages": None, "prompt": None},
        {"messages": [None, 3, "text", ["list"]]},
        {"messages": [{"role": None, "content": 5}, {"content": [None, 3, {"type": "text", "text": 4}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [None, {"function": "x"}, {}], "function_call": "y"}]},
        {"messages": [{"role": "assistant", "tool_calls": "not a list", "function_call": {"arguments": 5}}]},
    ],
)
def test_garbage_carries_no_text_and_never_raises(body: dict[str, Any]) -> None:
    assert pieces(body) == []
    pieces(body, markers=True)  # a reader shows malformed content as it can (markers, str()), never raises
    assert text_chars(body) == 0
    assert rewrite_message_texts(body, lambda p: p.text.upper()) == body


def test_positions_count_every_entry_and_roles_are_strings() -> None:
    body = {"messages": ["junk", {"role": "user", "content": "u"}, None, {"content": "no role"}, {"role": 7}]}
    assert [(i, role) for i, role, _ in iter_messages(body)] == [(1, "user"), (3, ""), (4, "7")]
    assert [i for i, _, _ in iter_messages(body, {"user"})] == [1]
    assert pieces(body) == [(1, "user", "content", -1, "u"), (3, "", "content", -1, "no role")]
    assert len(messages_of(body)) == 3
    assert last_user_index(body) == 1 and last_user_index({"messages": [{"role": "system"}]}) == -1
    assert pieces({"messages": ({"role": "user", "content": "a tuple"},)}) == [(0, "user", "content", -1, "a tuple")]


def test_tool_calls_of_yields_each_function_then_the_legacy_one() -> None:
    message = {"tool_calls": [{"function": {"name": "a"}}, None, {"function": "x"}, {"function": {"name": "b"}}],
               "function_call": {"name": "old"}}
    assert [(k, f["name"]) for k, f in tool_calls_of(message)] == [(0, "a"), (3, "b"), (-1, "old")]


def test_text_chars_stops_once_past_the_bound() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 10}] * 5}
    assert text_chars(body) == 50
    assert text_chars(body, stop_after=15) == 20


def test_rewrite_is_copy_on_write() -> None:
    body = conversation()
    body["prompt"] = ["keep", "cat too"]
    original = copy.deepcopy(body)

    def cat_to_dog(piece: TextPiece) -> str:
        return piece.text.replace("cat", "dog").replace("What", "WHAT")

    new = rewrite_message_texts(body, cat_to_dog)
    assert body == original  # the input is never modified
    assert new is not body and new["messages"] is not body["messages"]
    old_msgs, new_msgs = body["messages"], new["messages"]
    # Untouched messages are the very same objects, not copies.
    for i in (0, 1, 5, 6, 7):
        assert new_msgs[i] is old_msgs[i]
    # A rewritten content part: new message, new list, new part; the other parts are shared.
    assert new_msgs[2]["content"][0] == {"type": "text", "text": "WHAT is this?"}
    assert new_msgs[2]["content"] is not old_msgs[2]["content"]
    assert new_msgs[2]["content"][1] is IMAGE and new_msgs[2]["content"][2] is AUDIO
    assert new_msgs[2]["name"] == "jane"
    # A rewritten tool call: only that call is new; the other call and the ids are kept.
    calls = new_msgs[3]["tool_calls"]
    assert calls[0] == {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q": "dog"}'}}
    assert calls[1] is old_msgs[3]["tool_calls"][1]
    # A rewritten string content (the tool result), and the legacy prompt list item.
    assert new_msgs[4] == {**old_msgs[4], "content": "A dog."}
    assert new["prompt"] == ["keep", "dog too"] and new["prompt"] is not body["prompt"]
    assert new["temperature"] == 0.2


def test_rewrite_of_nothing_shares_everything_and_options_limit_it() -> None:
    body = conversation()
    same = rewrite_message_texts(body, lambda piece: piece.text)
    assert same == body and same is not body and same["messages"] is body["messages"]

    upper = rewrite_message_texts(body, lambda piece: piece.text.upper(), roles={"user"}, tool_calls=False)
    assert [i for i, (a, b) in enumerate(zip(upper["messages"], body["messages"], strict=True)) if a is not b] == [2, 7]
    assert upper["messages"][7]["content"] == "AND NOW?"
    legacy = rewrite_message_texts(body, lambda piece: "{}" if piece.source == "tool_call" else piece.text)
    assert legacy["messages"][6]["function_call"] == {"name": "old", "arguments": "{}"}
    assert rewrite_message_texts({"prompt": "p"}, lambda p: "P")["prompt"] == "P"
    assert rewrite_message_texts({"prompt": "p"}, lambda p: "P", prompt=False)["prompt"] == "p"
