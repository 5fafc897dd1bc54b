"""Process helpers shared by the benchmark scripts: start pinned, wait until ready, measure CPU, stop.

Only the processes a benchmark starts itself are stopped, by their own pid (and their process group,
which each is given at start so a server's worker children go with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_model() -> str:
    """The CPU's model name (for result headers)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_count() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0))


def start(
    cmd: Sequence[str],
    log_path: Path,
    cpus: set[int] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own process group, stdout+stderr to ``log_path``, pinned to ``cpus``.

    Pinning happens in the child before exec (``preexec_fn``), so every thread and child process the
    server creates inherits the same cores. The benchmark's own SIGTERM then exits through its cleanup
    (:func:`exit_cleanly_on_sigterm`): the server's own session keeps it from the terminal's Ctrl-C, and
    nothing else would stop it.
    """
    exit_cleanly_on_sigterm()
    log = log_path.open("wb")
    full_env = {**os.environ, **(env or {})}

    def _pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    try:
        return subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_pin,
        )
    finally:
        log.close()  # the child holds its own descriptor


def exit_cleanly_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, a cancelled CI job, ``kill``) exit this process as Ctrl-C does, through its
    ``finally`` blocks, which stop the servers it started; by default it killed the benchmark at once and
    left them running, holding their ports. Only from the main thread, and only over the default action."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM the process group we started, SIGKILL it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def wait_http(
    url: str,
    proc: subprocess.Popen[bytes] | None,
    timeout: float,
    body: Mapping[str, object] | None = None,
    log_path: Path | None = None,
) -> None:
    """Poll ``url`` (GET, or POST of ``body`` as JSON) until it answers 200; raise with the log tail."""
    deadline = time.monotonic() + timeout
    last_error = "no attempt"
    data = json.dumps(body).encode() if body is not None else None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready" + _tail(log_path))
        request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                if resp.status == 200:
                    resp.read()
                    return
                last_error = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s ({last_error})" + _tail(log_path))


def _tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    text = log_path.read_text(errors="replace").splitlines()[-lines:]
    return "\n--- log tail ---\n" + "\n".join(text)


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of ``pid`` and its descendants (all threads included)."""
    total = 0
    for member in tree_pids(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / CLK_TCK
