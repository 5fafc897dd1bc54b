"""/metrics as Prometheus reads it: a gateway subprocess scraped after real requests, parsed with
prometheus_client's own text parser (types and values, not substrings)."""

from __future__ import annotations

import httpx
import openai
from openai import OpenAI
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.gatewayproc import GatewayProcess

MESSAGES = [{"role": "user", "content": "hello"}]


def scrape(gateway: GatewayProcess) -> dict[str, Metric]:
    """Every metric family the gateway exports, by family name (a counter's name without ``_total``)."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict[str, Metric], name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels`` (0 when the series does not exist yet)."""
    for family in families.values():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


#: What only goes up since start (a rate() or increase() of it is meaningful): exported as counters.
MONOTONIC = (
    "pointsman_decision_log_written", "pointsman_decision_log_dropped", "pointsman_decision_log_write_errors",
    "pointsman_implicit_feedback_reask", "pointsman_implicit_feedback_regenerate",
    "pointsman_implicit_feedback_finish_length", "pointsman_implicit_feedback_upstream_error",
    "pointsman_feedback_written", "pointsman_feedback_failed", "pointsman_feedback_batches",
)
#: What goes up and down: gauges.
LEVELS = ("pointsman_decision_log_pending", "pointsman_feedback_pending", "pointsman_in_flight_requests")


def test_monotonic_values_are_counters_and_levels_are_gauges(gateway: GatewayProcess, client: OpenAI) -> None:
    before = scrape(gateway)
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES)
    gateway.decision(raw.headers["x-pointsman-request-id"])  # written: the batch writer counted it
    families = scrape(gateway)
    kinds = {name: families[name].type for name in (*MONOTONIC, *LEVELS) if name in families}
    assert kinds == {**dict.fromkeys(MONOTONIC, "counter"), **dict.fromkeys(LEVELS, "gauge")}
    written = "pointsman_decision_log_written_total"
    assert sample(families, written) >= sample(before, written) + 1
    assert sample(families, "pointsman_decision_log_dropped_total") == 0


def _stream(client: OpenAI, model: str) -> str:
    """Stream ``model``'s answer to its end (or its error event); the request's id."""
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=MESSAGES, stream=True
    ) as response:
        request_id = response.headers["x-pointsman-request-id"]
        try:
            for _chunk in response.parse():
                pass
        except openai.APIError:
            pass  # the error event a broken stream ends with
    return request_id


def test_a_stream_that_breaks_after_its_200_is_counted_as_a_stream_error(
    gateway: GatewayProcess, client: OpenAI
) -> None:
    # The client got status 200 and then an error event: status stays what was sent, the outcome
    # label says the answer broke, so an error rate over outcome sees it.
    broken = ("fake-reset-midstream", "fake-stall-midstream")  # upstream dies; upstream idle timeout
    requests = "pointsman_requests_total"
    before = scrape(gateway)
    for model in (*broken, "fake-ok"):
        gateway.decision(_stream(client, model))  # recorded: its metrics were counted with it
    after = scrape(gateway)
    assert after[requests.removesuffix("_total")].type == "counter"

    def delta(model: str, outcome: str) -> float:
        labels = {"route": "direct", "model": model, "backend": "fake", "status": "200", "outcome": outcome}
        return sample(after, requests, **labels) - sample(before, requests, **labels)

    assert [(delta(m, "stream_error"), delta(m, "ok")) for m in broken] == [(1, 0), (1, 0)]
    assert (delta("fake-ok", "ok"), delta("fake-ok", "stream_error")) == (1, 0)
    # Their durations too: a broken stream's (cut short) is not among the answered ones' quantiles.
    durations = "pointsman_request_duration_seconds_count"

    def timed(model: str, outcome: str) -> float:
        labels = {"route": "direct", "model": model, "backend": "fake", "outcome": outcome}
        return sample(after, durations, **labels) - sample(before, durations, **labels)

    assert [(timed(m, "stream_error"), timed(m, "ok")) for m in broken] == [(1, 0), (1, 0)]
    assert (timed("fake-ok", "ok"), timed("fake-ok", "stream_error")) == (1, 0)
