"""End to end: the embedded SmolLM2 server child, driven directly with the official ``openai`` SDK.

One real llama.cpp server per module; a second, short-lived one checks that ``stop()`` leaves no
process and no bound port behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from gateway.config import LocalModelConfig
from gateway.local_model import LocalModelError, LocalModelServer, smollm2_gguf_path

pytestmark = pytest.mark.e2e

# One thread: on a 2-core box a second llama.cpp thread contends with the test process itself.
CONFIG = LocalModelConfig(enabled=True, n_threads=1, startup_timeout=60)
MESSAGES = [{"role": "user", "content": "Name a colour of the sky."}]


STOCK_SCRIPT = """
import json, sys
from gateway._llama_child import _plain_cpu_buffers
_plain_cpu_buffers()  # as the child does: llama.cpp's repacked CPU buffers crash on some CPUs
from llama_cpp import Llama
from gateway.local_model import smollm2_gguf_path
args = json.loads(sys.argv[1])
stock = Llama(model_path=str(smollm2_gguf_path()), n_ctx=512, n_threads=1, logits_all=True, verbose=False)
out = stock.create_chat_completion(messages=args["messages"], max_tokens=args["max_tokens"], temperature=0,
                                   logprobs=True, top_logprobs=2)
print(json.dumps(out["choices"][0], default=float))
"""


def stock_completion(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """llama-cpp-python's stock ``logits_all`` chat completion (temperature 0, top 2 logprobs)."""
    done = subprocess.run(
        [sys.executable, "-c", STOCK_SCRIPT, json.dumps({"messages": messages, "max_tokens": max_tokens})],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    choice: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return choice


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[LocalModelServer]:
    local = LocalModelServer(CONFIG)
    await local.start()
    yield local
    await local.stop()


@pytest.fixture
async def client(server: LocalModelServer) -> AsyncIterator[AsyncOpenAI]:
    assert server.base_url is not None
    async with AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60) as sdk:
        yield sdk


def test_the_gguf_comes_from_the_installed_wheel() -> None:
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000


async def test_base_url_is_loopback_and_lists_the_model(server: LocalModelServer, client: AsyncOpenAI) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    ids = [model.id async for model in client.models.list()]
    assert ids == ["smollm2-135m"]


async def test_chat_completion(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=16, temperature=0
    )
    choice = completion.choices[0]
    assert choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert completion.model == "smollm2-135m"
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 16
    # The GGUF's chat template is applied and its end-of-turn token stops generation.
    assert "<|im_end|>" not in choice.message.content and "<|im_start|>" not in choice.message.content


async def test_streamed_chat_completion(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=16, temperature=0, stream=True
    )
    texts: list[str] = []
    finish_reasons: list[str] = []
    async for chunk in stream:
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            if choice.finish_reason:
                finish_reasons.append(choice.finish_reason)
    assert "".join(texts).strip()
    assert finish_reasons and finish_reasons[-1] in ("stop", "length")


async def test_logprobs_match_the_stock_full_logits_evaluation(client: AsyncOpenAI) -> None:
    """The child computes only each batch's last logits row; the numbers must be the stock ones."""
    completion = await client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    served = completion.choices[0].logprobs
    assert served is not None and served.content
    assert all(len(token.top_logprobs) == 2 for token in served.content)
    assert all(token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob for token in served.content)

    # The stock evaluation (logits of every prompt token, Llama.eval unpatched) in a fresh interpreter,
    # so a crash in llama.cpp fails this test instead of killing the test process.
    reference = stock_completion(MESSAGES, max_tokens=8)
    expected = reference["logprobs"]["content"]
    assert completion.choices[0].message.content == reference["message"]["content"]
    assert [t.token for t in served.content] == [t["token"] for t in expected]
    assert [t.logprob for t in served.content] == pytest.approx([float(t["logprob"]) for t in expected], abs=1e-3)


async def test_streamed_logprobs(client: AsyncOpenAI) -> None:
    # llama-cpp-python returns logprobs only when top_logprobs is given too (``logprobs=top_logprobs``).
    stream = await client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=8, temperature=0, stream=True, logprobs=True,
        top_logprobs=1,
    )
    logprobs = [
        token.logprob
        async for chunk in stream
        for choice in chunk.choices
        if choice.logprobs and choice.logprobs.content
        for token in choice.logprobs.content
    ]
    assert logprobs and all(value <= 0.0 for value in logprobs)


async def test_concurrent_streams_queue_instead_of_cutting_each_other_off(client: AsyncOpenAI) -> None:
    """The stock server ends a running stream when another request arrives; ours must not."""

    async def finish_reason(topic: str) -> str | None:
        stream = await client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": f"Write a long story about {topic}."}],
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        reason = None
        async for chunk in stream:
            for choice in chunk.choices:
                reason = choice.finish_reason or reason
        return reason

    reasons = await asyncio.gather(finish_reason("a cat"), finish_reason("a dog"))
    assert all(reason in ("stop", "length") for reason in reasons), reasons


async def test_embeddings_from_the_same_server(server: LocalModelServer, client: AsyncOpenAI) -> None:
    assert server.embedding_model_name == "smollm2-135m-embed"
    for model in (server.embedding_model_name, server.model_name):
        response = await client.embeddings.create(model=model, input=["the sky is blue", "soup recipe"])
        first, second = (item.embedding for item in response.data)
        assert len(first) == len(second) == 576
        assert first != second
    # Chat still works after the embedding pass reset the context.
    completion = await client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=4, temperature=0
    )
    assert completion.choices[0].message.content


async def test_stop_kills_the_child_and_frees_the_port() -> None:
    local = LocalModelServer(CONFIG)
    base_url = await local.start()
    pid, port = local.pid, local.port
    assert pid is not None and port is not None and base_url.endswith(f":{port}/v1")
    await local.stop()
    assert not local.running and local.base_url is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
    await local.stop()  # idempotent


async def test_a_child_that_dies_during_start_up_reports_its_output() -> None:
    # A 10M-token context needs ~230 GB of KV cache: llama.cpp fails to create it and the child exits.
    local = LocalModelServer(CONFIG.model_copy(update={"n_ctx": 10_000_000}))
    with pytest.raises(LocalModelError, match="exited with code") as failure:
        await local.start()
    assert "Failed to create llama_context" in str(failure.value)
    assert not local.running and local.pid is None


async def test_a_taken_port_is_reported_before_launching() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        local = LocalModelServer(CONFIG.model_copy(update={"port": port}))
        with pytest.raises(LocalModelError, match=f"local_model.port: 127.0.0.1:{port} is already in use"):
            await local.start()
        assert local.pid is None
