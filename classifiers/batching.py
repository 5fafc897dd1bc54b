"""Async front of an encoder: content-hash LRU cache plus micro-batching on one worker thread.

Concurrent requests share forward passes: while the worker thread encodes one batch, new misses queue
up, and the next batch takes all of them (up to ``max_batch``) in one ``encode`` call. There is no
fixed wait window, so a lone request is encoded at once (no added latency at concurrency 1) and
batches grow exactly as fast as load does. The event loop only hashes, looks up and awaits; all model
work happens on the worker thread.

Encoders that encode every text alone (:class:`~classifiers.encoders.base.ConcurrentEncoder`: the
per-text MiniLM runtimes) gain nothing from a batch, only a barrier: every caller of a batch waited
for its slowest text, and the encoder sat idle while the event loop finished those requests and
started the next ones. For them the front streams instead: each miss goes straight to one of the
encoder's ``workers`` threads, and its caller resumes as soon as its own pass ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from classifiers.encoders.base import ConcurrentEncoder, Encoder

DEFAULT_CACHE_SIZE = 10_000
DEFAULT_MAX_BATCH = 32


@dataclass(frozen=True)
class BatchingStats:
    """Counters since start: cache ``hits`` and ``misses``, ``batches`` run and texts ``encoded`` by them."""

    hits: int
    misses: int
    batches: int
    encoded: int

    @property
    def mean_batch_size(self) -> float:
        """Texts per ``encode`` call (0.0 before the first batch)."""
        return self.encoded / self.batches if self.batches else 0.0

    def as_dict(self) -> dict[str, float]:
        """The counters plus ``mean_batch_size``, for /metrics and logs."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "batches": self.batches,
            "encoded": self.encoded,
            "mean_batch_size": self.mean_batch_size,
        }


