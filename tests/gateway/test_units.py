"""Unit tests for the gateway's pure logic: circuit breaker, Retry-After parsing, SSE usage scanning,
replica choice. Real objects throughout; only the breaker's clock is injected so time is explicit."""

from __future__ import annotations

import email.utils
import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from gateway.breaker import BreakerState, CircuitBreaker, Outcome
from gateway.config import BackendConfig, BreakerConfig, parse_config
from gateway.errors import ConfigError
from gateway.pool import Backend, BackendPool, Replica
from gateway.responses import new_request_id
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


# --- CircuitBreaker (outlier detection) -------------------------------------------------------

ANSWER, ERROR, TRANSPORT = Outcome.ANSWER, Outcome.ERROR_ANSWER, Outcome.TRANSPORT


def _breaker(
    threshold: int = 3, cooldown: float = 10.0, *, window: float = 30.0, min_requests: int = 10,
    rate: float = 0.9, may_eject: bool = True,
) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    breaker = CircuitBreaker(threshold, cooldown, window=window, min_requests=min_requests, failure_rate=rate,
                             may_eject_for_errors=lambda: may_eject, clock=clock)
    return breaker, clock


def _outcomes(breaker: CircuitBreaker, *outcomes: Outcome) -> None:
    for outcome in outcomes:
        assert breaker.acquire()
        breaker.record(outcome)


def test_transport_failures_eject_at_the_threshold_and_any_answer_resets_the_count() -> None:
    breaker, _ = _breaker(threshold=3)
    _outcomes(breaker, TRANSPORT, TRANSPORT, ANSWER, TRANSPORT, TRANSPORT, ERROR, TRANSPORT, TRANSPORT)
    assert breaker.state is BreakerState.CLOSED, "failures must be consecutive; a 5xx answer is an answer"
    _outcomes(breaker, TRANSPORT)
    assert breaker.state is BreakerState.OPEN and breaker.ejections == {"transport": 1}


def test_transport_failures_eject_even_the_last_replica() -> None:
    breaker, _ = _breaker(threshold=2, may_eject=False)
    _outcomes(breaker, TRANSPORT, TRANSPORT)
    assert breaker.state is BreakerState.OPEN, "an outage is an outage"


def test_5xx_answers_in_a_row_do_not_eject_below_the_volume() -> None:
    breaker, _ = _breaker(threshold=1, min_requests=10)
    _outcomes(breaker, *[ERROR] * 9)
    assert breaker.state is BreakerState.CLOSED and breaker.window_counts() == (9, 9)
    _outcomes(breaker, ERROR)
    assert breaker.state is BreakerState.OPEN and breaker.ejections == {"error_rate": 1}
    assert breaker.window_counts() == (0, 0), "an ejection starts a fresh window"


def test_5xx_rate_below_the_threshold_never_ejects() -> None:
    breaker, _ = _breaker(min_requests=20, rate=0.9)
    for _ in range(40):  # 80% failing, 200 outcomes: a replica that answers some requests stays in
        _outcomes(breaker, *[ERROR] * 4, ANSWER)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.window_counts() == (200, 160)


def test_5xx_rate_at_the_threshold_ejects() -> None:
    breaker, _ = _breaker(min_requests=20, rate=0.9)
    _outcomes(breaker, ANSWER, ANSWER, *[ERROR] * 17)
    assert breaker.state is BreakerState.CLOSED, "19 outcomes: below min_requests"
    _outcomes(breaker, ERROR)  # 18 of 20 = 0.9
    assert breaker.state is BreakerState.OPEN


def test_answers_only_never_eject_however_many() -> None:
    breaker, _ = _breaker(min_requests=1, rate=0.01)
    _outcomes(breaker, *[ANSWER] * 500)
    assert breaker.state is BreakerState.CLOSED


def test_window_forgets_outcomes_older_than_window_seconds() -> None:
    breaker, clock = _breaker(window=10, min_requests=10, rate=0.9)
    _outcomes(breaker, *[ERROR] * 9)
    clock.advance(10.5)  # those nine have left the window
    assert breaker.window_counts() == (0, 0)
    _outcomes(breaker, ERROR)
    assert breaker.state is BreakerState.CLOSED, "1 outcome in the window, not 10"
    _outcomes(breaker, *[ERROR] * 9)
    assert breaker.state is BreakerState.OPEN


