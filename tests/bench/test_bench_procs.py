"""A benchmark stopped with SIGTERM (``timeout``, a CI job cancelled, ``kill``) stops the servers it
started: they run in sessions of their own, so nothing else would, and they held their ports and memory
after the benchmark was gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from pathlib import Path
from bench._procs import start, stop

server = start([sys.executable, "-c", "import time; time.sleep(120)"], Path(sys.argv[1]))
try:
    print(server.pid, flush=True)
    time.sleep(120)
finally:
    stop(server)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose but its table entry (its parent, the benchmark, exited).
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_a_benchmark_stopped_with_sigterm_stops_the_servers_it_started(tmp_path: Path) -> None:
    bench = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "server.log")], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    assert bench.stdout is not None
    server_pid = int(bench.stdout.readline())
    try:
        assert _alive(server_pid)
        bench.send_signal(signal.SIGTERM)
        bench.wait(20)
        deadline = time.monotonic() + 15
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server_pid), "the server outlived the benchmark that started it"
    finally:
        bench.kill()
        if _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
