"""Large text scans off the event loop: a small pool of worker processes.

Rule signals (PII, jailbreak, keyword lists, length) and PII redaction are regular-expression work
in Python. On a long request it takes seconds (a 7 MB body: ~1.5 s of PII detection, ~1 s of
redaction), and on the event loop that time is stolen from every other request in flight. A
thread does not help: ``re`` holds the GIL. So a request whose text is longer than
``inline_chars`` is scanned in one of ``workers`` separate processes, while the loop goes on
serving everyone else; shorter requests are scanned inline, where a round trip to a worker
(~0.3 ms, ~0.2 ms of the gateway's CPU) would cost more than the scan.

What crosses to a worker is the request's *bytes*, never the parsed body: pickling a 7 MB body and
pushing it through a pipe would hold the GIL in the executor's helper threads for tens of
milliseconds, in small slices that stall the loop as surely as the scan would. The bytes go
through a file in ``/dev/shm`` (memory), written and read by a thread, during which the GIL is
released; the worker parses them itself. A redaction comes back the same way, as the JSON bytes to
send upstream, with ``model`` first so the forwarder can put another model name in without
re-encoding (:func:`with_model_first`).

The workers run at a lower CPU priority than the gateway (``nice`` +10): when the machine is
busy, the big request waits, not the small ones. The queue is bounded (``queue_limit`` scans
waiting or running): beyond it :class:`ScanQueueFull` is raised, which the gateway answers with a
503 and ``Retry-After``, so a client sending many huge bodies cannot make everyone else's long
requests wait without bound. A worker that dies (killed, out of memory) is replaced, and the scan
is retried once on the new pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

import orjson

from classifiers.conversation import conversation_text
from classifiers.messages import iter_messages, text_chars
from classifiers.signals import Signal, SignalExtractor, redact_body

log = logging.getLogger("pointsman.offload")

T = TypeVar("T")

#: Texts up to this many characters are scanned on the event loop (a few ms at most).
DEFAULT_INLINE_CHARS = 4096
#: Scans waiting or running at once before new ones are refused.
DEFAULT_QUEUE_LIMIT = 64
#: How much lower than the gateway's the workers' CPU priority is.
WORKER_NICENESS = 10
#: Seconds one scan may take before its worker is stopped (a 7 MB body takes ~3 s).
DEFAULT_TIMEOUT = 60.0


class ScanUnavailable(Exception):
    """A long request's text could not be scanned; the gateway answers 503 (``code`` names why)."""

    code = "scan_unavailable"
    retry_after: int | None = None


class ScanQueueFull(ScanUnavailable):
    """Too many large scans are waiting already; the request should be retried shortly."""

    code = "scan_queue_full"
    retry_after = 1


class ScanTimeout(ScanUnavailable):
    """A scan ran past the pool's ``timeout``; its worker was stopped (the pool goes on)."""

    code = "scan_timeout"


def default_workers() -> int:
    """One worker on a machine with two cores or fewer (the gateway keeps one), else up to four."""
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else min(4, cores - 1)


def scan_size(body: Mapping[str, Any], stop_after: int) -> int:
    """What the rule scans of ``body`` read, in characters, counted until past ``stop_after``: its text
    (:func:`classifiers.messages.text_chars`), one for each message and content part (every scanner
    walks them, text or not: a part that is an image costs one, not its data), and the tool
    definitions as the length signal reads them (their strings, and one for each value)."""
    total = 0
    for _, _, message in iter_messages(body):
        content = message.get("content")
        total += 1 + (len(content) if type(content) is list or isinstance(content, tuple) else 0)
        if total > stop_after:
            return total
    for key in ("tools", "functions"):
        total = _value_size(body.get(key), total, stop_after)
        if total > stop_after:
            return total
    return total + text_chars(body, stop_after - total)


def _value_size(value: Any, total: int, stop_after: int) -> int:
    """``total`` plus the size of a JSON value (its strings' lengths and one per value), until past ``stop_after``."""
    stack = [value]
    while stack and total <= stop_after:
        item = stack.pop()
        total += 1
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def with_model_first(body: Mapping[str, Any]) -> bytes:
    """``body`` as JSON with its ``model`` field first, so that :func:`replace_model` can swap it."""
    if "model" not in body:
        return orjson.dumps(body)
    return orjson.dumps({"model": body["model"], **{k: v for k, v in body.items() if k != "model"}})


def replace_model(raw: bytes, old: str, new: str) -> bytes | None:
    """``raw`` (a JSON object that starts with its ``model`` field, as :func:`with_model_first` writes
    it) with ``model`` set to ``new``; None if ``raw`` does not start with the ``old`` model field
    (then the caller must re-encode the body)."""
    prefix = b'{"model":' + orjson.dumps(old)
    if not raw.startswith(prefix):
        return None
    return b'{"model":' + orjson.dumps(new) + raw[len(prefix) :]