def test_window_slides_rather_than_resetting_in_steps() -> None:
    breaker, clock = _breaker(window=10, min_requests=10, rate=0.9)
    _outcomes(breaker, *[ERROR] * 5)
    clock.advance(5)
    _outcomes(breaker, *[ERROR] * 4)
    clock.advance(4)  # the first five are 9 s old: still inside
    assert breaker.window_counts() == (9, 9)
    _outcomes(breaker, ERROR)
    assert breaker.state is BreakerState.OPEN


def test_last_serving_replica_is_never_ejected_for_5xx_answers() -> None:
    breaker, _ = _breaker(min_requests=5, may_eject=False)
    _outcomes(breaker, *[ERROR] * 100)
    assert breaker.state is BreakerState.CLOSED and breaker.available()
    assert breaker.ejections == {}


def test_open_refuses_traffic_during_cooldown_and_ignores_late_outcomes() -> None:
    breaker, clock = _breaker(threshold=2, cooldown=10)
    assert breaker.acquire()  # a long request sent before the ejection
    _outcomes(breaker, TRANSPORT, TRANSPORT)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.available() and not breaker.acquire()
    breaker.record(ANSWER)  # it finishes well: no news about the replica now
    assert breaker.state is BreakerState.OPEN
    clock.advance(9.9)
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()


def test_half_open_after_cooldown_with_a_single_probe_that_closes_on_an_answer() -> None:
    breaker, clock = _breaker(threshold=1, cooldown=10)
    _outcomes(breaker, TRANSPORT)
    clock.advance(10)
    assert breaker.state is BreakerState.HALF_OPEN and breaker.available()
    assert breaker.acquire(), "the first request after the cooldown is the probe"
    assert not breaker.available() and not breaker.acquire(), "only one probe at a time"
    breaker.record(ANSWER)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.acquire() and breaker.acquire()  # closed: everything flows again


def test_failed_probe_reopens_for_a_full_cooldown() -> None:
    breaker, clock = _breaker(threshold=2, cooldown=5)
    _outcomes(breaker, TRANSPORT, TRANSPORT)
    clock.advance(5)
    _outcomes(breaker, TRANSPORT)  # one failed probe re-opens, regardless of the threshold
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()
    clock.advance(4.9)
    assert breaker.state is BreakerState.OPEN
    clock.advance(0.1)
    assert breaker.state is BreakerState.HALF_OPEN and breaker.acquire()


@pytest.mark.parametrize(("others_serving", "after"), [(True, BreakerState.OPEN), (False, BreakerState.CLOSED)])
def test_probe_answered_5xx_reopens_only_while_another_replica_serves(
    others_serving: bool, after: BreakerState
) -> None:
    breaker, clock = _breaker(cooldown=5, min_requests=3)
    _outcomes(breaker, ERROR, ERROR, ERROR)
    assert breaker.state is BreakerState.OPEN
    clock.advance(5)
    breaker.may_eject_for_errors = lambda: others_serving
    _outcomes(breaker, ERROR)
    assert breaker.state is after


def test_released_probe_lets_another_probe_through() -> None:
    # A probe whose client left proved nothing: the next request may probe instead.
    breaker, clock = _breaker(threshold=1, cooldown=1)
    _outcomes(breaker, TRANSPORT)
    clock.advance(1)
    assert breaker.acquire()
    breaker.release()
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.acquire()


def test_return_to_service_closes_an_open_breaker_at_once() -> None:
    breaker, _ = _breaker(threshold=1, cooldown=3600)
    _outcomes(breaker, TRANSPORT)
    breaker.return_to_service()
    assert breaker.state is BreakerState.CLOSED and breaker.acquire()


