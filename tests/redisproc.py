"""A redis-server of a test's own on a spare port (never the shared one on 6379), without persistence:
for tests that stop, restart or freeze Redis under a running gateway."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.fakes.upstream import free_port


class PrivateRedis:
    """Started and stopped by pid; :meth:`pause` freezes it (SIGSTOP) to play a Redis that hangs."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        """Start (again, on the same port: an empty Redis) and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is required for this test (Debian package redis-server)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError("private redis-server did not start")

    def pause(self) -> None:
        """Freeze the server: connections stay open, calls hang until :meth:`resume`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None
