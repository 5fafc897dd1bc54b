"""Client API keys and request-size limits, black-box through a gateway subprocess."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from gateway.auth import hash_key
from tests.fakes.upstream import WORDS, FakeUpstream
from tests.gatewayproc import GatewayProcess

KEYS = {"team-a": "sk-team-a-0123456789", "team-b": "sk-team-b-9876543210"}
NON_ASCII_KEY = ("équipe-c", "sk-clé-secrète-42")  # a key the SDK cannot send (httpx sends str headers as ASCII)
MAX_BODY = 2048
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "server": {"max_body_bytes": MAX_BODY},
        "auth": {"api_keys": [{"name": name, "sha256": hash_key(key)}
                              for name, key in [*KEYS.items(), NON_ASCII_KEY]]},
        "backends": [{
            "name": "fake",
            "base_url": upstream.base_url,
            "health": {"enabled": False},
            "models": [{"name": "fake-ok", "upstream_name": "ok"}],
        }],
        "routes": [{"name": "auto", "model": "fake-ok"}],
    }
    proc = GatewayProcess(config, tmp_path_factory.mktemp("gw-auth")).start()
    yield proc
    proc.terminate()


def _client(gateway: GatewayProcess, key: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)


def _assert_openai_error(response: httpx.Response, status: int, error_type: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["type"] == error_type and error["message"]
    return error


# --- API keys ----------------------------------------------------------------------------------


def test_no_key_is_401_in_openai_shape(gateway: GatewayProcess) -> None:
    client = _client(gateway, "unused")
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(
            model="auto", messages=MESSAGES, extra_headers={"Authorization": openai.Omit()}
        )
    assert info.value.status_code == 401
    assert info.value.body["type"] == "authentication_error"  # type: ignore[index]
    response = httpx.post(f"{gateway.base_url}/chat/completions", json={"model": "auto", "messages": MESSAGES})
    _assert_openai_error(response, 401, "authentication_error")
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["status"] == 401 and record["tenant"] is None and record["attempts"] == 0


@pytest.mark.parametrize("authorization", [
    "Bearer sk-wrong", "Bearer", "bearer sk-wrong", "Basic c2stdGVhbS1h", KEYS["team-a"], f"Bearer {KEYS['team-a']}x",
])
def test_wrong_or_malformed_key_is_401(gateway: GatewayProcess, authorization: str) -> None:
    response = httpx.post(f"{gateway.base_url}/chat/completions", headers={"Authorization": authorization},
                          json={"model": "auto", "messages": MESSAGES})
    _assert_openai_error(response, 401, "authentication_error")


def test_wrong_key_through_the_sdk(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.AuthenticationError):
        _client(gateway, "sk-not-a-key").chat.completions.create(model="auto", messages=MESSAGES)


@pytest.mark.parametrize("tenant", sorted(KEYS))
def test_right_key_is_served_and_recorded_as_its_tenant(gateway: GatewayProcess, tenant: str) -> None:
    raw = _client(gateway, KEYS[tenant]).chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    assert raw.status_code == 200
    assert raw.parse().choices[0].message.content == "".join(WORDS)
    record = gateway.decision(raw.headers["x-pointsman-request-id"])
    assert record["tenant"] == tenant and record["status"] == 200


def test_a_key_with_non_ascii_characters_is_accepted_as_the_bytes_the_client_sent(gateway: GatewayProcess) -> None:
    """hash-key digests the key's UTF-8; a client sends those bytes in its header. The gateway read the
    header as latin-1 and hashed that text as UTF-8 again, so such a key could never authenticate."""
    tenant, key = NON_ASCII_KEY
    body = {"model": "auto", "messages": MESSAGES}
    ok = httpx.post(f"{gateway.base_url}/chat/completions", json=body,
                    headers={"Authorization": b"Bearer " + key.encode("utf-8")}, timeout=30)
    assert ok.status_code == 200, ok.text
    assert gateway.decision(ok.headers["x-pointsman-request-id"])["tenant"] == tenant
    wrong = httpx.post(f"{gateway.base_url}/chat/completions", json=body,
                       headers={"Authorization": b"Bearer " + key.encode("latin-1")}, timeout=30)
    _assert_openai_error(wrong, 401, "authentication_error")


def test_streamed_request_is_recorded_with_its_tenant(gateway: GatewayProcess) -> None:
    client = _client(gateway, KEYS["team-b"])
    with client.chat.completions.with_streaming_response.create(
        model="auto", messages=MESSAGES, stream=True
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        chunks: list[ChatCompletionChunk] = list(response.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(WORDS)
    assert gateway.decision(request_id)["tenant"] == "team-b"


def test_models_list_needs_the_key(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.AuthenticationError):
        _client(gateway, "sk-not-a-key").models.list()
    _assert_openai_error(httpx.get(f"{gateway.base_url}/models"), 401, "authentication_error")
    ids = {m.id for m in _client(gateway, KEYS["team-a"]).models.list()}
    assert {"fake-ok", "auto"} <= ids
    _assert_openai_error(httpx.get(f"{gateway.base_url}/models/fake-ok"), 401, "authentication_error")
    assert _client(gateway, KEYS["team-a"]).models.retrieve("fake-ok").id == "fake-ok"


def test_health_and_ready_need_no_key(gateway: GatewayProcess) -> None:
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    assert httpx.get(f"{gateway.url}/ready").status_code == 200


# --- body size limit ---------------------------------------------------------------------------


def _oversized_body() -> bytes:
    return b'{"model": "auto", "messages": [{"role": "user", "content": "' + b"x" * (MAX_BODY * 2) + b'"}]}'


def test_body_over_limit_with_content_length_is_413(gateway: GatewayProcess) -> None:
    client = _client(gateway, KEYS["team-a"])
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x" * MAX_BODY * 2}])
    assert info.value.status_code == 413
    assert info.value.body["code"] == "request_too_large"  # type: ignore[index]
    response = httpx.post(f"{gateway.base_url}/chat/completions", content=_oversized_body(),
                          headers={"Authorization": f"Bearer {KEYS['team-a']}", "Content-Type": "application/json"})
    error = _assert_openai_error(response, 413, "invalid_request_error")
    assert error["code"] == "request_too_large" and str(MAX_BODY) in str(error["message"])
    record = gateway.decision(response.headers["x-pointsman-request-id"])
    assert record["status"] == 413 and record["attempts"] == 0 and record["tenant"] == "team-a"


def test_body_over_limit_with_chunked_transfer_is_413(gateway: GatewayProcess) -> None:
    body = _oversized_body()

    def chunks() -> Iterator[bytes]:  # a generator body: no Content-Length, Transfer-Encoding: chunked
        for start in range(0, len(body), 1024):
            yield body[start:start + 1024]

    with httpx.Client(timeout=10) as client:
        request = client.build_request(
            "POST", f"{gateway.base_url}/chat/completions", content=chunks(),
            headers={"Authorization": f"Bearer {KEYS['team-a']}", "Content-Type": "application/json"},
        )
        assert request.headers.get("transfer-encoding") == "chunked" and "content-length" not in request.headers
        response = client.send(request)
    error = _assert_openai_error(response, 413, "invalid_request_error")
    assert error["code"] == "request_too_large"


def test_body_under_limit_is_served_and_gateway_keeps_serving_after_413s(gateway: GatewayProcess) -> None:
    headers = {"Authorization": f"Bearer {KEYS['team-a']}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=10) as client:
        for _ in range(3):
            assert client.post("/chat/completions", content=_oversized_body()).status_code == 413
            content = "y" * (MAX_BODY - 200)  # the whole JSON body stays just under the limit
            response = client.post("/chat/completions", json={"model": "auto",
                                                               "messages": [{"role": "user", "content": content}]})
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"] == "".join(WORDS)


def test_limit_is_checked_after_auth(gateway: GatewayProcess) -> None:
    # An unauthenticated client learns nothing about limits: it gets 401, not 413.
    response = httpx.post(f"{gateway.base_url}/chat/completions", content=_oversized_body())
    _assert_openai_error(response, 401, "authentication_error")
