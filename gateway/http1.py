"""A lean HTTP/1.1 client: keep-alive connections on asyncio protocols, responses parsed by httptools.

The gateway's upstream calls are one shape: a POST (or a health check's GET) to a configured base
URL, an answer read whole or streamed, the connection reused. aiohttp's ``ClientSession`` spent
~190 us of CPU on each such call (URL building, header multidicts, payload registry, cookie filtering,
tracing hooks, a timer context, a task per body write): about half of the gateway's own CPU per
proxied request (``bench/upstream_client.py``). This client does the same exchange with a request
head written in one ``write`` and a C parser (``httptools``, which uvicorn's front already uses).

What it does: HTTP and HTTPS (system trust store, SNI), keep-alive pooling per origin (the most
recently used connection first; idle ones closed after ``keepalive`` seconds), ``Content-Length``,
chunked and close-delimited bodies, ``gzip`` / ``deflate`` decoded as read (bounded per read, so a
compression bomb costs what the reader asks for), informational (1xx) answers skipped, flow control
(reading pauses while more than :data:`HIGH_WATER` bytes wait unread). An idle connection the upstream
has closed (its keep-alive timeout: 5 s for uvicorn, which vLLM serves with) is not reused once the close
is in its socket, and a request that crossed such a close on the wire, closed before a byte of answer,
is sent once more on a new connection. What it leaves out on purpose: redirects, cookies, proxies from
the environment, ``Expect: 100-continue`` and pipelining.

Errors are this module's own (:class:`HttpClientError` and its subclasses); :mod:`gateway.upstream`
translates them, and timeouts, into the gateway's failure kinds.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import re
import select
import ssl
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httptools

#: Unread body bytes at which a connection stops reading from its socket (resumes below a quarter).
HIGH_WATER = 1 << 16
#: The largest response head (status line and headers) read; a larger one is a protocol error.
MAX_HEAD_BYTES = 1 << 16
#: Most bytes one read of a compressed body decodes to.
DECODE_CHUNK = 1 << 16

_UNSENDABLE = re.compile("[\r\n\0]")
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_GZIP_MAGIC = b"\x1f\x8b"
_DEFLATE_WBITS = 32 + zlib.MAX_WBITS  # a zlib or a gzip header, detected


class HttpClientError(Exception):
    """A failed exchange (base of this module's errors)."""


class ConnectError(HttpClientError):
    """The connection could not be made (refused, no route, name not resolved, TLS handshake failed)."""


class ConnectTimeout(HttpClientError):
    """The connection was not made within its deadline."""


class ConnectionClosed(HttpClientError):
    """The peer closed or reset the connection before the answer was complete."""


class ProtocolError(HttpClientError):
    """The peer's answer is not valid HTTP/1.1 (or uses an encoding this client cannot decode)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a URL's requests go, and the request target to write."""

    scheme: str
    host: str
    port: int
    host_header: str

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


@functools.lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, str, str | None]:
    """The origin, the request target (path and query) and the ``Authorization`` value of the URL's
    credentials (``http://user:password@host/``: HTTP basic; None without) of an ``http(s)://`` URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {without_credentials(url, '***@')!r}")
    default = 443 if scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target for c in " \r\n\0"):
        raise ValueError(f"URL path has a character a request line cannot carry: {without_credentials(url, '***@')!r}")
    authorization = None
    if parts.username is not None:
        userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(userinfo.encode()).decode("ascii")
    return Origin(scheme, host, port, host_header), target, authorization


def without_credentials(url: str, mark: str = "") -> str:
    """``url`` without the ``user:password@`` it may carry (HTTP basic auth to the replica), ``mark``
    (e.g. ``"***@"``) in its place: the URL is shown on ``/metrics``, in decision records, logs, traces,
    peers' hints and error messages, its password nowhere."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=mark + parts.netloc.rsplit("@", 1)[1]))


