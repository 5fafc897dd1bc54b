"""A hostile upstream's whole (unstreamed) answers, through a real gateway, read by the official SDK.

What reaches the client is the upstream's answer, an upstream's OpenAI-shaped 4xx, or the gateway's
own OpenAI-shaped error with the right status: never a body the SDK cannot read, a 500, or an
upstream's message about the gateway's own credentials.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.fakes.hostile import HostileUpstream, Script, answer, chunk_event, completion, head
from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

MESSAGES = [{"role": "user", "content": "hello"}]
LEAKY_401 = (b'{"error": {"message": "Incorrect API key provided: sk-upst****cret.", '
             b'"type": "invalid_request_error", "code": "invalid_api_key"}}')


async def _stream_with_odd_content_type(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    events = chunk_event("fine", "stop") + b"data: [DONE]\n\n"
    writer.write(head(content_type="text/event-stream; charset=\u20ac") + events)


async def _endless_json(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    # A 200 whose body never ends (no Content-Length; the connection stays open): the gateway held all of it.
    writer.write(head(200, "application/json") + b'{"id": "chatcmpl-h", "choices": [], "padding": "')
    for _ in range(4096):  # 256 MiB at most, in case the gateway never stops reading
        writer.write(b"x" * 65536)
        await writer.drain()


SCRIPTS: dict[str, Script] = {
    "good": answer(200, "application/json", completion("from the good one")),
    "unauthorized": answer(401, "application/json", LEAKY_401),
    "forbidden": answer(403, "text/plain", b"forbidden for key sk-upstream-secret"),
    "error-as-200": answer(200, "application/json", b'{"error": {"message": "overloaded", "type": "server_error"}}'),
    "no-content": answer(204, "application/json", b""),
    "html-404": answer(404, "text/html", b"<html><body><h1>404 Not Found</h1>nginx</body></html>"),
    "detail-422": answer(422, "application/json", b'{"detail": [{"loc": ["body", "x"], "msg": "bad"}]}'),
    "odd-content-type": answer(200, "application/json; charset=\u20ac", completion("odd header")),
    "odd-stream-content-type": _stream_with_odd_content_type,
    "sets-cookie": answer(200, "application/json", completion("with a cookie"),
                          extra=b"Set-Cookie: session=tenant-a; Path=/\r\n"),
    "endless-json": _endless_json,
    "redirects": answer(307, "text/plain", b"moved", extra=b"Location: /elsewhere/v1/chat/completions\r\n"),
}


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileUpstream]:
    upstream = HostileUpstream(SCRIPTS).start()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def gateway(hostile: HostileUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "backends": [
            {"name": "hostile", "base_url": hostile.base_url, "api_key": "sk-upstream-secret",
             "health": {"enabled": False},
             "models": [{"name": name, "upstream_name": name} for name in SCRIPTS if name != "good"]},
            {"name": "other", "base_url": hostile.base_url, "health": {"enabled": False},
             "models": [{"name": "good"}]},
        ],
        "routes": [{"name": "guarded", "model": "unauthorized", "fallbacks": ["good"]}],
        "retry": {"attempts": 3, "backoff_base": 0.01, "backoff_max": 0.02},
        "breaker": {"failure_threshold": 1000},  # the malformed answers must not eject the one replica
        "server": {"max_response_bytes": 1 << 20},
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("hostile-answers")).start()
    yield proc
    proc.terminate()


@pytest.fixture
def client(gateway: GatewayProcess) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-client", max_retries=0, timeout=30)


def _refused(client: OpenAI, model: str) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model=model, messages=MESSAGES)
    return info.value


@pytest.mark.parametrize("model", ["unauthorized", "forbidden"])
def test_an_upstream_refusing_the_gateways_key_is_a_502_that_quotes_nothing_of_it(
    client: OpenAI, gateway: GatewayProcess, hostile: HostileUpstream, model: str
) -> None:
    # It was passed on: the client read "Incorrect API key" about its own (valid) key, with part of
    # the backend's key in the message.
    before = hostile.requests[model]
    error = _refused(client, model)
    assert error.status_code == 502 and error.body["type"] == "upstream_error"  # type: ignore[index]
    assert "credentials" in error.message
    assert "sk-upst" not in error.response.text and "sk-upstream" not in error.response.text
    assert hostile.requests[model] == before + 1  # a refused key is not retried on the same backend
    assert "sk-upst" not in gateway.log()


def test_a_refused_key_falls_back_to_the_next_model(client: OpenAI, gateway: GatewayProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="guarded", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "from the good one"
    assert raw.headers["x-pointsman-model"] == "good"


@pytest.mark.parametrize("model", ["error-as-200", "no-content"])
def test_a_success_status_without_an_answer_is_a_502(client: OpenAI, gateway: GatewayProcess, model: str) -> None:
    # {"error": ...} with 200 reached the SDK as a completion with no choices (and was recorded ok);
    # a 204 as an empty body the SDK could not parse.
    error = _refused(client, model)
    assert error.status_code == 502 and error.body["code"] == "bad_gateway"  # type: ignore[index]
    record = gateway.decision(error.response.headers["x-pointsman-request-id"])
    assert record["outcome"] == "error" and record["status"] == 502 and record["attempts"] == 3


@pytest.mark.parametrize(("model", "status"), [("html-404", 404), ("detail-422", 422)])
def test_a_4xx_without_an_openai_error_keeps_its_status_in_openais_shape(
    client: OpenAI, gateway: GatewayProcess, model: str, status: int
) -> None:
    error = _refused(client, model)
    assert error.status_code == status
    assert error.response.headers["content-type"] == "application/json"
    assert error.body["code"] == f"upstream_{status}" and "no OpenAI error" in error.message  # type: ignore[index]
    assert gateway.decision(error.response.headers["x-pointsman-request-id"])["status"] == status


def test_an_upstream_content_type_that_is_no_header_value_is_not_a_500(
    client: OpenAI, gateway: GatewayProcess
) -> None:
    # Encoding it as a response header raised: a 500 whose request id matched no record.
    raw = client.chat.completions.with_raw_response.create(model="odd-content-type", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "odd header"
    assert gateway.decision(raw.headers["x-pointsman-request-id"])["outcome"] == "ok"
    with client.chat.completions.with_streaming_response.create(
        model="odd-stream-content-type", messages=MESSAGES, stream=True
    ) as response:
        assert response.headers["content-type"] == "text/event-stream"
        texts = [c.choices[0].delta.content for c in response.parse() if c.choices]
    assert texts == ["fine"]


def test_an_upstream_cookie_is_not_sent_back_with_other_clients_requests(
    hostile: HostileUpstream, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The shared upstream session kept a cookie jar: a cookie an upstream set in answer to one tenant's
    # request went back with every later request, whoever sent it (IP-address hosts excepted).
    config = {
        "backends": [{"name": "named", "base_url": hostile.base_url.replace("127.0.0.1", "localhost"),
                      "health": {"enabled": False}, "models": [{"name": "sets-cookie"}, {"name": "good"}]}],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("cookies")).start()
    try:
        client = OpenAI(base_url=proc.base_url, api_key="sk-client", max_retries=0, timeout=30)
        client.chat.completions.create(model="sets-cookie", messages=MESSAGES, user="tenant-a")
        seen = len(hostile.headers)
        client.chat.completions.create(model="good", messages=MESSAGES, user="tenant-b")
        assert b"session=tenant-a" not in b"".join(hostile.headers[seen:]).lower()
    finally:
        proc.terminate()


def test_a_redirect_is_not_followed_with_the_prompt(client: OpenAI, hostile: HostileUpstream) -> None:
    # aiohttp followed a 307 and re-sent the body (the prompt) to the Location, another origin included.
    before = hostile.requests["redirects"]
    error = _refused(client, "redirects")
    assert error.status_code == 502 and "redirect" in error.message and "base_url" in error.message
    assert hostile.requests["redirects"] == before + 1  # once: neither followed nor retried


def test_a_whole_answer_beyond_max_response_bytes_is_a_502_not_memory(
    client: OpenAI, hostile: HostileUpstream
) -> None:
    before = hostile.closed["endless-json"]
    error = _refused(client, "endless-json")
    assert error.status_code == 502 and "larger than 1048576 bytes" in error.message
    # Each attempt's connection dropped at the bound (the upstream notices the third a moment later).
    eventually(lambda: hostile.closed["endless-json"] == before + 3, "three upstream connections closed")
