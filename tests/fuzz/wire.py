"""Raw HTTP/1.1 over one persistent socket, and the properties every fuzzed exchange must keep.

The fuzz cases are bytes, not SDK calls: bodies may be invalid JSON, invalid UTF-8 or larger than
the gateway accepts, so requests are written to a plain socket and responses parsed with
``http.client.HTTPResponse``. Each case uses one connection for the fuzzed request and then a valid
request, which is how a keep-alive client (the openai SDK's pool) would reuse it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

# A small valid request to a static route: it must answer 200 on the fuzzed request's connection.
FOLLOW_UP_BODY = orjson.dumps(
    {"model": "fixed", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 4}
)
UPSTREAM_STATUSES = frozenset({502, 503, 504})  # the only 5xx answers a client may see
TIMEOUT = 60.0  # seconds before an exchange is given up
# A fuzzed request answered slower than this blocked the gateway (its event loop serves every client):
# legitimate answers here (a fake upstream on loopback, bodies <= 2 MB) take well under a second.
SLOW_SECONDS = float(os.environ.get("POINTSMAN_FUZZ_SLOW_SECONDS", "10"))
_THREADED_SEND = 256 * 1024  # larger bodies are sent from a thread while the response is read


@dataclass(slots=True)
class Request:
    """One HTTP request, byte for byte (``label`` says what was fuzzed)."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, bytes], ...] = ()
    chunks: tuple[int, ...] | None = None  # chunked transfer: sizes of the chunks (the rest is one more)
    oversize: bool = False  # the body exceeds server.max_body_bytes: a 413 may close the connection
    label: str = ""

    def wire(self) -> bytes:
        """The request as sent (head and body)."""
        head = [f"{self.method} {self.path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
        head += [name.encode("latin-1") + b": " + value for name, value in self.headers]
        if self.chunks is None:
            if self.body or self.method not in ("GET", "HEAD"):
                head.append(b"Content-Length: " + str(len(self.body)).encode())
            return b"\r\n".join(head) + b"\r\n\r\n" + self.body
        head.append(b"Transfer-Encoding: chunked")
        out = [b"\r\n".join(head) + b"\r\n\r\n"]
        offset = 0
        for size in (*self.chunks, len(self.body)):
            piece = self.body[offset:offset + size]
            offset += len(piece)
            if piece:
                out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        out.append(b"0\r\n\r\n")
        return b"".join(out)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How Hypothesis prints a falsifying example: the short form, not 2 MB of fields."""
        printer.text(repr(self))

    def __repr__(self) -> str:
        preview = self.body[:400] + (b"..." if len(self.body) > 400 else b"")
        framing = "chunked" if self.chunks is not None else "content-length"
        return (
            f"Request({self.label!r}: {self.method} {self.path}, {framing}, body {len(self.body)} bytes "
            f"{preview!r}, headers={list(self.headers)!r})"
        )


@dataclass(slots=True)
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def closes(self) -> bool:
        return "close" in (self.header("connection") or "").lower()

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:300]!r})"


class ConnectionLost(Exception):
    """The server closed or reset the connection instead of answering."""


class Connection:
    """One keep-alive client connection to the gateway."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exchange(self, request: Request) -> Reply:
        """Send ``request`` and read the whole response; :class:`ConnectionLost` if there is none."""
        return self.exchange_bytes(request.wire(), request.method)

    def exchange_bytes(self, data: bytes, method: str) -> Reply:
        """Send raw request bytes and read the whole response."""
        sender: threading.Thread | None = None
        send_error: list[BaseException] = []
        try:
            if len(data) > _THREADED_SEND:
                # The gateway may answer (413) before reading the whole body: read while sending.
                def send() -> None:
                    try:
                        self.sock.sendall(data)
                    except OSError as exc:
                        send_error.append(exc)

                sender = threading.Thread(target=send, daemon=True)
                sender.start()
            else:
                self.sock.sendall(data)
            response = http.client.HTTPResponse(self.sock, method=method)
            response.begin()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionLost(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if sender is not None:
                sender.join(TIMEOUT)
        return Reply(response.status, list(response.getheaders()), body)


def follow_up() -> Request:
    return Request(
        "POST", "/v1/chat/completions", FOLLOW_UP_BODY, (("Content-Type", b"application/json"),), label="follow-up"
    )


# -- the properties ----------------------------------------------------------------------------


class FuzzFailure(AssertionError):
    """A property of the gateway that a fuzz case broke. Subclasses are the failure classes (and
    let Hypothesis report each class separately)."""

    kind = "failure"


class ServerError(FuzzFailure):
    kind = "5xx"


class ErrorShape(FuzzFailure):
    kind = "error-shape"


class MissingRequestId(FuzzFailure):
    kind = "no-request-id"


class ClosesConnection(FuzzFailure):
    kind = "connection-close"


class DroppedConnection(FuzzFailure):
    kind = "dropped-connection"


class FollowUpFailed(FuzzFailure):
    kind = "follow-up-failed"


class Slow(FuzzFailure):
    kind = "slow"


@dataclass(slots=True)
class Violation:
    kind: type[FuzzFailure]
    message: str


@dataclass(slots=True)
class Outcome:
    """What one case did: the reply (None when the connection was lost) and every broken property."""

    request: Request
    reply: Reply | None
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"case: {self.request!r}", f"reply: {self.reply!r} after {self.seconds:.2f} s"]
        lines += [f"  [{v.kind.kind}] {v.message}" for v in self.violations]
        return "\n".join(lines)


def check_reply(reply: Reply, violations: list[Violation], *, what: str = "response") -> None:
    """The per-response properties: status class, OpenAI error shape, the request-id header."""
    if reply.status >= 500 and reply.status not in UPSTREAM_STATUSES:
        violations.append(Violation(ServerError, f"{what}: HTTP {reply.status}: {reply.body[:500]!r}"))
    if reply.status >= 400:
        problem = error_shape_problem(reply.body)
        if problem:
            violations.append(Violation(ErrorShape, f"{what}: HTTP {reply.status} {problem}: {reply.body[:300]!r}"))
    if not reply.header("x-pointsman-request-id"):
        violations.append(Violation(MissingRequestId, f"{what}: HTTP {reply.status} without x-pointsman-request-id"))


def error_shape_problem(body: bytes) -> str | None:
    """Why ``body`` is not ``{"error": {"message": str, "type": str, "param": ..., "code": ...}}``."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "body is not JSON"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return "has no 'error' object"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "error.message / error.type are not strings"
    missing = [key for key in ("param", "code") if key not in error]
    if missing:
        return f"error lacks {missing}"
    return None


def run_case(port: int, request: Request) -> Outcome:
    """Send ``request`` and then a valid request on the same connection; collect broken properties."""
    outcome = Outcome(request, None)
    violations = outcome.violations
    with Connection(port) as conn:
        started = time.perf_counter()
        try:
            reply = conn.exchange(request)
        except ConnectionLost as exc:
            outcome.seconds = time.perf_counter() - started
            timed_out = isinstance(exc.__cause__, TimeoutError)
            violations.append(Violation(Slow if timed_out else DroppedConnection,
                                        f"no response to the fuzzed request ({exc})"))
            reusable = False
        else:
            outcome.seconds = time.perf_counter() - started
            if outcome.seconds > SLOW_SECONDS:
                message = (f"HTTP {reply.status} after {outcome.seconds:.1f} s (> {SLOW_SECONDS:g} s: one request "
                           "held the gateway's CPU that long)")
                violations.append(Violation(Slow, message))
            outcome.reply = reply
            check_reply(reply, violations)
            close_allowed = request.oversize and reply.status == 413
            if reply.closes and not close_allowed:
                violations.append(Violation(ClosesConnection, f"HTTP {reply.status} with Connection: close"))
            reusable = not reply.closes
        if reusable:
            try:
                answer = conn.exchange(follow_up())
            except ConnectionLost as exc:
                violations.append(Violation(
                    DroppedConnection,
                    f"the connection did not serve the next request after HTTP "
                    f"{outcome.reply.status if outcome.reply else '-'} ({exc})",
                ))
            else:
                check_follow_up(answer, violations)
    if not reusable or any(v.kind is DroppedConnection for v in violations):
        with Connection(port) as fresh:  # the gateway itself must still serve
            try:
                check_follow_up(fresh.exchange(follow_up()), violations, what="fresh connection")
            except ConnectionLost as exc:
                violations.append(Violation(FollowUpFailed, f"a fresh connection got no answer ({exc})"))
    return outcome


def check_follow_up(reply: Reply, violations: list[Violation], *, what: str = "follow-up") -> None:
    if reply.status != 200 or b'"choices"' not in reply.body:
        message = f"{what}: valid request answered {reply.status}: {reply.body[:300]!r}"
        violations.append(Violation(FollowUpFailed, message))


def save_request(request: Request, directory: Path) -> Path:
    """Write the request's exact bytes to ``directory`` (for ``python -m tests.fuzz.replay``)."""
    data = request.wire()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{hashlib.sha256(data).hexdigest()[:16]}.http"
    path.write_bytes(data)
    return path