class Response:
    """One answer: status and headers have arrived; the body is read with :meth:`readany`.

    ``headers`` maps lower-case names to values (the last of repeated names). Once the whole body has
    been received the connection goes back to its pool (or is closed), whether or not the body has
    been read; :meth:`close` before that drops the connection.
    """

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_decoder",
        "_done",
        "_error",
        "_head",
        "_loop",
        "_waiter",
        "_wbits",
        "headers",
        "status",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._loop = loop
        self._conn: _Connection | None = conn
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: HttpClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._wbits = 0  # zlib's window bits for a gzip/deflate body, 0 for an unencoded one
        self._decoder: Any = None  # its zlib decompress object, made with the first piece of the body
        self._head: asyncio.Future[None] = loop.create_future()

    @property
    def complete(self) -> bool:
        """Whether the whole body has been received (it may still be unread)."""
        return self._done

    async def readany(self) -> bytes:
        """The next bytes of the body (decoded), b"" at its end. Raises :class:`ConnectionClosed` or
        :class:`ProtocolError` when the answer breaks off."""
        while True:
            if self._chunks:
                out = self._take()
                if out:
                    return out
                continue  # a compressed piece that decoded to nothing yet (a header): read on
            if self._error is not None:
                raise self._error
            if self._done:
                return self._flush()
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        """Drop the connection unless the whole answer has already been received."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.abort()

    def release(self) -> None:
        """Done with the answer: its connection is reused if the body was received whole, else dropped."""
        self.close()

    # -- fed by the connection ----------------------------------------------------------------

    def _take(self) -> bytes:
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        conn = self._conn
        if conn is not None and conn.paused and self._buffered <= HIGH_WATER // 4:
            conn.resume()
        if not self._wbits:
            return chunk
        decoder = self._decoder
        if decoder is None:
            wbits = self._wbits
            if wbits == _DEFLATE_WBITS and chunk[0] & 0x0F != 8 and chunk[0] != _GZIP_MAGIC[0]:
                # "deflate" sent as the bare deflate stream, without the zlib header it should have
                # (a zlib header's first byte names method 8): read as aiohttp reads it.
                wbits = -zlib.MAX_WBITS
            decoder = self._decoder = zlib.decompressobj(wbits)
        try:
            out = decoder.decompress(chunk, DECODE_CHUNK)
        except zlib.error as exc:
            self._fail_decode(exc)
            raise self._error from exc  # type: ignore[misc]
        # Decoded output was capped: the rest is read next time. Not once the stream has ended: what
        # followed its end is in unused_data, and CPython may leave it in unconsumed_tail as well; an
        # ended decoder consumes nothing, so feeding that tail again would spin here forever.
        if decoder.unconsumed_tail and not decoder.eof:
            tail = decoder.unconsumed_tail
            self._chunks.appendleft(tail)
            self._buffered += len(tail)
        elif decoder.eof and self._wbits == _GZIP_WBITS:
            rest = decoder.unused_data
            if rest and _GZIP_MAGIC.startswith(rest[:2]):
                # Another gzip member follows (RFC 1952: a gzip stream is one or more members, as a
                # server compressing piece by piece sends): each is decoded in turn. Other bytes after
                # the end (a padding newline or zeros) are no member and are dropped.
                self._decoder = zlib.decompressobj(_GZIP_WBITS)
                self._chunks.appendleft(rest)
                self._buffered += len(rest)
        return out

    def _flush(self) -> bytes:
        decoder, self._decoder = self._decoder, None
        if decoder is None:  # unencoded, or an empty body labelled with an encoding (a 204, a length 0)
            return b""
        try:
            rest: bytes = decoder.flush()
        except zlib.error as exc:
            self._fail_decode(exc)
            raise self._error from exc  # type: ignore[misc]
        if not decoder.eof:
            self._error = ProtocolError("the compressed answer ended before its end marker")
            raise self._error
        return rest

    def _fail_decode(self, exc: zlib.error) -> None:
        self._error = ProtocolError(f"the answer's content-encoding could not be decoded: {exc}")
        self._chunks.clear()
        self.close()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._conn = None
        self._wake()

    def _fail(self, error: HttpClientError) -> None:
        if self._done or self._error is not None:
            return
        self._error = error
        self._conn = None
        if not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: a request abandoned before its head arrived is no "never retrieved"
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time."""

    def __init__(self, pool: Http1Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self._head_bytes = 0
        self._in_head = False  # a request is out and its answer's head is not complete yet
        self._head_read = 0  # bytes read since that head began
        self._headers: dict[str, str] = {}
        self._informational = False
        self._until_close = False  # the body ends when the connection does (no length, not chunked)
        self._broken = False  # bytes arrived that belong to no request: never reuse

    # -- used by the pool ---------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> Response:
        assert self.transport is not None
        response = self.response = Response(self.pool.loop, self)
        self._begin()
        if body and len(body) < 16384:
            self.transport.write(head + body)  # one segment for a small request
        else:
            self.transport.write(head)
            if body:
                self.transport.write(body)
        return response

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        """Drop the connection now (the peer sees a reset or FIN; no reuse)."""
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()

    @property
    def reusable(self) -> bool:
        return not self.closed and not self._broken and self.response is None

    @property
    def answered_nothing(self) -> bool:
        """No byte of an answer to the latest request arrived (its head had begun: nothing read yet)."""
        return self._in_head and self._head_read == 0

    def peer_went_away(self) -> bool:
        """Whether the idle socket has something to read: the peer's close (or stray bytes) not seen yet.

        An upstream closes a connection it kept idle past its own keep-alive timeout (uvicorn, which
        vLLM serves with, after 5 s). The FIN can be in the socket before this loop has run
        ``connection_lost``: reusing the connection then fails the request with a reset. An idle
        connection has no answer to wait for, so anything readable means it must not be reused
        (urllib3 checks the same way before reusing a pooled connection).
        """
        if self.transport is None:
            return True
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            readable, _, _ = select.select((sock.fileno(),), (), (), 0)
        except (OSError, ValueError):  # closed under us
            return True
        return bool(readable)

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            # Bytes while no request is out: an answer to nothing. Never reuse this connection.
            self._broken = True
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._protocol_error("the upstream switched protocols")
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            message = str(cause) if isinstance(cause, ProtocolError) else "the upstream's answer is not valid HTTP/1.1"
            self._protocol_error(message)
        except httptools.HttpParserError as exc:
            self._protocol_error(f"the upstream's answer is not valid HTTP/1.1 ({exc})")
        else:
            if self._in_head:
                # httptools reports a header only once its line ends, buffering it meanwhile: a line
                # that never ends would grow without bound unless the raw bytes are counted too.
                self._head_read += len(data)
                if self._head_read > MAX_HEAD_BYTES:
                    self._protocol_error(f"the upstream's answer head is over {MAX_HEAD_BYTES} bytes")

    def eof_received(self) -> bool | None:
        return None  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        dropped = self.closed  # by abort(): this side cut the answer off, the peer did not end it
        self.closed = True
        self.pool.lost(self)
        response, self.response = self.response, None
        if response is None:
            return
        if (exc is None and not dropped and self._until_close and response._head.done()
                and not response._head.exception()):
            # A close-delimited body ends at the peer's clean close (FIN); a reset, a transport error or
            # our own abort (the pool closed) cuts it short, and what arrived must not pass for the whole.
            response._finish()
            return
        response._fail(ConnectionClosed(
            "the connection closed before the answer was complete" + (f" ({exc})" if exc else "")
        ))

    # -- httptools callbacks ------------------------------------------------------------------

    def _begin(self) -> None:
        self._head_bytes = 0
        self._in_head = True
        self._head_read = 0
        self._headers = {}
        self._informational = False
        self._until_close = False

    def on_message_begin(self) -> None:
        if self.response is None:  # an answer after the answer (in the same read): to nothing
            self._broken = True
            self.abort()
        self._begin()

    def on_status(self, status: bytes) -> None:
        self._count(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        # As aiohttp reads them: bytes outside UTF-8 kept as surrogates, so a value that is no valid
        # header to send on (gateway.forward._content_type) is seen as such.
        self._headers[name.decode("latin-1").lower()] = value.decode("utf-8", "surrogateescape")

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._informational = True  # 100 Continue, 103 Early Hints: the answer follows
            return
        self._in_head = False
        headers = self._headers
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding and encoding != "identity":
            if encoding == "gzip" or encoding == "x-gzip":
                response._wbits = _GZIP_WBITS
            elif encoding == "deflate":
                response._wbits = _DEFLATE_WBITS
            else:
                raise ProtocolError(f"the upstream answered in content-encoding {encoding!r}, not asked for")
        self._until_close = (
            "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()
            and status not in (204, 304)
        )
        response.status = status
        response.headers = headers
        self._headers = {}  # a chunked body's trailer fields land here, not in the answer's headers
        response._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None or self._informational:
            return
        response._feed(body)
        if response._buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._informational:
            self._begin()
            return
        response, self.response = self.response, None
        if response is None:
            return
        keep = self.parser.should_keep_alive() and not self._until_close and not self._broken
        response._finish()
        self.resume()  # a body received whole while reading was paused: read on (the next answer, a close)
        if keep:
            self.pool.put(self)
        else:
            self.abort()

    # -- helpers ------------------------------------------------------------------------------

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ProtocolError(f"the upstream's answer head is over {MAX_HEAD_BYTES} bytes")

    def _protocol_error(self, message: str) -> None:
        self._broken = True
        response, self.response = self.response, None
        self.abort()
        if response is not None:
            response._fail(ProtocolError(message))


class Http1Pool:
    """Keep-alive connections per origin, shared by every request of the process's event loop."""

    def __init__(self, *, keepalive: float = 60.0, ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context`` verifies HTTPS upstreams (default: the system's trust store, host names checked)."""
        self.loop = asyncio.get_running_loop()
        self.keepalive = keepalive
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._ssl = ssl_context
        self._closed = False

    async def request(
        self, method: str, url: str, headers: dict[str, str] | Any, body: bytes = b"", *,
        connect_timeout: float | None = None,
    ) -> Response:
        """Send a request and wait for the answer's status and headers.

        A reused connection closed before any byte of the answer (the upstream's idle close crossed
        the request) is not an error: the request goes once more on a new connection. Cancelling the
        wait (a deadline, the client gone) drops the connection. Raises
        :class:`ConnectError`, :class:`ConnectTimeout`, :class:`ConnectionClosed` or
        :class:`ProtocolError`; ``ValueError`` for a URL or header that cannot be sent.
        """
        origin, target, authorization = split_url(url)
        if authorization is not None:  # the URL's credentials win over an Authorization header, as in aiohttp
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers["Authorization"] = authorization
        head = _request_head(method, target, origin.host_header, headers, len(body), method != "GET" or bool(body))
        conn = self._reuse(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body)
            except ConnectionClosed:
                if not conn.answered_nothing:
                    raise
                # The upstream closed this idle connection as the request went out (its keep-alive
                # timeout crossing our request): it never read it. Send it once more on a new connection,
                # as an answer that never began is not a failure of the upstream.
        conn = await self._connect(origin, connect_timeout)
        return await self._exchange(conn, head, body)

    @staticmethod
    async def _exchange(conn: _Connection, head: bytes, body: bytes) -> Response:
        response = conn.send(head, body)
        try:
            await response._head
        except BaseException:
            response.close()
            raise
        return response

    def put(self, conn: _Connection) -> None:
        """A connection whose answer has been received whole: idle until reused or swept."""
        if self._closed or not conn.reusable:
            conn.abort()
            return
        conn.idle_since = self.loop.time()
        self._idle.setdefault(conn.origin, []).append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.keepalive, self._sweep)

    def lost(self, conn: _Connection) -> None:
        self._open.discard(conn)  # an idle one is dropped from its list when next looked at

    async def close(self) -> None:
        """Close every connection (idle and busy); later requests fail."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing

    def _reuse(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        expired = self.loop.time() - self.keepalive
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest still open
            if conn.reusable and conn.idle_since > expired and not conn.peer_went_away():
                return conn
            conn.abort()
        return None

    async def _connect(self, origin: Origin, deadline: float | None) -> _Connection:
        if self._closed:
            raise ConnectError("the client is closed")
        conn = _Connection(self, origin)
        try:
            async with asyncio.timeout(deadline):
                if origin.tls:
                    await self.loop.create_connection(lambda: conn, origin.host, origin.port, ssl=self._tls(),
                                                      server_hostname=origin.host)
                else:
                    await self.loop.create_connection(lambda: conn, origin.host, origin.port)
        except TimeoutError as exc:
            conn.abort()
            raise ConnectTimeout(f"timed out connecting to {origin.host_header}") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {origin.host_header}: {exc}") from exc
        if conn.closed:  # lost between connect and here
            raise ConnectionClosed(f"the connection to {origin.host_header} closed at once")
        if self._closed:  # close() ran while this connected: it did not see the connection, drop it here
            conn.abort()
            raise ConnectError("the client is closed")
        self._open.add(conn)
        return conn

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        expired = now - self.keepalive
        oldest: float | None = None
        for origin, idle in list(self._idle.items()):
            kept: list[_Connection] = []
            for conn in idle:
                if conn.reusable and conn.idle_since > expired:
                    kept.append(conn)
                else:
                    conn.abort()
            if kept:
                self._idle[origin] = kept
                first = min(c.idle_since for c in kept)
                oldest = first if oldest is None else min(oldest, first)
            else:
                del self._idle[origin]
        if oldest is not None:
            self._sweeper = self.loop.call_later(max(oldest + self.keepalive - now, 0.05), self._sweep)


def _request_head(
    method: str, target: str, host: str, headers: Any, length: int, with_length: bool,
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    for name, value in headers.items():
        if not name or _UNSENDABLE.search(name) or _UNSENDABLE.search(value):
            raise ValueError(f"request header {name!r} is empty or holds a line break or NUL")
        lines.append(f"{name}: {value}\r\n")
    if with_length:
        lines.append(f"Content-Length: {length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")
