"""The upstream HTTP client and the one boundary where the HTTP client's exceptions are translated.

The client is the gateway's own keep-alive HTTP/1.1 client (:mod:`gateway.http1`), chosen by
measurement (``bench/upstream_client.py``): per proxied call it costs 15 us of CPU at c=16 where
aiohttp took 69 (httpx more, in pool bookkeeping). Timeouts are enforced here as deadlines the
gateway owns (connect, first byte and total as deadlines, idle per chunk), so every phase maps onto
one config knob.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Literal

from gateway import http1
from gateway.breaker import Outcome
from gateway.config import Timeouts

FailureKind = Literal[
    "connect", "connect_timeout", "first_byte_timeout", "status", "malformed", "reset", "idle_timeout",
    "total_timeout",
]

RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})

#: Default bound on a whole (unstreamed) upstream body (``server.max_response_bytes``): a large
#: embeddings answer is ~100 MB; an upstream sending more, or without end, would hold it all in memory.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024

#: Bytes of a health check's body read (and dropped) so its connection can be reused; a longer body
#: closes the connection instead (a model list is a few KiB).
DRAIN_BYTES = 1 << 16


class UpstreamFailure(Exception):
    """One failed upstream attempt, classified for the retry/fallback logic."""

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        status: int | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        retry_after: float | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message  # the gateway's own words: safe to show a client
        self.detail = detail  # the library's description (addresses, internals): for the log only
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether another attempt (same model or a fallback) may help."""
        if self.kind == "status":
            return self.status in RETRYABLE_STATUSES
        return True

    @property
    def outcome(self) -> Outcome:
        """What this failure says about the replica, for its breaker (:mod:`gateway.breaker`).

        A 5xx answer is an error answer (judged by rate: it may be the request's fault); 408 and
        429 are answers (the replica works); everything else means no usable answer arrived.
        """
        if self.kind == "status":
            return Outcome.ERROR_ANSWER if self.status is not None and self.status >= 500 else Outcome.ANSWER
        return Outcome.TRANSPORT


