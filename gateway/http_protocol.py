"""uvicorn's httptools protocol with the limits a hostile client needs: on the request head's size and
its header count, and on how long a connection may take to send one.

uvicorn's httptools protocol (the fast one, chosen in :func:`gateway.cli.serve`) bounds neither: a
request line or a header value is accumulated in memory for as long as the client sends it (200 MB
of one header value held ~300 MB and blocked the event loop for seconds, as each piece is appended
to the bytes already held), a million headers were read and answered, and a connection that sends
a partial head, or nothing at all, was held open for ever (its keep-alive timeout only runs between
requests). Here:

- a request head (request line and headers) over :data:`MAX_HEAD_BYTES`, or with more than
  :data:`MAX_HEADERS` header lines, is answered 431 and the connection closed: counted per socket read
  (the bytes held before the check are at most one read over the limit) and as the parser hands the
  URL and headers over (a read that begins a request can hold all of it);
- a connection that has not sent a complete head ``head_timeout`` seconds after it opened, or after
  the first byte of its next request on a keep-alive connection, is answered 408 and closed (or
  closed, when it sent nothing). A request whose head is complete is the app's: its body has
  ``server.body_timeout`` (:func:`gateway.protocol.read_body`), its answer no limit;
- a request answered before its body was read (401, 404, 413, the body timeout's 408) has the rest of
  its body read and dropped for at most ``head_timeout`` seconds after the answer, then the connection
  is closed; once that body has ended the connection is idle, and closed after the keep-alive timeout.
  (The body's bytes stopped uvicorn's keep-alive timer and no other timer ran: a client trickling a
  byte now and then, or going quiet after the body, held the connection for ever);
- requests pipelined ahead of the answers are read on only once the queued ones are answered, and
  more than :data:`MAX_PIPELINED` queued at once (a single socket read can hold thousands) end the
  connection: the queued ones are answered, the last with ``Connection: close``, the rest are not read;
- a connection whose write buffer has stayed over its high-water mark with none of it taken by the
  client for ``write_timeout`` seconds (``server.write_timeout``) is aborted, its unsent bytes dropped.
  A whole answer is written at once: what the client's socket did not take waited in the buffer (up to
  ``server.max_response_bytes``) for a client that stopped reading, for ever (closing waits for the
  buffer to empty), and held shutdown's drain. The request learns it from :data:`WRITTEN_KEY`.

A pipelined request refused (400, 431) behind requests read whole is answered after them, in order:
HTTP/1.1 answers every pipelined request before the close, and closing at once dropped their answers
(the upstream already paid for the one being served).

A client that closes its connection is gone (its upstream call is cancelled: README), also while it has
requests pipelined: the one being answered is told (uvicorn told only the last one queued), and the
queued ones are not started when the client's FIN or reset is in, though reading is paused while they
queue and it is unread behind them (each was an upstream call for nobody).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.client_gone import SCOPE_KEY, ClientGone
from gateway.responses import gateway_headers

try:  # POSIX; elsewhere a stall is measured on the transport's buffer alone
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = termios = None  # type: ignore[assignment]

#: The largest request head (request line plus headers) read, in bytes; larger: 431.
MAX_HEAD_BYTES = 64 * 1024
#: The most header lines one request may carry; more: 431.
MAX_HEADERS = 256
#: The most requests a client may pipeline ahead of the answer being written; more: the connection is closed.
MAX_PIPELINED = 16

_HEAD_TOO_LARGE = f"the request head is over {MAX_HEAD_BYTES} bytes"
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
_CODES = {400: "invalid_http_request", 408: "request_timeout", 431: "request_header_fields_too_large"}
_TCP_ESTABLISHED = 1  # Linux's tcp_states.h; after the client's FIN: CLOSE_WAIT, after a reset: CLOSE
#: Scope key of a request's ``abort()``: drops its connection at once, bytes not yet written included
#: (a stream to a client that stopped reading: ``gateway/streaming.py``).
ABORT_KEY = "pointsman.abort"
#: Scope key of a request's ``written()``: awaited after its last write, None once the write buffer is
#: not over its high-water mark (the client is taking the answer), else why the answer never will leave
#: (:data:`STALLED`, or :data:`DISCONNECTED` for a connection lost otherwise).
WRITTEN_KEY = "pointsman.written"
STALLED = "client_stalled"
DISCONNECTED = "client_disconnected"


class GatewayHttpProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with head size, header count and head time limits (see the module)."""

    #: Seconds a request head may take to arrive; set per server by :func:`protocol_for`.
    head_timeout: float = 10.0
    #: Seconds the write buffer may stay over its high-water mark with nothing taken; by :func:`protocol_for`.
    write_timeout: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # after a request's body or inside a head: bytes arriving now are a head's
        self._head_bytes = 0
        self._head_sent = False  # some byte of the next request's head has arrived
        self._messages = 0  # heads begun on this connection
        self._completed = 0  # requests (head and body) read whole on this connection
        self._head_parsed = 0
        self._head_timer: asyncio.TimerHandle | None = None
        # Set once no more requests are read from this connection: what to send after the answers to
        # the ones read (a refusal, or nothing but the close).
        self._last_word: Callable[[], None] | None = None
        self._running: RequestResponseCycle | None = None  # the request being answered
        # Armed while the rest of an answered request's body is read and dropped (see the module).
        self._discard_timer: asyncio.TimerHandle | None = None
        # Armed while writing is paused (the buffer over its high-water mark), with the buffer's size
        # when it was armed: one timer per write_timeout, not one per write.
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_buffered = 0
        self._lost: str | None = None  # once the connection is lost: why, for written()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._running = cycle
        cycle.scope[SCOPE_KEY] = ClientGone()  # type: ignore[literal-required]  # fired in connection_lost
        cycle.scope[ABORT_KEY] = self.transport.abort  # type: ignore[literal-required]
        cycle.scope[WRITTEN_KEY] = self._written  # type: ignore[literal-required]
        super()._start_asgi_task(cycle, app)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_discard_timer()
        self._cancel_write_timer()
        if self._lost is None:
            self._lost = DISCONNECTED
        # uvicorn tells only ``self.cycle``, the last request parsed, that the client is gone: with
        # requests queued behind it, the one being answered never learnt it (its upstream call ran on,
        # and writing its answer raised on the closed transport: an "unhandled error" logged).
        running = self._running
        cut_off = running if running is not None and not running.response_complete else None
        if cut_off is not None:
            cut_off.disconnected = True
            cut_off.message_event.set()
        self.pipeline.clear()  # never started
        super().connection_lost(exc)
        gone = cut_off.scope.get(SCOPE_KEY) if cut_off is not None else None
        if isinstance(gone, ClientGone):
            gone.fire()  # after uvicorn's own bookkeeping: the callbacks cancel the request's task

    def data_received(self, data: bytes) -> None:
        if self._last_word is not None:
            return  # no more requests are read (the parser may be stopped mid-request): dropped
        if self._in_head:
            self._head_sent = True
            if self._head_timer is None and self._idle():
                self._arm_head_timer()  # the first byte of a keep-alive connection's next request
        begun, completed = self._messages, self._completed
        super().data_received(data)
        if not self._in_head or self.parser is None or self.transport.is_closing():
            return
        # Every byte of this read belongs to the head still being read only if no head began and no
        # body ended in it: the read that ends a body (any size) is not the next request's head.
        if self._messages == begun and self._completed == completed:
            self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(431, _HEAD_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._head_parsed = 0  # request line and header bytes the parser has handed over
        self._messages += 1

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        # Counted here as well as per read: a read that begins a request is not counted by
        # data_received, and one socket read can hold a whole 256 KiB request line.
        self._head_parsed += len(url)
        if self._head_parsed > MAX_HEAD_BYTES:
            self._refuse(431, _HEAD_TOO_LARGE)
            raise _HeadRefused

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head_parsed += len(name) + len(value) + 4  # ": " and CRLF
        if self._head_parsed > MAX_HEAD_BYTES:
            self._refuse(431, _HEAD_TOO_LARGE)
            raise _HeadRefused
        if len(self.headers) > MAX_HEADERS:
            # Raised inside the parser's callback: httptools turns it into an HttpParserCallbackError
            # (an HttpParserError), which uvicorn answers 400; answer 431 first, so that one is dropped.
            self._refuse(431, f"the request has more than {MAX_HEADERS} header lines")
            raise _HeadRefused

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._arm_write_timer()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_write_timer()

    async def _written(self) -> str | None:
        """None once what was written so far is under the write buffer's high-water mark (the client is
        taking it), else why it never will be: the connection was lost, or cut for a stalled client."""
        if self._lost is None and self.flow.write_paused:
            await self.flow.drain()  # set again by resume_writing, and by connection_lost
        return self._lost

    def _arm_write_timer(self) -> None:
        self._write_buffered = _unsent(self.transport)
        self._write_timer = self.loop.call_later(self.write_timeout, self._write_timed_out)

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timed_out(self) -> None:
        self._write_timer = None
        if self._lost is not None:
            return
        if _unsent(self.transport) < self._write_buffered:
            # The client took some since the last check (when, the transport does not say): it is
            # reading. Checked again a whole timeout later, so a stall is cut between one timeout and two.
            self._arm_write_timer()
            return
        self._lost = STALLED
        self.transport.abort()  # closing would wait for the bytes nobody reads; connection_lost follows

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        # A head read in the same socket read as the end of a dropped body (which armed the keep-alive
        # timer): the connection is not idle any more.
        self._unset_keepalive_if_required()
        if len(self.pipeline) >= MAX_PIPELINED:
            # The queued ones are answered, the last with Connection: close; the raise stops the parser
            # (no more queued requests from this read), and later reads are dropped.
            self.cycle.keep_alive = False
            self._stop(lambda: None)
            raise _HeadRefused
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if self.pipeline and not self.transport.is_closing() and _client_closed(self.transport):
            self.transport.close()  # the client is gone: its queued requests are not started
        super().on_response_complete()  # starts the next pipelined request, and resumes reading
        if self.transport.is_closing():
            return
        if self._last_word is not None and self._idle():  # the answers to the requests read are written
            self._last_word()
            self.transport.close()
            return
        if not self._in_head and self._idle() and not self.pipeline:
            # Answered before its body was read whole: the rest is dropped as it comes, within a limit.
            self._cancel_discard_timer()
            self._discard_timer = self.loop.call_later(self.head_timeout, self._discard_timed_out)
        if self.pipeline:
            # uvicorn resumes reading after every answer: a client pipelining requests without reading
            # the answers then queued one more socket read of requests (thousands) per answer, without
            # bound (10 MB of pipelined GETs held ~400 MB). Read on once the queued ones are answered.
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        self._in_head = True  # what arrives next is the next request's head (pipelined, or after the answer)
        self._head_sent = False
        self._head_bytes = 0
        self._completed += 1
        super().on_message_complete()
        if self._discard_timer is not None:
            # The answered request's body has ended: the connection is idle, as after any answer.
            self._cancel_discard_timer()
            if not self.transport.is_closing() and self._idle():
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )

    def send_400_response(self, msg: str) -> None:
        # OpenAI-shaped with the gateway's headers (uvicorn's is a text/plain line), after the answers
        # being written (it would land inside them), and none after a 431 (whose raise reaches uvicorn
        # as a parser error) or on a closed connection.
        self._refuse(400, "the request is not valid HTTP/1.1")

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_discard_timer(self) -> None:
        if self._discard_timer is not None:
            self._discard_timer.cancel()
            self._discard_timer = None

    def _discard_timed_out(self) -> None:
        self._discard_timer = None
        if not self.transport.is_closing() and not self._in_head and self._idle():
            self.transport.close()  # its request was answered: nothing more to say

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head or self._last_word is not None:
            return
        if not self._idle():  # the next request's head came while this answer streams: wait for it
            self._arm_head_timer()
            return
        if self._head_sent:
            self._refuse(408, f"the request head did not arrive within {self.head_timeout:g} seconds")
        else:
            self.transport.close()  # nothing sent (or only between requests): no request to answer

    def _stop(self, last_word: Callable[[], None]) -> None:
        """Read no more requests: answer the ones read whole, in order, then ``last_word()`` and close."""
        self._cancel_head_timer()
        self._last_word = last_word
        if self._idle():
            last_word()
            self.transport.close()
        elif self.cycle.more_body:  # the request still being read is the bad one: it can get no answer
            self.transport.close()
        # else: on_response_complete, once the last answer is written

    def _refuse(self, status: int, message: str) -> None:
        """An OpenAI-shaped error and a closed connection, after the answers to the requests read whole."""
        if self.transport.is_closing() or self._last_word is not None:
            return
        self._stop(lambda: self._write_refusal(status, message))

    def _write_refusal(self, status: int, message: str) -> None:
        body = b'{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":"%s"}}' % (
            message.encode("ascii"),
            _CODES[status].encode("ascii"),
        )
        # The x-pointsman-* headers (a fresh request id) every other answer carries: a client reports it.
        headers = b"".join(b"%s: %s\r\n" % header for header in gateway_headers())
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%sconnection: close\r\n\r\n%s"
            % (status, _REASONS[status], len(body), headers, body)
        )