def test_return_to_service_keeps_the_window_of_a_closed_breaker() -> None:
    # Health checks pass every few seconds; they must not wipe the evidence a window is gathering.
    breaker, _ = _breaker(min_requests=10)
    _outcomes(breaker, *[ERROR] * 9)
    breaker.return_to_service()
    _outcomes(breaker, ERROR)
    assert breaker.state is BreakerState.OPEN


def test_breaker_cooldown_follows_the_injected_clock_not_wall_time() -> None:
    # Guard for the tests above: they rely on the injected clock being the only time source.
    breaker, _clock = _breaker(threshold=1, cooldown=0.001, window=0.001)
    _outcomes(breaker, TRANSPORT)
    time.sleep(0.01)
    assert breaker.state is BreakerState.OPEN


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
    r1.breaker.record(Outcome.TRANSPORT)  # threshold 1: open
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


def test_pool_ejects_for_5xx_answers_only_while_another_replica_serves() -> None:
    # Real pool wiring: every replica of a backend answers 5xx to everything; all but one are ejected.
    config = BackendConfig(name="b", replicas=("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"),
                           models=({"name": "m"},))  # type: ignore[arg-type]
    pool = BackendPool([config], BreakerConfig(min_requests=5, cooldown=60))
    r0, r1 = pool.backends[0].replicas
    for _ in range(50):
        for replica in (r0, r1):
            if replica.breaker.acquire():
                replica.breaker.record(Outcome.ERROR_ANSWER)
    assert sorted([r0.breaker.state, r1.breaker.state]) == [BreakerState.CLOSED, BreakerState.OPEN]
    assert pool.backends[0].pick() is not None, "the backend still has a replica to serve from"


def test_pool_does_not_count_an_unhealthy_replica_as_serving() -> None:
    config = BackendConfig(name="b", replicas=("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"),
                           models=({"name": "m"},))  # type: ignore[arg-type]
    pool = BackendPool([config], BreakerConfig(min_requests=5, cooldown=60))
    r0, r1 = pool.backends[0].replicas
    r1.healthy = False  # marked down by health checks: r0 is the last one serving
    for _ in range(50):
        r0.breaker.record(Outcome.ERROR_ANSWER)
    assert r0.breaker.state is BreakerState.CLOSED
    r1.healthy = True
    r0.breaker.record(Outcome.ERROR_ANSWER)
    assert r0.breaker.state is BreakerState.OPEN, "with r1 back, r0's failure rate ejects it"


@pytest.mark.parametrize(("breaker", "key"), [
    ({"failure_rate": 1.5}, "breaker.failure_rate"),
    ({"failure_rate": 0}, "breaker.failure_rate"),
    ({"min_requests": 0}, "breaker.min_requests"),
    ({"window": 0}, "breaker.window"),
    ({"error_threshold": 3}, "breaker.error_threshold"),  # unknown keys are errors
])
def test_breaker_config_is_validated(breaker: dict[str, object], key: str) -> None:
    backend = {"name": "b", "base_url": "http://127.0.0.1:8000/v1", "models": [{"name": "m"}]}
    assert parse_config({"backends": [backend]}).breaker == BreakerConfig()
    with pytest.raises(ConfigError, match=re.escape(key)):
        parse_config({"backends": [backend], "breaker": breaker})


def test_breaker_config_defaults() -> None:
    config = BreakerConfig()
    assert (config.failure_threshold, config.cooldown) == (5, 15.0)
    assert (config.window, config.min_requests, config.failure_rate) == (30.0, 20, 0.9)


def test_request_ids_are_unique_and_sort_by_the_time_they_were_issued() -> None:
    # Time-ordered ids keep the stores' unique index on request_id appending at its end (a random id
    # dirtied a random index page per request: twice the insert cost at 300k rows).
    batches = []
    for _ in range(3):
        batches.append([new_request_id() for _ in range(20_000)])
        time.sleep(0.002)
    ids = [i for batch in batches for i in batch]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"psm-[0-9a-f]{32}", i) for i in ids)
    assert max(batches[0]) < min(batches[1]) and max(batches[1]) < min(batches[2])
    issued_ms = int(ids[0][4:16], 16)
    assert abs(issued_ms - time.time() * 1000) < 60_000
