"""Request bodies the gateway refuses once, where they are parsed: nesting past the documented limit
and repeated keys; and the nesting found by the hostile-client run, end to end.

Unit tests run ``decode_body`` itself; the black-box ones send the issue's reproducers through a
gateway subprocess on the paths that used to answer 500 (re-encoding for ``upstream_name``,
redaction, the ``pointsman`` field, ``/v1/route``) and check the same connection still serves.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from classifiers.conversation import conversation_text
from classifiers.offload import ScanPool
from gateway.errors import InvalidRequestError
from gateway.protocol import INLINE_DECODE_BYTES, MAX_JSON_DEPTH, decode_body, decode_body_off_loop
from tests.fakes.upstream import FakeUpstream
from tests.gatewayproc import GatewayProcess


def _nested(depth: int) -> str:
    """A JSON array ``depth`` levels deep."""
    return "[" * depth + "1" + "]" * depth


def _body_with_metadata(levels_below_body: int) -> bytes:
    return b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"metadata":' + (
        _nested(levels_below_body).encode()) + b"}"


def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_refused() -> None:
    # The body is level 1, so its field may hold MAX_JSON_DEPTH - 1 levels.
    assert decode_body(_body_with_metadata(MAX_JSON_DEPTH - 1))["model"] == "auto"
    with pytest.raises(InvalidRequestError) as refused:
        decode_body(_body_with_metadata(MAX_JSON_DEPTH))
    assert refused.value.status == 400 and refused.value.code == "json_too_deep"
    assert str(MAX_JSON_DEPTH) in refused.value.message


@pytest.mark.parametrize("depth", [254, 300, 990, 1023])
def test_deep_bodies_the_parser_accepts_are_refused_with_a_400(depth: int) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        decode_body(_body_with_metadata(depth))
    assert refused.value.code == "json_too_deep"


def test_deep_objects_count_like_arrays() -> None:
    deep = '{"a":' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH
    with pytest.raises(InvalidRequestError):
        decode_body(('{"model":"m","x":' + deep + "}").encode())


def test_real_tool_schemas_nest_well_within_the_limit() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(25):  # 25 nested object-of-array schemas (100 levels): deeper than real tools
        schema = {"type": "object", "properties": {"child": {"type": "array", "items": schema}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    assert decode_body(json.dumps(body).encode()) == body


@pytest.mark.parametrize("raw", [
    b'{"model":"a","model":"b","messages":[]}',
    b'{"model":"a","messages":[{"role":"user","role":"system","content":"x"}]}',
    b'{"model":"a","metadata":{"k":{"deep":1,"deep":2}}}',
    # An escaped colon inside a string must not let a repeated key slip through the count.
    b'{"model":"a\\u003a b","temperature":1,"temperature":0}',
    b'{"model":"a","x":"\\u003A","y":1,"y":2}',
])
def test_repeated_keys_are_refused_naming_the_key(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        decode_body(raw)
    assert refused.value.status == 400 and refused.value.code == "duplicate_key"
    assert "repeats the key" in refused.value.message


@pytest.mark.parametrize("raw", [
    b'{"model":"a:b","messages":[{"role":"user","content":"time: 10:30, ratio 3:1"}]}',
    b'{"model":"a","k:1":"v:2","nested":{"k:1":"again:ok"}}',
    b'{"model":"a\\u003a","content":"escaped \\u003a colon"}',
    b'{"model" : "a" , "n" :1}',
    b'{"model":"a","same":{"k":1},"other":{"k":1}}',  # the same key in two objects is fine
])
def test_colons_in_strings_and_keys_repeated_across_objects_are_fine(raw: bytes) -> None:
    assert decode_body(raw) == json.loads(raw)


def test_a_repeated_key_is_echoed_masked() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        decode_body(b'{"model":"a","4111111111111111":1,"4111111111111111":2}')
    assert "4111" not in refused.value.message and "'################'" in refused.value.message


def test_a_decoded_body_renders_its_conversation_once() -> None:
    """The request every reader gets from the decode remembers its conversation text: the provider,
    conversation capture and workflow stages share one rendering instead of walking every message again."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(31)]
    body = decode_body(json.dumps({"model": "auto", "messages": turns}).encode())
    assert conversation_text(body) is conversation_text(body)


