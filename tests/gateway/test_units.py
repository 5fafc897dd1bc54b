"""Unit tests for the gateway's pure logic: circuit breaker, Retry-After parsing, SSE usage scanning,
replica choice. Real objects throughout; only the breaker's clock is injected so time is explicit."""

from __future__ import annotations

import email.utils
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from gateway.breaker import BreakerState, CircuitBreaker
from gateway.config import BackendConfig, BreakerConfig
from gateway.pool import Backend, BackendPool, Replica
from gateway.upstream import parse_retry_after
from gateway.usage import SSEUsageScanner


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- CircuitBreaker ----------------------------------------------------------------------------


def _breaker(threshold: int = 3, cooldown: float = 10.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(threshold, cooldown, clock=clock), clock


def test_breaker_stays_closed_below_threshold_and_success_resets_the_count() -> None:
    breaker, _ = _breaker(threshold=3)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED and breaker.available() and breaker.acquire()
    breaker.record_success()  # failures must be consecutive to trip
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED


def test_breaker_opens_at_threshold_and_refuses_traffic_during_cooldown() -> None:
    breaker, clock = _breaker(threshold=3, cooldown=10)
    for _ in range(3):
        breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.available() and not breaker.acquire()
    clock.advance(9.9)
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()


def test_breaker_half_opens_after_cooldown_with_a_single_probe() -> None:
    breaker, clock = _breaker(threshold=1, cooldown=10)
    breaker.record_failure()
    clock.advance(10)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.available()
    assert breaker.acquire(), "the first request after the cooldown is the probe"
    assert not breaker.available() and not breaker.acquire(), "only one probe at a time"
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.acquire() and breaker.acquire()  # closed: everything flows again


def test_breaker_failed_probe_reopens_for_a_full_cooldown() -> None:
    breaker, clock = _breaker(threshold=2, cooldown=5)
    breaker.record_failure()
    breaker.record_failure()
    clock.advance(5)
    assert breaker.acquire()
    breaker.record_failure()  # one failed probe re-opens, regardless of the threshold
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()
    clock.advance(4.9)
    assert breaker.state is BreakerState.OPEN
    clock.advance(0.1)
    assert breaker.state is BreakerState.HALF_OPEN and breaker.acquire()


def test_breaker_released_probe_lets_another_probe_through() -> None:
    # A probe whose client left proved nothing: the next request may probe instead.
    breaker, clock = _breaker(threshold=1, cooldown=1)
    breaker.record_failure()
    clock.advance(1)
    assert breaker.acquire()
    breaker.release()
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.acquire()


# --- parse_retry_after -------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("3", 3.0), ("0", 0.0), ("120", 120.0), ("-5", 0.0)])
def test_retry_after_seconds(value: str, expected: float) -> None:
    assert parse_retry_after(value) == expected


def test_retry_after_http_date_in_the_future() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    seconds = parse_retry_after(email.utils.format_datetime(when, usegmt=True))
    assert seconds is not None and 27 <= seconds <= 30.5


def test_retry_after_http_date_in_the_past_is_zero() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "1 minute", "Someday, 99 Foo 2015 07:28:00 GMT"])
def test_retry_after_junk_is_none(value: str | None) -> None:
    assert parse_retry_after(value) is None


@pytest.mark.parametrize("value", ["nan", "inf", "Infinity", "1e999"])
def test_retry_after_non_finite_is_none(value: str) -> None:
    # RFC 9110 delta-seconds is digits only. float() accepts these, and a non-finite Retry-After
    # from an upstream later crashes int(...) in gateway.forward._client_error (a 500 to the client).
    result = parse_retry_after(value)
    assert result is None, f"parse_retry_after({value!r}) returned {result!r}; a non-finite value must be None"


# --- SSEUsageScanner ---------------------------------------------------------------------------


def _event(payload: dict[str, object], sep: bytes = b"\n\n") -> bytes:
    return b"data: " + orjson.dumps(payload) + sep


CONTENT = _event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}],
                  "usage": None})
USAGE = _event({"object": "chat.completion.chunk", "choices": [],
                "usage": {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}})
DONE = b"data: [DONE]\n\n"


def _feed(scanner: SSEUsageScanner, data: bytes, size: int) -> None:
    for start in range(0, len(data), size):
        scanner.feed(data[start:start + size])


@pytest.mark.parametrize("size", [1, 2, 3, 7, 50, 10_000])
def test_scanner_finds_usage_split_across_feeds(size: int) -> None:
    scanner = SSEUsageScanner()
    _feed(scanner, CONTENT + CONTENT + USAGE + DONE, size)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (13, 5)
    assert scanner.saw_done
    assert scanner.events == 4


