"""The embedded SmolLM2 child's life: restarted when it dies, bounded when it cannot come back, no files left.

Real llama.cpp children, started by :class:`LocalModelServer` in this process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.config import LocalModelConfig
from gateway.local_model import LocalModelServer

pytestmark = pytest.mark.e2e

CONFIG = LocalModelConfig(enabled=True, n_threads=1, startup_timeout=60)
HELLO = {"model": "smollm2-135m", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hello."}]}


async def until(check: Callable[[], object], what: str, within: float = 90.0) -> None:
    """Wait for ``check`` to hold (a generous deadline, not a timing claim)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {within}s: {what}")
        await asyncio.sleep(0.05)


def is_gone(pid: int) -> bool:
    """True once ``pid`` is no process at all (reaped, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


async def test_a_killed_child_is_restarted_on_the_same_port(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pointsman.local_model")
    # One failed start-up would be enough to give up; a child that came up and died is no failed start-up.
    local = LocalModelServer(CONFIG, restart_backoff=0.2, restart_attempts=1)
    base_url = await local.start()
    try:
        first = local.pid
        assert first is not None and local.restarts == 0
        os.kill(first, signal.SIGKILL)
        await until(lambda: local.restarts == 1, "a restart")
        assert local.running and local.pid != first
        assert local.base_url == base_url  # the URL the gateway's backend was configured with
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            assert local.stats_url is not None
            assert (await http.get(local.stats_url)).json()["generations_started"] == 0  # a fresh process
            response = await http.post("/chat/completions", json=HELLO)
        assert response.status_code == 200, response.text
        assert logged(caplog, "exited unexpectedly with code -9")
        assert logged(caplog, "restarted at " + base_url)

        # And again: a child that came up and died is always replaced (only failed start-ups are bounded).
        second = local.pid
        assert second is not None
        os.kill(second, signal.SIGKILL)
        await until(lambda: local.restarts == 2, "a second restart")
    finally:
        await local.stop()
    assert not local.running and is_gone(first)


async def test_restarts_are_bounded_when_the_child_cannot_come_back(caplog: pytest.LogCaptureFixture) -> None:
    """Its port taken by someone else: two attempts, each logged, then it gives up and stays down."""
    caplog.set_level(logging.INFO, logger="pointsman.local_model")
    local = LocalModelServer(CONFIG, restart_backoff=0.2, restart_attempts=2)
    await local.start()
    squatter = socket.socket()
    try:
        pid, port = local.pid, local.port
        assert pid is not None and port is not None
        os.kill(pid, signal.SIGKILL)
        await until(lambda: is_gone(pid) or not local.running, "the child's death")
        deadline = time.monotonic() + 30
        while True:  # the port frees as soon as the dead child's socket is closed
            try:
                squatter.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)
        squatter.listen()
        await until(lambda: logged(caplog, "giving up after 2 failed restart attempts"), "giving up")
        assert logged(caplog, "restart attempt 1 of 2 failed: its port is taken")
        assert logged(caplog, "restart attempt 2 of 2 failed: its port is taken")
        assert local.restarts == 0 and not local.running
    finally:
        squatter.close()
        await local.stop()
    assert local.pid is None


async def test_stop_during_a_restart_leaves_no_child() -> None:
    local = LocalModelServer(CONFIG, restart_backoff=0.05)
    await local.start()
    first = local.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    # The replacement is spawned and still loading the model when stop() comes.
    await until(lambda: local.pid not in (None, first), "the replacement child")
    replacement = local.pid
    assert replacement is not None
    await local.stop()
    assert is_gone(replacement) and local.restarts == 0 and local.base_url is None


async def test_stop_during_the_back_off_is_prompt() -> None:
    local = LocalModelServer(CONFIG, restart_backoff=600)
    await local.start()
    pid = local.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await until(lambda: not local.running, "the child's death")
    await asyncio.wait_for(local.stop(), 30)  # not the 600 s back-off
    assert is_gone(pid)


async def test_the_child_gets_its_settings_without_a_file() -> None:
    """Settings arrive on stdin: no settings file exists at any point, so none can be left behind."""
    local = LocalModelServer(CONFIG)
    start = asyncio.create_task(local.start())
    try:
        await until(lambda: local.pid is not None, "the child")
        pid = local.pid
        assert pid is not None
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")  # noqa: ASYNC240 - procfs, instant
        assert not any(b"config" in arg for arg in cmdline), cmdline
        assert await start == local.base_url
    finally:
        await local.stop()


@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_from_a_model_without_them_are_a_400(stream: bool) -> None:
    """``local_model.logprobs: false``: the stock server answered a logprob request with a 500."""
    async with LocalModelServer(CONFIG.model_copy(update={"logprobs": False}), embeddings=False) as local:
        assert local.base_url is not None
        async with httpx.AsyncClient(base_url=local.base_url, timeout=60) as http:
            response = await http.post(
                "/chat/completions", json={**HELLO, "logprobs": True, "top_logprobs": 2, "stream": stream}
            )
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "logprobs"
            assert (await http.post("/chat/completions", json=HELLO)).status_code == 200