class ScanPool:
    """Worker processes for text scans too long for the event loop.

    ``start()`` must be called (from the running loop) before use and ``close()`` at shutdown.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        inline_chars: int = DEFAULT_INLINE_CHARS,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.workers = workers or default_workers()
        self.inline_chars = inline_chars
        self.queue_limit = queue_limit
        self.timeout = timeout
        self._executor: ProcessPoolExecutor | None = None
        self._spool = _spool_dir()
        self.pending = 0  # scans waiting or running (read by /metrics)
        self.completed = 0
        self.refused = 0
        self.restarts = 0
        self.timeouts = 0

    def offloads(self, body: Mapping[str, Any]) -> bool:
        """Whether scanning ``body`` reads more than is scanned inline (:func:`scan_size`)."""
        return scan_size(body, self.inline_chars) > self.inline_chars

    async def start(self) -> None:
        """Start the workers and wait until each has imported the scanners (so no request pays it)."""
        self._executor = self._new_executor()
        loop = asyncio.get_running_loop()
        # One warm-up task per worker: the executor spawns a process for each one it cannot hand
        # to an idle worker, so all of them exist (and are warm) when this returns.
        await asyncio.gather(*(loop.run_in_executor(self._executor, _warm_up) for _ in range(self.workers)))
        log.info("text scans over %d characters run in %d worker process(es)", self.inline_chars, self.workers)

    async def extract(self, extractors: Sequence[SignalExtractor], raw: bytes) -> dict[str, Signal]:
        """Every extractor's signal for the JSON request body ``raw``, computed in a worker."""
        async with self._spooled(raw) as path:
            return await self._run(_extract_from_file, tuple(extractors), path)

    async def extract_and_render(
        self, extractors: Sequence[SignalExtractor], raw: bytes, max_chars: int
    ) -> tuple[dict[str, Signal], str]:
        """:meth:`extract`, and the request's :func:`~classifiers.conversation.conversation_text` for
        ``max_chars``, in one worker call: rendering walks every message (~0.25 s for 200,000 tiny ones)."""
        async with self._spooled(raw) as path:
            return await self._run(_extract_and_render_file, tuple(extractors), path, max_chars)

    async def call(self, fn: Callable[[bytes], T], raw: bytes) -> T:
        """``fn(raw)`` computed in a worker, for work on a large request's bytes other than a scan (the
        gateway's structural check of a body). ``fn`` is a module-level function (it crosses by name)
        whose result is small; the bytes cross as a scan's do, and the call counts in the same queue."""
        async with self._spooled(raw) as path:
            return await self._run(_call_on_file, fn, path)

    async def redact(self, raw: bytes, kinds: Sequence[str], drop: Sequence[str] = ()) -> bytes:
        """The JSON request body ``raw`` without its ``drop`` fields and with PII of ``kinds``
        redacted, as bytes with ``model`` first (:func:`with_model_first`), computed in a worker."""
        async with self._spooled(raw) as path:
            out = await self._run(_redact_file, path, tuple(kinds), tuple(drop))
        try:
            return await asyncio.to_thread(Path(out).read_bytes)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(out)

    async def close(self) -> None:
        """Stop the workers (running scans are abandoned: their requests are gone at shutdown)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)

    @contextlib.asynccontextmanager
    async def _spooled(self, raw: bytes) -> AsyncIterator[str]:
        """``raw`` in a file of the spool directory for as long as the block runs."""
        if self.pending >= self.queue_limit:
            self.refused += 1
            raise ScanQueueFull(f"{self.pending} large-request scans are already waiting")
        self.pending += 1
        path = ""
        try:
            path = await asyncio.to_thread(_spool, self._spool, raw)
            yield path
            self.completed += 1
        finally:
            self.pending -= 1
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        executor = self._executor
        if executor is None:
            raise RuntimeError("ScanPool.start() has not been called")
        try:
            return await self._run_once(executor, fn, *args)
        except BrokenProcessPool:
            # A worker died (killed, out of memory, or stopped for another scan's timeout): replace
            # the pool if no other scan has yet, and try this scan once more.
            self._replace_broken(executor)
            if self._executor is None:  # closed meanwhile: the gateway is shutting down
                raise ScanUnavailable("the text-scan pool is closed") from None
            return await self._run_once(self._executor, fn, *args)

    async def _run_once(self, executor: ProcessPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        try:
            return await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            # Regular expressions are linear here, but a scan that still runs this long must not
            # hold a worker forever: stop the workers (others' scans are retried on the new pool).
            self.timeouts += 1
            log.warning("a text scan ran over %gs; its worker was stopped", self.timeout)
            self._replace_broken(executor, terminate=True)
            raise ScanTimeout(f"the scan did not finish in {self.timeout:g}s") from None

    def _new_executor(self) -> ProcessPoolExecutor:
        # spawn, never fork: the gateway has threads (encoder workers, the executor's own), and a
        # forked child would inherit their locks in whatever state they were.
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(os.getpid(),),
        )

    def _replace_broken(self, broken: ProcessPoolExecutor, *, terminate: bool = False) -> None:
        """Put a new executor in place of ``broken``, once (concurrent scans see the same breakage)."""
        if broken is not self._executor or self._executor is None:
            return  # another scan has already replaced it
        self._executor = self._new_executor()
        self.restarts += 1
        if not terminate:
            log.warning("a text-scan worker process died; the pool was restarted")
        processes = list((getattr(broken, "_processes", None) or {}).values()) if terminate else []
        with contextlib.suppress(Exception):
            broken.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(Exception):
                process.kill()


async def redact(
    pool: ScanPool | None, body: Mapping[str, Any], raw: bytes, kinds: Iterable[str], drop: Sequence[str] = ()
) -> tuple[dict[str, Any], bytes]:
    """The request to send upstream once PII of ``kinds`` is redacted (and the ``drop`` fields
    removed): ``(body, bytes)``; every text is still redacted in full, as a redaction promises.

    A long request is redacted in a worker process and comes back as bytes, parsed here again: the
    body is what every later reader of the request gets (workflow sub-calls, the response cache,
    comparisons, shadow arms, captured text), so it must be the redacted one. The parse costs what
    parsing the request did (orjson: ~17 ms for 7.8 MB), next to the seconds of the worker's scan.
    The bytes have ``model`` first either way.
    """
    wanted = tuple(kinds)
    if pool is not None and pool.offloads(body):
        out = await pool.redact(raw, wanted, drop)
        return orjson.loads(out), out
    kept = {k: v for k, v in body.items() if k not in drop} if drop else body
    redacted = redact_body(kept, wanted)
    return redacted, with_model_first(redacted)


def _spool_dir() -> str:
    """Where request bytes are handed to workers: memory (``/dev/shm``) where there is one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def _spool(directory: str, raw: bytes) -> str:
    """``raw`` in a new file of ``directory``, else of the temporary directory (a container's
    ``/dev/shm`` is often only 64 MB: a full one must not fail the request)."""
    try:
        return _write_new(directory, raw)
    except OSError:
        fallback = tempfile.gettempdir()
        if os.path.abspath(fallback) == os.path.abspath(directory):
            raise
        return _write_new(fallback, raw)