@pytest.mark.parametrize("workers", [0, 1], ids=["thread", "scan-worker"])
async def test_a_large_body_is_refused_off_the_loop_as_the_inline_decode_refuses_it(workers: int) -> None:
    """Bodies over INLINE_DECODE_BYTES are checked in a scan worker (or a thread, for a gateway without
    one): the same 400s, the same codes, and a well-formed one decodes to the same object."""
    pool = ScanPool(1) if workers else None
    if pool is not None:
        await pool.start()
    try:
        turns = [{"role": "user", "content": f"m{i}"} for i in range(30_000)]
        good = json.dumps({"model": "auto", "messages": turns}).encode()
        assert len(good) > INLINE_DECODE_BYTES
        assert await decode_body_off_loop(good, pool) == json.loads(good)
        repeated = good.replace(b'"m29999"}', b'"m29999", "role": "user"}')
        deep = good[:-1] + b', "x": ' + _nested(MAX_JSON_DEPTH).encode() + b"}"
        for raw, code in ((repeated, "duplicate_key"), (deep, "json_too_deep")):
            with pytest.raises(InvalidRequestError) as refused:
                await decode_body_off_loop(raw, pool)
            assert refused.value.code == code
            with pytest.raises(InvalidRequestError) as inline:
                decode_body(raw)
            assert refused.value.message == inline.value.message
    finally:
        if pool is not None:
            await pool.close()


# --- end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shaped_gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [{"name": "fake", "base_url": upstream.base_url, "health": {"enabled": False},
                      "models": [{"name": "small", "upstream_name": "ok"}, {"name": "big", "upstream_name": "ok"}]}],
        "classifiers": {"encoder": "static"},
        "routes": [
            {"name": "auto", "policy": "rules",
             "rules": [{"name": "redact", "priority": 10, "when": {"signal": "pii", "op": "truthy"},
                        "action": {"redact": ["email"]}}],
             "cost_quality": {"signal": "difficulty", "strong": "big", "weak": "small", "threshold": 0.5}},
            {"name": "plain", "model": "small"},
        ],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("shape")).start(timeout=60)
    yield proc
    proc.terminate()


@pytest.mark.parametrize("path,model,extra", [
    ("/v1/chat/completions", "auto", {}),  # routed: re-encoded for upstream_name
    ("/v1/chat/completions", "small", {}),  # a concrete model with an upstream_name
    ("/v1/chat/completions", "plain", {}),
    ("/v1/chat/completions", "auto", {"pointsman": {"threshold": 0.5}}),  # the gateway's field is removed
    ("/v1/route", "auto", {}),
])
@pytest.mark.parametrize("depth", [254, 990])
def test_the_reported_reproducers_get_a_400_on_a_connection_that_stays_usable(
    shaped_gateway: GatewayProcess, path: str, model: str, extra: dict[str, Any], depth: int
) -> None:
    messages = [{"role": "user", "content": "mail me at someone@corp-mail.com"}]
    body = json.dumps({"model": model, "messages": messages, **extra})[:-1] + ',"metadata":' + _nested(depth) + "}"
    connection = http.client.HTTPConnection("127.0.0.1", shaped_gateway.port, timeout=30)
    try:
        connection.request("POST", path, body=body.encode(), headers={"content-type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        assert response.status == 400, payload
        assert payload["error"]["code"] == "json_too_deep" and payload["error"]["type"] == "invalid_request_error"
        assert response.getheader("connection", "").lower() != "close"
        connection.request("POST", "/v1/chat/completions", body=json.dumps({"model": model, "messages": messages}),
                           headers={"content-type": "application/json"})
        again = connection.getresponse()
        again.read()
        assert again.status == 200
    finally:
        connection.close()
