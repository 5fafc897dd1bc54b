"""What the gateway says to clients and writes to its log about text it did not write itself:
client text is echoed short and digit-masked, upstream failures in the gateway's own words with the
library's detail in the (rate-limited) log."""

from __future__ import annotations

import logging

import pytest

from gateway.upstream import UpstreamFailure
from gateway.upstream_log import UpstreamFailureLog
from policies.echo import ECHO_CHARS, client_echo, masked_prefix


@pytest.mark.parametrize(("text", "expected"), [
    ("gpt-4o-minii", "'gpt-#o-minii' (digits masked)"),
    ("auto2", "'auto#' (digits masked)"),
    ("my-model", "'my-model'"),
    ("", "''"),
])
def test_short_client_text_is_echoed_with_digits_masked(text: str, expected: str) -> None:
    assert client_echo(text) == expected


def test_long_client_text_keeps_a_short_prefix_and_says_how_long_it_was() -> None:
    card = "4111 1111 1111 1111 " + "the rest of a pasted prompt " * 400
    echoed = client_echo(card)
    assert echoed.startswith("'#### #### #### ####") and "4111" not in echoed
    assert f"({len(card):,} chars, digits masked)" in echoed
    assert len(echoed) < ECHO_CHARS + 60
    assert masked_prefix(card) == "#### #### #### #### the rest of "[:ECHO_CHARS]


def test_unicode_digits_are_masked_too_and_non_strings_are_named_by_type() -> None:
    assert "４" not in client_echo("４１１１")  # full-width digits
    assert client_echo(12345678) == "a number"
    assert client_echo([1, 2]) == "an array" and client_echo(None) == "null" and client_echo({"a": 1}) == "an object"


def test_upstream_failures_are_logged_with_detail_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    failures = UpstreamFailureLog(interval=5.0, clock=lambda: now[0])
    failure = UpstreamFailure("connect", "could not connect to the upstream",
                              detail="ClientConnectorError: Cannot connect to host 10.0.0.5:8000")
    with caplog.at_level(logging.WARNING, logger="pointsman.upstream"):
        for _ in range(50):  # an outage: every request fails the same way
            failures.note(failure, backend="vllm", replica="http://10.0.0.5:8000/v1", model="llama")
        now[0] += 6.0
        failures.note(failure, backend="vllm", replica="http://10.0.0.5:8000/v1", model="llama")
        failures.note(failure, backend="vllm", replica="http://10.0.0.6:8000/v1", model="llama")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "10.0.0.5:8000" in lines[0] and "could not connect" in lines[0]
    assert "(+49 more like it since the last report)" in lines[1]
    assert "10.0.0.6" in lines[2]
