"""The ``pointsman`` command line's own argument handling: what it refuses, with which message and exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent

CONFIG = {
    "backends": [{"name": "b", "base_url": "http://127.0.0.1:9/v1", "health": {"enabled": False}, "models": ["m"]}],
    "routes": [{"name": "auto", "model": "m"}],
}


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "store": {"path": str(tmp_path / "d.db")}}))
    # The timeout only stops a gateway that started serving instead of refusing its arguments.
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_a_port_outside_0_to_65535_is_a_usage_error_not_another_port(tmp_path: Path, port: str) -> None:
    # server.port is checked (0-65535) in a config file, but --port went around the check: 70000 served
    # on port 4464 (70000 - 65536) while uvicorn said "running on ...:70000", and -1 exited 3 with
    # "Servname not supported for ai_socktype".
    result = _serve(tmp_path, "--port", port)
    assert result.returncode == 2, result.stderr
    assert "--port" in result.stderr and "0 to 65535" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "running on" not in result.stderr
