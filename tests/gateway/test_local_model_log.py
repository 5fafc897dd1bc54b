"""The embedded model child's output never carries a request into the gateway's log: llama.cpp prints
a grammar it cannot parse (a client's ``grammar`` field) to stderr, which the gateway logged at DEBUG
and replayed in its crash report whatever ``logging.include_prompts`` said."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.gatewayproc import GatewayProcess
from tests.polling import eventually

pytestmark = pytest.mark.e2e

CANARY = "GRAMMARCANARYq7w"


def test_child_output_quoting_a_request_stays_out_of_the_log(tmp_path: Path) -> None:
    config = {
        "logging": {"format": "json", "level": "debug"},
        "local_model": {"enabled": True, "n_threads": 1, "startup_timeout": 60},
        "routes": [{"name": "auto", "model": "smollm2-135m"}],
    }
    gateway = GatewayProcess(config, tmp_path).start(timeout=180)
    try:
        refused = httpx.post(f"{gateway.base_url}/chat/completions", timeout=60, json={
            "model": "smollm2-135m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "grammar": f'root ::= ( "{CANARY}"',
        })
        assert refused.status_code == 400, refused.text
        [pid] = re.findall(r"ready at \S+ \(pid (\d+)\)", gateway.log())
        os.kill(int(pid), signal.SIGKILL)  # the crash report replays the child's last output
        eventually(lambda: "exited unexpectedly" in gateway.log(), "the crash report", timeout=30)
    finally:
        assert gateway.terminate() == 0
    text = gateway.log()
    assert CANARY not in text
    [report] = [json.loads(line) for line in text.splitlines() if "exited unexpectedly" in line]
    assert "withheld" in report["message"]
