"""Run the real gateway as a subprocess (``python -m gateway.cli serve``), as a user would."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.fakes.upstream import free_port

REPO = Path(__file__).resolve().parent.parent


class GatewayProcess:
    """A gateway subprocess on a free loopback port with its own config and SQLite decision log."""

    def __init__(
        self, config: dict[str, Any] | None, workdir: Path, *, env: dict[str, str] | None = None
    ) -> None:
        """``config=None`` runs the embedded default (``pointsman serve`` with no config file)."""
        self.port = free_port()
        self.workdir = workdir
        self.config_path: Path | None = None
        if config is None:
            self.db_path = workdir / "pointsman.db"  # the embedded default's store, relative to cwd
        else:
            self.db_path = workdir / "decisions.db"
            config = {**config}
            config.setdefault("server", {})
            config["server"] = {"host": "127.0.0.1", "port": self.port, **config["server"]}
            config.setdefault("store", {"kind": "sqlite", "path": str(self.db_path), "flush_interval": 0.05})
            self.config_path = workdir / "config.yaml"
            self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "gateway.log"
        self._env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        log = self.log_path.open("ab")
        command = [sys.executable, "-m", "gateway.cli", "serve"]
        if self.config_path is not None:
            command += ["--config", str(self.config_path)]
        else:
            command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            command, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=self._env
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"gateway did not become healthy in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def decision(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The decision record for ``request_id``, waiting for the batch writer to flush it."""
        deadline = time.monotonic() + timeout
        while True:
            row = self._query("SELECT * FROM decisions WHERE request_id = ?", (request_id,))
            if row:
                return row[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no decision record for {request_id} after {timeout}s")
            time.sleep(0.05)

    def decisions(self) -> list[dict[str, Any]]:
        return self._query("SELECT * FROM decisions ORDER BY created_at", ())

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        if not self.db_path.exists():
            return []
        con = sqlite3.connect(self.db_path)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(sql, params)]
        except sqlite3.OperationalError:
            return []
        finally:
            con.close()