@pytest.mark.parametrize("size", [1, 5, 10_000])
def test_scanner_handles_crlf_events(size: int) -> None:
    data = (CONTENT + USAGE + DONE).replace(b"\n", b"\r\n")
    scanner = SSEUsageScanner()
    _feed(scanner, data, size)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (13, 5)
    assert scanner.saw_done and scanner.events == 3


def test_scanner_detects_done_only_when_the_event_is_complete() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(CONTENT)
    assert not scanner.saw_done
    scanner.feed(b"data: [DO")
    scanner.feed(b"NE]\n")
    assert not scanner.saw_done, "an event is complete only at its blank line"
    scanner.feed(b"\n")
    assert scanner.saw_done


def test_scanner_done_without_space_after_colon() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b"data:[DONE]\n\n")
    assert scanner.saw_done


def test_scanner_ignores_null_usage_chunks() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(CONTENT + _event({"choices": [], "usage": None}).replace(b'"usage":null', b'"usage": null'))
    assert scanner.prompt_tokens is None and scanner.completion_tokens is None
    scanner.feed(USAGE + CONTENT)  # a null-usage chunk after the real one must not erase it
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (13, 5)


def test_scanner_without_usage_reports_none_and_ignores_comments() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b": keep-alive\n\n" + CONTENT + DONE)
    assert scanner.prompt_tokens is None and scanner.completion_tokens is None
    assert scanner.saw_done and scanner.events == 2  # comment lines are not data events


def test_scanner_tolerates_non_json_data_mentioning_usage() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data: {"usage": broken\n\n' + USAGE)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (13, 5)


# --- Backend.pick ------------------------------------------------------------------------------


def _backend(n: int = 3, max_concurrency: int = 10) -> Backend:
    config = BackendConfig(
        name="b",
        replicas=tuple(f"http://10.0.0.{i}:8000/v1" for i in range(n)),
        models=({"name": "m"},),  # type: ignore[arg-type]
        max_concurrency=max_concurrency,
    )
    pool = BackendPool([config], BreakerConfig(failure_threshold=1, cooldown=60))
    return pool.backends[0]


def _loads(backend: Backend, *outstanding: int) -> list[Replica]:
    for replica, load in zip(backend.replicas, outstanding, strict=True):
        replica.outstanding = load
    return backend.replicas


def test_pick_least_outstanding() -> None:
    backend = _backend()
    _r0, r1, r2 = _loads(backend, 4, 1, 3)
    assert backend.pick() is r1
    r1.outstanding = 5
    assert backend.pick() is r2


def test_pick_spreads_ties_across_replicas() -> None:
    backend = _backend()
    _loads(backend, 2, 0, 0)
    picks = Counter(backend.pick().base_url for _ in range(10))  # type: ignore[union-attr]
    assert set(picks) == {backend.replicas[1].base_url, backend.replicas[2].base_url}
    assert min(picks.values()) >= 4, picks  # round-robin, not always the first


def test_pick_prefers_replicas_not_yet_tried() -> None:
    backend = _backend()
    r0, r1, r2 = _loads(backend, 0, 3, 5)
    assert backend.pick(exclude=[r0]) is r1, "a retry goes to another replica even if it is busier"
    assert backend.pick(exclude=[r0, r1]) is r2
    # Every usable replica already tried: retry on the least loaded rather than give up.
    assert backend.pick(exclude=[r0, r1, r2]) is r0


def test_pick_skips_unhealthy_open_breaker_and_saturated_replicas() -> None:
    backend = _backend(max_concurrency=2)
    r0, r1, r2 = _loads(backend, 0, 0, 1)
    r0.healthy = False
    r1.breaker.record_failure()  # threshold 1: open
    assert backend.pick() is r2
    assert backend.pick(exclude=[r2]) is r2, "exclusion never makes the only usable replica unusable"
    r2.outstanding = 2  # at max_concurrency
    assert backend.pick() is None
    assert backend.saturated() is True
    r2.outstanding = 0
    r2.healthy = False
    assert backend.pick() is None
    assert backend.saturated() is False, "no live replica is not the same as all busy"


def test_pick_single_replica_backend() -> None:
    backend = _backend(n=1)
    assert backend.pick() is backend.replicas[0]
    assert backend.pick(exclude=backend.replicas) is backend.replicas[0]


def test_breaker_cooldown_follows_the_injected_clock_not_wall_time() -> None:
    # Guard for the tests above: they rely on the injected clock being the only time source.
    breaker, _clock = _breaker(threshold=1, cooldown=0.001)
    breaker.record_failure()
    time.sleep(0.01)
    assert breaker.state is BreakerState.OPEN
