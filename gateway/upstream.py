"""The upstream HTTP client and the one boundary where aiohttp's exceptions are translated.

aiohttp was chosen over httpx by measurement (bench/upstream_client.py): with a large keep-alive pool
httpx spends most of its CPU in pool bookkeeping. Timeouts are enforced here as deadlines the
gateway owns (connect via the socket, first byte and total as deadlines, idle per chunk) rather than
aiohttp's per-request ``ClientTimeout`` defaults, so every phase maps onto one config knob.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Literal

import aiohttp

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

    raw: aiohttp.ClientResponse
    started: float  # perf_counter when the request was sent
    deadline: float  # perf_counter by which the whole exchange must be over
    idle: float
    max_bytes: int = MAX_RESPONSE_BYTES  # a whole (unstreamed) body, decompressed

    @property
    def status(self) -> int:
        return self.raw.status

    @property
    def content_type(self) -> str:
        return self.raw.headers.get("Content-Type", "application/json")

    async def read_all(self) -> bytes:
        """The whole body, within the total deadline and :attr:`max_bytes` (decompressed: a gzip bomb
        stops there too); a longer body is a ``malformed`` failure and its connection is dropped."""
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(max(self.deadline - time.perf_counter(), 0.0)):
                while chunk := await self.raw.content.readany():
                    size += len(chunk)
                    if size > self.max_bytes:
                        self.close()
                        limit = f"{self.max_bytes} bytes (server.max_response_bytes)"
                        raise UpstreamFailure("malformed", f"upstream answer larger than {limit}")
                    parts.append(chunk)
                return b"".join(parts)
        except TimeoutError as exc:
            raise UpstreamFailure("total_timeout", "upstream did not finish the response in time") from exc
        except aiohttp.ClientError as exc:
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
                return await self.raw.content.readany()
        except TimeoutError as exc:
            # Which limit applied is decided before the wait: the event loop may wake a hair before the
            # deadline, and a stream cut by the total timeout is not "stalled".
            if remaining <= own or time.perf_counter() >= self.deadline:
                raise UpstreamFailure("total_timeout", "upstream stream exceeded the total timeout") from exc
            if timeout is not None:
                raise UpstreamFailure("first_byte_timeout", "upstream sent no data in time") from exc
            raise UpstreamFailure("idle_timeout", f"upstream stream stalled for over {self.idle:g}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailure("reset", "the upstream stream broke", detail=_describe(exc)) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self.next_chunk():
            yield chunk

    def close(self) -> None:
        """Drop the connection (used on cancel/failure so the upstream stops generating)."""
        self.raw.close()

    def release(self) -> None:
        """Return a fully-read connection to the keep-alive pool."""
        self.raw.release()


class UpstreamClient:
    """A keep-alive HTTP client shared by all backends; created in the app's lifespan, never at import."""

    def __init__(self, max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.max_response_bytes = max_response_bytes

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
            # One session serves every client and tenant: a cookie an upstream set in answer to one
            # request must not go back with everyone else's.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() has not been called")
        return self._session

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
                # Redirects are not followed: aiohttp would re-send the body (the prompt) to wherever the
                # Location points, another origin included.
                raw = await self.session.post(url, data=body, headers=headers, timeout=_client_timeout(timeouts),
                                              allow_redirects=False)
        except TimeoutError as exc:
            raise UpstreamFailure("first_byte_timeout", "upstream sent no response headers in time") from exc
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamFailure("connect_timeout", "timed out connecting to upstream") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure("connect", "could not connect to the upstream", detail=_describe(exc)) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(
                "reset", "the upstream connection failed before a response arrived", detail=_describe(exc)
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
            with contextlib.suppress(UpstreamFailure):
                body_bytes = await response.read_all()
            response.close()
            raise UpstreamFailure(
                "status",
                f"upstream answered HTTP {raw.status}",
                status=raw.status,
                body=body_bytes,
                content_type=response.content_type,
                retry_after=parse_retry_after(raw.headers.get("Retry-After")),
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
        try:
            async with asyncio.timeout(timeout):
                async with self.session.get(url, headers=headers) as resp:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in resp.content.iter_chunked(65536):
                        size += len(chunk)
                        if max_bytes:
                            chunks.append(chunk)
                        if size >= limit:  # a runaway body: keep the head, drop the connection
                            resp.close()
                            break
                    return resp.status, b"".join(chunks)[:max_bytes]
        except TimeoutError as exc:
            raise UpstreamFailure("first_byte_timeout", "health check timed out") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailure("connect", "health check failed", detail=_describe(exc)) from exc


@functools.lru_cache(maxsize=256)
def _client_timeout(timeouts: Timeouts) -> aiohttp.ClientTimeout:
    # One per configured Timeouts (they are frozen, hashable config values), not one per request.
    return aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect)


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