@dataclass(slots=True)
class UpstreamResponse:
    """An upstream response whose status and headers have arrived; the body is still unread."""

    raw: http1.Response
    started: float  # perf_counter when the request was sent
    deadline: float  # perf_counter by which the whole exchange must be over
    idle: float
    max_bytes: int = MAX_RESPONSE_BYTES  # a whole (unstreamed) body, decompressed

    @property
    def status(self) -> int:
        return self.raw.status

    @property
    def content_type(self) -> str:
        return self.raw.headers.get("content-type", "application/json")

    async def read_all(self) -> bytes:
        """The whole body, within the total deadline and :attr:`max_bytes` (decompressed: a gzip bomb
        stops there too); a longer body is a ``malformed`` failure and its connection is dropped."""
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(max(self.deadline - time.perf_counter(), 0.0)):
                while chunk := await self.raw.readany():
                    size += len(chunk)
                    if size > self.max_bytes:
                        self.close()
                        limit = f"{self.max_bytes} bytes (server.max_response_bytes)"
                        raise UpstreamFailure("malformed", f"upstream answer larger than {limit}")
                    parts.append(chunk)
                return b"".join(parts)
        except TimeoutError as exc:
            raise UpstreamFailure("total_timeout", "upstream did not finish the response in time") from exc
        except http1.ProtocolError as exc:
            raise UpstreamFailure("malformed", "the upstream's answer broke off as invalid HTTP",
                                  detail=_describe(exc)) from exc
        except http1.HttpClientError as exc:
            raise UpstreamFailure(
                "reset", "the upstream connection broke while the response was read", detail=_describe(exc)
            ) from exc

    async def next_chunk(self, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 - a deadline, not a cancel scope
        """The next bytes of a streamed body (b"" at the end), within idle and total deadlines."""
        remaining = self.deadline - time.perf_counter()
        own = self.idle if timeout is None else timeout
        wait = min(own, remaining)
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                return await self.raw.readany()
        except TimeoutError as exc:
            # Which limit applied is decided before the wait: the event loop may wake a hair before the
            # deadline, and a stream cut by the total timeout is not "stalled".
            if remaining <= own or time.perf_counter() >= self.deadline:
                raise UpstreamFailure("total_timeout", "upstream stream exceeded the total timeout") from exc
            if timeout is not None:
                raise UpstreamFailure("first_byte_timeout", "upstream sent no data in time") from exc
            raise UpstreamFailure("idle_timeout", f"upstream stream stalled for over {self.idle:g}s") from exc
        except http1.ProtocolError as exc:
            raise UpstreamFailure("malformed", "the upstream stream broke off as invalid HTTP",
                                  detail=_describe(exc)) from exc
        except http1.HttpClientError as exc:
            raise UpstreamFailure("reset", "the upstream stream broke", detail=_describe(exc)) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self.next_chunk():
            yield chunk

    def close(self) -> None:
        """Drop the connection (used on cancel/failure so the upstream stops generating), unless the
        whole answer is already in (then its connection was already reused)."""
        self.raw.close()

    def release(self) -> None:
        """Return a fully-read connection to the keep-alive pool."""
        self.raw.release()


class UpstreamClient:
    """A keep-alive HTTP client shared by all backends; created in the app's lifespan, never at import."""

    def __init__(self, max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self._pool: http1.Http1Pool | None = None
        self.max_response_bytes = max_response_bytes

    async def start(self) -> None:
        # Keeps no cookies (one client serves every tenant: a cookie set in answer to one request must
        # not go back with everyone else's), follows no redirects, reads no proxy from the environment.
        self._pool = http1.Http1Pool(keepalive=60.0)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> http1.Http1Pool:
        if self._pool is None:
            raise RuntimeError("UpstreamClient.start() has not been called")
        return self._pool

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> UpstreamResponse:
        """Send a request and wait for its status line and headers (connect + first-byte deadlines).

        A retryable HTTP status (429, 5xx) is read and raised as an :class:`UpstreamFailure`; any
        other status (2xx, 4xx) is returned for the caller to pass through.
        """
        started = time.perf_counter()
        deadline = started + timeouts.total
        try:
            async with asyncio.timeout(min(timeouts.first_byte, timeouts.total)):
                # Redirects are not followed: following one would re-send the body (the prompt) to
                # wherever the Location points, another origin included.
                raw = await self.pool.request("POST", url, headers, body, connect_timeout=timeouts.connect)
        except TimeoutError as exc:
            raise UpstreamFailure("first_byte_timeout", "upstream sent no response headers in time") from exc
        except http1.ConnectTimeout as exc:
            raise UpstreamFailure("connect_timeout", "timed out connecting to upstream") from exc
        except http1.ConnectError as exc:
            raise UpstreamFailure("connect", "could not connect to the upstream", detail=_describe(exc)) from exc
        except http1.ProtocolError as exc:
            raise UpstreamFailure("malformed", "the upstream's answer is not valid HTTP",
                                  detail=_describe(exc)) from exc
        except http1.HttpClientError as exc:
            raise UpstreamFailure(
                "reset", "the upstream connection failed before a response arrived", detail=_describe(exc)
            ) from exc
        except ValueError as exc:  # a header (an API key read with its newline) or URL that cannot be sent
            raise UpstreamFailure(
                "connect", "the request to the upstream could not be written (check the backend's base_url "
                "and key)", detail=_describe(exc),
            ) from exc
        response = UpstreamResponse(raw=raw, started=started, deadline=deadline, idle=timeouts.idle,
                                    max_bytes=self.max_response_bytes)
        if 300 <= raw.status < 400:
            response.close()
            raise UpstreamFailure(
                "status", f"upstream answered HTTP {raw.status}, a redirect, which the gateway does not follow "
                "(check the backend's base_url)", status=raw.status,
            )
        if raw.status in RETRYABLE_STATUSES:
            body_bytes = b""
            try:
                with contextlib.suppress(UpstreamFailure):
                    body_bytes = await response.read_all()
            finally:  # cancelled too (the client gone): nobody else holds this response to close it
                response.close()
            raise UpstreamFailure(
                "status",
                f"upstream answered HTTP {raw.status}",
                status=raw.status,
                body=body_bytes,
                content_type=response.content_type,
                retry_after=parse_retry_after(raw.headers.get("retry-after")),
            )
        return response

    async def get_status(self, url: str, headers: Mapping[str, str], timeout: float) -> int:  # noqa: ASYNC109
        """Status of a GET (health checks). Raises :class:`UpstreamFailure` on any transport error."""
        status, _ = await self.get(url, headers, timeout, max_bytes=0)
        return status

    async def get(
        self, url: str, headers: Mapping[str, str], timeout: float,  # noqa: ASYNC109 - a deadline
        max_bytes: int = 1 << 20,
    ) -> tuple[int, bytes]:
        """Status and (at most ``max_bytes`` of the) body of a GET: health checks, engine metrics.

        At most ``max_bytes`` (:data:`DRAIN_BYTES` when 0) are read: a longer body drops the
        connection instead of being read to the end, so a replica answering a probe with an endless
        or huge body costs neither memory nor the deadline. Raises :class:`UpstreamFailure` on any
        transport error."""
        limit = max_bytes or DRAIN_BYTES
        resp: http1.Response | None = None
        try:
            async with asyncio.timeout(timeout):
                resp = await self.pool.request("GET", url, headers)
                chunks: list[bytes] = []
                size = 0
                while chunk := await resp.readany():
                    size += len(chunk)
                    if max_bytes:
                        chunks.append(chunk)
                    if size >= limit:  # a runaway body: keep the head, drop the connection
                        break
                return resp.status, b"".join(chunks)[:max_bytes]
        except TimeoutError as exc:
            raise UpstreamFailure("first_byte_timeout", "health check timed out") from exc
        except (http1.HttpClientError, ValueError) as exc:
            raise UpstreamFailure("connect", "health check failed", detail=_describe(exc)) from exc
        finally:
            if resp is not None:
                resp.close()  # a no-op when it was read whole (the connection is reused)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent/invalid."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _describe(exc: BaseException) -> str:
    """The library's own account of a failure, for the log (never for a client)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