def _write_new(directory: str, raw: bytes) -> str:
    fd, path = tempfile.mkstemp(prefix="pointsman-scan-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


# -- in the worker process -------------------------------------------------------------------------


def _extract_from_file(extractors: Sequence[SignalExtractor], path: str) -> dict[str, Signal]:
    body = orjson.loads(Path(path).read_bytes())
    return {extractor.name: extractor.extract(body) for extractor in extractors}


def _extract_and_render_file(
    extractors: Sequence[SignalExtractor], path: str, max_chars: int
) -> tuple[dict[str, Signal], str]:
    body = orjson.loads(Path(path).read_bytes())
    return {extractor.name: extractor.extract(body) for extractor in extractors}, conversation_text(body, max_chars)


def _call_on_file(fn: Callable[[bytes], T], path: str) -> T:
    return fn(Path(path).read_bytes())


def _redact_file(path: str, kinds: tuple[str, ...], drop: tuple[str, ...]) -> str:
    body = orjson.loads(Path(path).read_bytes())
    kept = {k: v for k, v in body.items() if k not in drop}
    return _spool(os.path.dirname(path), with_model_first(redact_body(kept, kinds)))


def _init_worker(parent_pid: int) -> None:
    # The gateway handles signals and shuts the pool down itself once it has drained: a Ctrl-C or a
    # SIGTERM sent to the whole process group (systemd does) must not kill workers mid-scan.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """On Linux, be killed when the gateway dies, however it dies: a worker ignores SIGTERM and SIGINT
    (above), so after a ``kill -9`` of the gateway it (and multiprocessing's resource tracker, which
    waits for it) lived on, re-parented to init, until someone found and killed it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the gateway died before the prctl: nobody would send the signal
        os._exit(1)


def _warm_up() -> int:
    return os.getpid()
