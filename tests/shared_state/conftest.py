"""Fixtures for the shared-state tests: a key prefix of the test's own on the shared Redis (removed
afterwards), and a private redis-server on a spare port that a test may stop."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fakes.upstream import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"pointsman-test-{uuid.uuid4().hex[:8]}:"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=name + "*"):
        client.delete(key)
    client.close()


class PrivateRedis:
    """A redis-server of the test's own (never the shared one on 6379), started and stopped by pid."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is required for this test")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()