def _client_closed(transport: asyncio.Transport) -> bool:
    """Whether the client's FIN or reset has arrived, read or not (False where a socket cannot tell)."""
    sock = transport.get_extra_info("socket")
    try:
        # tcp_info.tcpi_state: the TCP state, which the FIN changes even with bytes unread before it.
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except (AttributeError, OSError, ValueError, IndexError):
        return False
    return bool(state != _TCP_ESTABLISHED)


def _unsent(transport: asyncio.Transport) -> int:
    """Bytes written to the connection that the client has not taken: the transport's buffer and the
    kernel's send queue. The queue counts: it holds megabytes, and while a slow reader empties it the
    buffer does not move (it moves on when a third of the queue is free), so a client reading a few
    KB/s would look stalled for minutes."""
    unsent = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    # A socket or a platform that cannot tell: the buffer alone.
    with contextlib.suppress(AttributeError, OSError, TypeError, ValueError):
        # TIOCOUTQ is Linux's SIOCOUTQ on a socket: the bytes in its send queue, not yet acknowledged.
        unsent += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    return unsent


class _HeadRefused(Exception):
    """Stops the parser after a 431 (see :meth:`GatewayHttpProtocol.on_header`)."""


def protocol_for(head_timeout: float, write_timeout: float = 60.0) -> type[GatewayHttpProtocol]:
    """The protocol class for a server whose request heads must arrive within ``head_timeout`` seconds
    and whose clients must take some of a full write buffer every ``write_timeout`` seconds."""
    return type(
        "GatewayHttpProtocol", (GatewayHttpProtocol,), {"head_timeout": head_timeout, "write_timeout": write_timeout}
    )