class BatchingEncoder:
    """Wraps an :class:`Encoder` for use from asyncio code.

    Args:
        encoder: The synchronous encoder; it is only ever called from this object's single worker thread,
            or, when ``inline``, from the event loop's thread.
        cache_size: Entries in the LRU cache keyed by sha256 of the text (0 disables caching).
        max_batch: Most texts per ``encode`` call.
        inline: Encode misses right away on the calling (event-loop) thread, one text per call, with no
            worker thread: for encoders so cheap that the thread hop costs as much as the work. Default:
            the encoder's ``cheap`` attribute (True for the static encoder).
        stream: Hand each miss to its own worker thread (``encoder.workers`` of them) as it arrives and
            resolve it when its pass ends, with no batches. Default: whether the encoder is a
            :class:`~classifiers.encoders.base.ConcurrentEncoder` (the per-text MiniLM runtimes);
            ``max_batch`` does not apply then.

    Use ``start()`` before the first ``encode`` (``encode`` also starts it lazily) and ``await close()``
    at shutdown; or ``async with BatchingEncoder(enc) as batcher``. Returned vectors are read-only views
    shared with the cache: copy before modifying.
    """

    def __init__(
        self,
        encoder: Encoder,
        cache_size: int = DEFAULT_CACHE_SIZE,
        max_batch: int = DEFAULT_MAX_BATCH,
        inline: bool | None = None,
        stream: bool | None = None,
    ) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.encoder = encoder
        # Encoders cheaper than the hop to a worker thread and back (the static one: ~0.2 ms a text vs
        # ~0.1-0.4 ms for the hop, which also adds jitter) run on the caller's thread instead.
        self.inline = bool(getattr(encoder, "cheap", False)) if inline is None else inline
        self.stream = (not self.inline and isinstance(encoder, ConcurrentEncoder)) if stream is None else stream
        if self.stream and not isinstance(encoder, ConcurrentEncoder):
            raise ValueError(f"encoder {encoder.id} cannot stream: it has no encode_one/workers")
        if self.stream and self.inline:
            raise ValueError("inline and stream exclude each other")
        self.cache_size = cache_size
        self.max_batch = max_batch
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        # Misses waiting for a batch, and every in-flight key so identical concurrent texts share one slot.
        self._queue: OrderedDict[bytes, str] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[np.ndarray]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        self._hits = 0
        self._misses = 0
        self._batches = 0
        self._encoded = 0

    @property
    def id(self) -> str:
        """The wrapped encoder's id."""
        return self.encoder.id

    @property
    def dim(self) -> int:
        """The wrapped encoder's vector size."""
        return self.encoder.dim

    def start(self) -> None:
        """Create the worker thread. Idempotent; raises after ``close()``."""
        if self._closed:
            raise RuntimeError("BatchingEncoder is closed")
        if self._executor is None:
            workers = max(1, self.encoder.workers) if isinstance(self.encoder, ConcurrentEncoder) and self.stream else 1
            self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"encoder-{self.encoder.id}")

    async def close(self) -> None:
        """Finish queued and running batches, then stop the worker thread. Idempotent."""
        self._closed = True
        if self._drainer is not None and not self._drainer.done():
            await asyncio.shield(self._drainer)
        if self._pending:  # streamed passes still running: let them finish and answer their callers
            await asyncio.gather(*(asyncio.shield(f) for f in list(self._pending.values())), return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        close_encoder = getattr(self.encoder, "close", None)
        if callable(close_encoder):  # encoders with worker threads of their own (MiniLM on ONNX Runtime)
            close_encoder()

    async def __aenter__(self) -> BatchingEncoder:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def stats(self) -> BatchingStats:
        """A snapshot of the counters."""
        return BatchingStats(self._hits, self._misses, self._batches, self._encoded)

    async def encode(self, text: str) -> np.ndarray:
        """The unit vector for ``text`` (float32, shape ``(dim,)``), from the cache or the next batch.

        Raises whatever the encoder raised for the batch this text was in (nothing is cached then).
        Cancelling one caller does not cancel the shared batch or other callers of the same text.
        """
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self._hits += 1
            return cached
        self._misses += 1
        if self.inline:
            if self._closed:
                raise RuntimeError("BatchingEncoder is closed")
            vectors = self.encoder.encode([text])
            if vectors.shape != (1, self.encoder.dim):
                raise ValueError(f"encoder {self.encoder.id} returned shape {vectors.shape} for 1 text")
            vector = vectors[0].copy()
            vector.flags.writeable = False
            self._batches += 1
            self._encoded += 1
            self._remember(key, vector)
            return vector
        future = self._pending.get(key)
        if future is None:
            if self._closed:
                raise RuntimeError("BatchingEncoder is closed")
            self.start()
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            solo = not self._pending  # nothing else in flight
            self._pending[key] = future
            if self.stream:
                self._submit_one(loop, key, text, solo)
            else:
                self._queue[key] = text
                if self._drainer is None or self._drainer.done():
                    self._drainer = asyncio.create_task(self._drain(), name=f"encoder-{self.encoder.id}-drain")
        return await asyncio.shield(future)

    def _submit_one(self, loop: asyncio.AbstractEventLoop, key: bytes, text: str, solo: bool) -> None:
        """Start one streamed pass on a worker thread; its result comes back through ``_finish_one``."""
        assert self._executor is not None
        encoder: ConcurrentEncoder = self.encoder  # type: ignore[assignment]  # checked in __init__

        def deliver(done: Future[np.ndarray]) -> None:  # runs on the worker thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to answer
                loop.call_soon_threadsafe(self._finish_one, key, done)

        self._executor.submit(encoder.encode_one, text, solo).add_done_callback(deliver)

    def _finish_one(self, key: bytes, done: Future[np.ndarray]) -> None:
        future = self._pending.pop(key, None)
        exc = done.exception()
        if exc is None:
            vector = np.asarray(done.result(), dtype=np.float32)
            if vector.shape != (self.encoder.dim,):
                exc = ValueError(f"encoder {self.encoder.id} returned shape {vector.shape} for 1 text")
        if exc is not None:
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        vector = vector.copy()
        vector.flags.writeable = False
        self._batches += 1
        self._encoded += 1
        self._remember(key, vector)
        if future is not None and not future.done():
            future.set_result(vector)

    async def _drain(self) -> None:
        """Run batches on the worker thread until the queue is empty."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch: list[tuple[bytes, str]] = []
                while self._queue and len(batch) < self.max_batch:
                    batch.append(self._queue.popitem(last=False))
                texts = [text for _, text in batch]
                try:
                    vectors = await loop.run_in_executor(self._executor, self.encoder.encode, texts)
                    if vectors.shape != (len(texts), self.encoder.dim):
                        raise ValueError(
                            f"encoder {self.encoder.id} returned shape {vectors.shape} for {len(texts)} texts"
                        )
                except Exception as exc:
                    # Delivered to every caller waiting on this batch; the next batch still runs.
                    self._fail([key for key, _ in batch], exc)
                    continue
                self._batches += 1
                self._encoded += len(texts)
                for row, (key, _) in enumerate(batch):
                    # A copy per row: a view would pin the whole batch array for as long as any row is cached.
                    vector = vectors[row].copy()
                    vector.flags.writeable = False
                    self._remember(key, vector)
                    future = self._pending.pop(key)
                    if not future.done():
                        future.set_result(vector)
        except BaseException as exc:
            # Cancelled (loop shutdown): nobody may be left waiting forever on a batch that will never run.
            self._fail(list(self._pending), RuntimeError(f"encoder {self.encoder.id} batching stopped: {exc!r}"))
            self._queue.clear()
            raise

    def _fail(self, keys: list[bytes], exc: BaseException) -> None:
        for key in keys:
            future = self._pending.pop(key, None)
            if future is not None and not future.done():
                future.set_exception(exc)

    def _remember(self, key: bytes, vector: np.ndarray) -> None:
        if self.cache_size == 0:
            return
        self._cache[key] = vector
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
