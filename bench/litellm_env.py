"""LiteLLM's proxy as a comparison point: its own venv, a config aimed at the fake upstream, start/stop.

LiteLLM lives in ``.bench-venvs/litellm`` (gitignored), never in the project venv: it pins many
packages of its own. The venv is created on first use (``python -m venv`` + ``pip install
'litellm[proxy]' httptools``; a few minutes, once).

Settings chosen so the comparison is fair (LiteLLM's fastest sensible single-process setup):

* one uvicorn worker (``--num_workers 1``), pinned to the same core as Pointsman;
* uvicorn with uvloop (LiteLLM's default) and httptools (installed here so uvicorn does not fall
  back to the slower pure-Python h11 parser; Pointsman gets httptools from ``uvicorn[standard]``);
* no database, no callbacks, ``set_verbose: false``, ``LITELLM_LOG=ERROR``,
  ``turn_off_message_logging``, spend/error logs off, ``LITELLM_MODE=PRODUCTION`` (no .env
  loading), ``LITELLM_TELEMETRY_DISABLED=True``;
* no master key (no auth), like the Pointsman bench config (no API keys);
  ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no network fetch of the cost map; there is no internet);
* its default upstream transport (aiohttp in current releases).

Run directly to install and smoke-test: ``python bench/litellm_env.py [--port 4000 --upstream URL]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import _procs

VENV_DIR = _procs.REPO_ROOT / ".bench-venvs" / "litellm"
LITELLM_BIN = VENV_DIR / "bin" / "litellm"
PACKAGES = ("litellm[proxy]", "httptools")

LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",
    "LITELLM_TELEMETRY_DISABLED": "True",
    "NO_DOCS": "True",
    "NO_REDOC": "True",
    # No auth on either proxy: Pointsman's bench config has no API keys either. LiteLLM refuses to
    # start without a master key unless told this is deliberate.
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
}


def ensure_installed(log: bool = True) -> Path:
    """Create the LiteLLM venv if it is missing; return the ``litellm`` executable."""
    if LITELLM_BIN.exists():
        return LITELLM_BIN
    if log:
        print(f"[litellm] creating {VENV_DIR} (one-time install, a few minutes)", flush=True)
    VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV_DIR)], check=True)
    pip = VENV_DIR / "bin" / "pip"
    proc = subprocess.Popen(
        [str(pip), "install", "--progress-bar", "off", *PACKAGES],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        # pip is chatty; the Collecting/Installing lines are enough to show progress.
        if log and line.startswith(("Collecting", "Installing", "Successfully", "ERROR")):
            print(f"[litellm] {line.rstrip()[:150]}", flush=True)
    if proc.wait() != 0 or not LITELLM_BIN.exists():
        raise RuntimeError("pip install of litellm[proxy] failed; see the output above")
    return LITELLM_BIN


def write_config(path: Path, upstream_base_url: str, model: str = "fake-model") -> Path:
    """Write a LiteLLM proxy config routing ``model`` to ``openai/<model>`` at the fake upstream."""
    path.write_text(
        f"""model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream_base_url}
      api_key: sk-fake
litellm_settings:
  set_verbose: false
  drop_params: true
  turn_off_message_logging: true
  request_timeout: 600
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
"""
    )
    return path


def start(port: int, config_path: Path, log_path: Path, cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
    """Start ``litellm --config ... --port P`` with one worker (does not wait for readiness)."""
    exe = ensure_installed()
    cmd = [str(exe), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    return _procs.start(cmd, log_path, cpus=cpus, env=LITELLM_ENV, cwd=config_path.parent)


def wait_ready(
    proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout: float = 120.0, model: str = "fake-model"
) -> None:
    """Wait until a real chat completion goes through LiteLLM (its import alone takes seconds)."""
    _procs.wait_http(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        proc,
        timeout,
        body={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        log_path=log_path,
    )


def main() -> int:
    """Install if needed, then start LiteLLM against ``--upstream`` and send one request."""
    parser = argparse.ArgumentParser(description="install and smoke-test LiteLLM's proxy")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", default=None, help="OpenAI base URL, e.g. http://127.0.0.1:9001/v1")
    args = parser.parse_args()
    exe = ensure_installed()
    print(f"litellm at {exe}")
    if not args.upstream:
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="litellm-bench-") as tmp:
        port = args.port or _procs.free_port()
        config = write_config(Path(tmp) / "litellm.yaml", args.upstream)
        log = Path(tmp) / "litellm.log"
        proc = start(port, config, log)
        try:
            wait_ready(proc, port, log)
            print(f"LiteLLM ready on port {port}")
        finally:
            _procs.stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
