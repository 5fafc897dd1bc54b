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
- requests pipelined ahead of the answers are read on only once the queued ones are answered, and
  more than :data:`MAX_PIPELINED` queued at once (a single socket read can hold thousands) close
  the connection.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: The largest request head (request line plus headers) read, in bytes; larger: 431.
MAX_HEAD_BYTES = 64 * 1024
#: The most header lines one request may carry; more: 431.
MAX_HEADERS = 256
#: The most requests a client may pipeline ahead of the answer being written; more: the connection is closed.
MAX_PIPELINED = 16

_HEAD_TOO_LARGE = f"the request head is over {MAX_HEAD_BYTES} bytes"
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class GatewayHttpProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with head size, header count and head time limits (see the module)."""

    #: Seconds a request head may take to arrive; set per server by :func:`protocol_for`.
    head_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # after a request's body or inside a head: bytes arriving now are a head's
        self._head_bytes = 0
        self._head_sent = False  # some byte of the next request's head has arrived
        self._messages = 0  # heads begun on this connection
        self._completed = 0  # requests (head and body) read whole on this connection
        self._head_parsed = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
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

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if len(self.pipeline) >= MAX_PIPELINED:
            self.transport.close()  # stops the parser (below): no more queued requests from this read
            raise _HeadRefused
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next pipelined request, and resumes reading
        if self.pipeline and not self.transport.is_closing():
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

    def send_400_response(self, msg: str) -> None:
        if self.transport.is_closing():  # after a 431 already sent, or a connection closed
            return
        if not self._idle():  # an answer is being written: a 400 now would land inside it
            self.transport.close()
            return
        super().send_400_response(msg)

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if not self._idle():  # the next request's head came while this answer streams: wait for it
            self._arm_head_timer()
            return
        if self._head_sent:
            self._refuse(408, f"the request head did not arrive within {self.head_timeout:g} seconds")
        else:
            self.transport.close()  # nothing sent (or only between requests): no request to answer

    def _refuse(self, status: int, message: str) -> None:
        """An OpenAI-shaped error and a closed connection, unless an answer is already being written."""
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        if not self._idle():  # a pipelined head while an answer streams: just stop reading it
            self.transport.close()
            return
        code = "request_header_fields_too_large" if status == 431 else "request_timeout"
        body = (b'{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":"%s"}}'
                % (message.encode("ascii"), code.encode("ascii")))
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, _REASONS[status], len(body), body)
        )
        self.transport.close()


class _HeadRefused(Exception):
    """Stops the parser after a 431 (see :meth:`GatewayHttpProtocol.on_header`)."""


def protocol_for(head_timeout: float) -> type[GatewayHttpProtocol]:
    """The protocol class for a server whose request heads must arrive within ``head_timeout`` seconds."""
    return type("GatewayHttpProtocol", (GatewayHttpProtocol,), {"head_timeout": head_timeout})
