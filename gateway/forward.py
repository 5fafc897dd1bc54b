"""Executes a plan: replica choice, retries with back-off and jitter, ordered fallbacks.

Everything here happens before the client has received a byte, which is what makes retrying safe.
A streamed response is "opened" only once its first body chunk has arrived, so an upstream that
answers 200 and then hangs is still retried.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from classifiers.offload import replace_model
from gateway.balancing import Affinity, Choice, affinity_of
from gateway.config import ModelConfig, RetryConfig
from gateway.errors import (
    PointsmanError,
    RateLimitError,
    ServiceUnavailableError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.metrics import Metrics
from gateway.pool import BackendPool, ModelTarget, Replica
from gateway.stream_start import error_status, read_stream_start
from gateway.trace import RequestTrace
from gateway.tracing import Tracer
from gateway.upstream import RETRYABLE_STATUSES, UpstreamClient, UpstreamFailure, UpstreamResponse
from gateway.upstream_log import failure_log
from gateway.usage import usage_from_body
from policies.echo import masked_prefix


@dataclass(slots=True)
class Completed:
    """A fully-read upstream response (any status the client should see as-is)."""

    status: int
    body: bytes
    content_type: str
    target: ModelTarget
    replica: Replica
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(slots=True)
class OpenedStream:
    """A streaming upstream response whose first chunk has arrived; the caller must ``finish`` it."""

    response: UpstreamResponse
    first_chunk: bytes
    target: ModelTarget
    replica: Replica
    load_tokens: int = 0  # what this request added to the replica's tokens in flight
    content_type: str = "text/event-stream"  # the upstream's, when it can be sent on as a header
    _finished: bool = False

    def finish(self, *, ok: bool, failure: UpstreamFailure | None = None, reuse: bool = True) -> None:
        """Release the replica slot and tell its breaker how the stream ended (idempotent).

        ``reuse=False`` drops the connection even after a good stream (its body was not drained).
        """
        if self._finished:
            return
        self._finished = True
        self.replica.outstanding -= 1
        self.replica.tokens_in_flight -= self.load_tokens
        if ok:
            if reuse:
                self.response.release()
            else:
                self.response.close()
            self.replica.breaker.record_success()
        else:
            self.response.close()
            if failure is not None:
                self.replica.breaker.record(failure.outcome)
            else:
                self.replica.breaker.release()


class Forwarder:
    """Sends one request along a plan's candidate models until one answers."""

    def __init__(
        self, pool: BackendPool, client: UpstreamClient, retry: RetryConfig, metrics: Metrics,
        tracer: Tracer | None = None,
    ) -> None:
        self.tracer = tracer  # a pointsman.upstream span per attempt (inside a traced request)
        self._pool = pool
        self._client = client
        self._retry = retry
        self._metrics = metrics
        self._random = random.Random()

    async def forward(
        self,
        *,
        path: str,
        body: Mapping[str, Any],
        raw_body: bytes,
        candidates: Sequence[str],
        stream: bool,
        trace: RequestTrace,
    ) -> Completed | OpenedStream:
        """Try each candidate model in order (with retries); raise a :class:`PointsmanError` if all fail."""
        last_failure: UpstreamFailure | None = None
        no_replica: PointsmanError | None = None
        previous: str | None = None
        affinities: dict[tuple[str, int], Affinity] = {}  # per (partition, block size): computed once
        for name in candidates:
            target = self._pool.get(name)
            if target is None:  # plans are validated against the pool at start-up; defensive only
                continue
            if previous is not None:
                self._metrics.fallbacks.labels(trace.route or "", previous, name).inc()
            previous = name
            trace.model, trace.backend = target.name, target.backend.name
            payload = _payload(body, raw_body, target.model)
            headers = _upstream_headers(target)
            tried: list[Replica] = []
            backend = target.backend
            affinity = affinity_of(backend.policy, backend.config.balancing, raw_body, trace.tenant,
                                   trace.session_id, body, affinities)
            for attempt in range(self._retry.attempts):
                choice = backend.choose(exclude=tried, affinity=affinity)
                replica = None if choice is None else cast(Replica, choice.replica)
                if replica is None or not replica.breaker.acquire():
                    no_replica = (
                        RateLimitError(
                            f"every replica of backend {target.backend.name!r} is at its concurrency limit",
                            headers={"Retry-After": "1"},
                        )
                        if target.backend.saturated()
                        else ServiceUnavailableError(
                            f"no healthy replica of backend {target.backend.name!r} for model {name!r}"
                        )
                    )
                    break
                assert choice is not None
                tried.append(replica)
                backend.placed(choice, affinity)
                trace.replica = replica.base_url
                if backend.policy.name != "least_outstanding":
                    trace.decision["replica"] = choice.describe(backend.policy.name)
                trace.attempts += 1
                if attempt > 0:
                    self._metrics.retries.labels(target.backend.name, name).inc()
                try:
                    if self.tracer is not None and self.tracer.active():
                        return await self._traced_attempt(
                            path, payload, headers, target, choice, stream, trace, trace.attempts
                        )
                    return await self._attempt(path, payload, headers, target, choice, stream, trace)
                except UpstreamFailure as failure:
                    last_failure = failure
                    self._metrics.upstream_errors.labels(target.backend.name, name, failure.kind).inc()
                    failure_log.note(failure, backend=target.backend.name, replica=replica.base_url, model=name)
                    if not await self._backoff(attempt, failure, trace):
                        break
        if last_failure is not None:
            raise _client_error(last_failure, trace.attempts)
        if no_replica is not None:
            raise no_replica
        raise ServiceUnavailableError("no configured model could serve this request")

    async def _traced_attempt(
        self,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        target: ModelTarget,
        choice: Choice,
        stream: bool,
        trace: RequestTrace,
        attempt: int,
    ) -> Completed | OpenedStream:
        """:meth:`_attempt` inside a ``pointsman.upstream`` span, its ``traceparent`` sent upstream.
        A stream's span ends when its first chunk has arrived (the attempt succeeded)."""
        tracer = self.tracer
        assert tracer is not None
        replica = cast(Replica, choice.replica)
        attributes = {
            "pointsman.model": target.name, "pointsman.backend": target.backend.name,
            "pointsman.replica": replica.base_url, "pointsman.attempt": attempt, "pointsman.stream": stream,
        }
        with tracer.span("pointsman.upstream", attributes) as span:
            sent = dict(headers)
            tracer.inject(sent)
            try:
                result = await self._attempt(path, payload, sent, target, choice, stream, trace)
            except UpstreamFailure as failure:
                span.set_attribute("pointsman.failure", failure.kind)
                if failure.status is not None:
                    span.set_attribute("pointsman.status", failure.status)
                raise
            span.set_attribute("pointsman.status", 200 if isinstance(result, OpenedStream) else result.status)
            return result

    async def _attempt(
        self,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        target: ModelTarget,
        choice: Choice,
        stream: bool,
        trace: RequestTrace,
    ) -> Completed | OpenedStream:
        timeouts = target.backend.config.timeouts
        replica = cast(Replica, choice.replica)
        tokens = choice.load_tokens
        replica.outstanding += 1
        replica.tokens_in_flight += tokens
        started = time.perf_counter()
        response: UpstreamResponse | None = None
        handed_over = False
        try:
            response = await self._client.post(replica.request_url + path, payload, headers, timeouts)
            if stream and response.status == 200:
                if not response.content_type.lower().startswith("text/event-stream"):
                    # Passing it on would hand the client a "stream" with no events and no error.
                    raise UpstreamFailure("malformed", "the upstream answered a stream request without an event stream")
                remaining = timeouts.first_byte - (time.perf_counter() - started)
                first = await response.next_chunk(timeout=max(remaining, 0.0))
                if not first:
                    raise UpstreamFailure("malformed", "upstream closed the stream before sending any data")
                start = await read_stream_start(response, first, started + timeouts.first_byte)
                if start.error is not None:
                    refused = _refused_stream(start.error, response, target, replica)  # raises when retryable
                    replica.breaker.record_success()
                    return refused
                first = start.held
                handed_over = True
                replica.breaker.stream_began()  # a half-open probe has its answer
                return OpenedStream(
                    response=response, first_chunk=first, target=target, replica=replica, load_tokens=tokens,
                    content_type=_content_type(response.content_type, "text/event-stream"),
                )
            data = raw_data = await response.read_all()
            prompt_tokens = completion_tokens = None
            if 200 <= response.status < 300:
                prompt_tokens, completion_tokens = _parse_success(data)
            else:
                data = _client_error_body(response.status, data)
            response.release()
            replica.breaker.record_success()
            return Completed(
                status=response.status,
                body=data,
                content_type=(_content_type(response.content_type, "application/json")
                              if data is raw_data else "application/json"),
                target=target,
                replica=replica,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        except UpstreamFailure as failure:
            if response is not None:
                response.close()
            replica.breaker.record(failure.outcome)
            raise
        except BaseException:
            # Cancellation (client went away) or a bug: drop the connection so the upstream stops.
            if response is not None:
                response.close()
            replica.breaker.release()
            raise
        finally:
            trace.upstream_seconds += time.perf_counter() - started
            if not handed_over:
                replica.outstanding -= 1
                replica.tokens_in_flight -= tokens

    async def _backoff(self, attempt: int, failure: UpstreamFailure, trace: RequestTrace) -> bool:
        """Sleep before the next attempt on the same model; False means move on to the next model."""
        if attempt + 1 >= self._retry.attempts or not failure.retryable:
            return False  # a 401 from this model's backend will not change: try the next model
        if failure.retry_after is not None and failure.retry_after > self._retry.respect_retry_after_max:
            return False  # the upstream asked for a longer pause than we will hold a client for
        delay = min(self._retry.backoff_max, self._retry.backoff_base * (2**attempt))
        delay *= 0.5 + self._random.random() / 2  # jitter: spread retries of concurrent requests
        if failure.retry_after is not None:
            delay = max(delay, failure.retry_after)
        started = time.perf_counter()
        await asyncio.sleep(delay)
        trace.upstream_seconds += time.perf_counter() - started
        return True


def _payload(body: Mapping[str, Any], raw: bytes, model: ModelConfig) -> bytes:
    """The bytes to send to ``model``: ``raw`` itself when it names that model already, else ``raw`` with
    the model swapped when it starts with the model field (as the gateway's own re-encodings do; parsing
    refused repeated keys, so that field is the one), else ``body`` re-encoded. A model whose API refuses
    some fields (``drop_params``) or takes its completion bound under another name (``max_tokens_field``)
    gets the body re-encoded without them / with that name."""
    wire_name = model.wire_name
    adapted = _adapted(body, model)
    if adapted is not None:
        return orjson.dumps({**adapted, "model": wire_name})
    named = body.get("model")
    if named == wire_name:
        return raw
    if isinstance(named, str):
        swapped = replace_model(raw, named, wire_name)
        if swapped is not None:
            return swapped
    return orjson.dumps({**body, "model": wire_name})


#: Each name of the completion bound, and the other one.
_OTHER_BOUND = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}


def _adapted(body: Mapping[str, Any], model: ModelConfig) -> dict[str, Any] | None:
    """``body`` as ``model``'s API takes it, or None when it takes it as it is."""
    dropped = [name for name in model.drop_params if name in body]
    renamed = _completion_bound_renamed(body, model.max_tokens_field)
    if not dropped:
        return renamed
    return {key: value for key, value in (body if renamed is None else renamed).items() if key not in dropped}


def _completion_bound_renamed(body: Mapping[str, Any], field: str | None) -> dict[str, Any] | None:
    """``body`` with its completion bound under ``field`` (None when there is nothing to rename).

    Derived requests (a judge's, a workflow step's) say ``max_tokens``, as do older clients; OpenAI's
    reasoning models answer that with a 400. Given both names, the smaller bound is kept.
    """
    if field is None or (other := _OTHER_BOUND[field]) not in body:
        return None
    renamed = {key: value for key, value in body.items() if key != other}
    bound, given = body[other], renamed.get(field)
    if isinstance(given, int) and isinstance(bound, int) and given <= bound:
        return renamed
    renamed[field] = bound
    return renamed


def _upstream_headers(target: ModelTarget) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if target.backend.auth_header:
        headers["Authorization"] = target.backend.auth_header
    return headers


def _parse_success(data: bytes) -> tuple[int | None, int | None]:
    """Usage from a 2xx answer, which must be a JSON object that is not an error object (some proxies
    answer 200 with ``{"error": ...}``; passed on, the SDK built an empty completion from it)."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamFailure("malformed", "upstream returned a body that is not valid JSON") from exc
    if not isinstance(parsed, dict):
        raise UpstreamFailure("malformed", "upstream returned JSON that is not an object")
    if parsed.get("error"):
        raise UpstreamFailure("malformed", "upstream answered a success status with an error object")
    return usage_from_body(parsed)


#: Statuses that are about the gateway's own credentials for the backend, never about the client.
_CREDENTIAL_STATUSES = frozenset({401, 403, 407})


def _refused_stream(
    error: Mapping[str, Any], response: UpstreamResponse, target: ModelTarget, replica: Replica
) -> Completed:
    """A stream whose first data event was an error object, before anything was sent to the client: the
    upstream's refusal of the request (a 4xx) as a plain error answer, as without ``stream``; anything
    else raises an :class:`UpstreamFailure` of its status, so it is retried or falls back."""
    status, code = error_status(error), error.get("code")
    # The code is upstream text about the client's request: a short prefix, digits masked (as a stream's
    # later error event's is in the record).
    said = f", code {masked_prefix(str(code))}" if isinstance(code, (str, int)) and code != status else ""
    message = f"the upstream's stream began with an error event (HTTP {status}{said})"
    if not 400 <= status < 500 or status in RETRYABLE_STATUSES or status in _CREDENTIAL_STATUSES:
        raise UpstreamFailure("status", message, status=status)
    response.close()  # the rest of the stream is not read: the connection is not reused
    return Completed(status=status, body=orjson.dumps({"error": error}), content_type="application/json",
                     target=target, replica=replica, prompt_tokens=None, completion_tokens=None)


def _client_error_body(status: int, data: bytes) -> bytes:
    """The body to pass on with a non-2xx answer (a 4xx: 429 and 408 are retried before this), or
    an :class:`UpstreamFailure` for one that must not reach the client.

    A 401/403/407 refuses the gateway's key for the backend: passed on, it told the client its own
    key was wrong, and its message can quote part of the backend's key; it goes to the next model,
    if any, then ends in a 502. Any other status that is not a 4xx (a redirect) is no answer either.
    A 4xx whose body is not an OpenAI error object (an HTML page from a proxy, a framework's
    ``{"detail": ...}``) keeps its status with the gateway's OpenAI-shaped error instead of a body
    the client's SDK cannot read.
    """
    if status in _CREDENTIAL_STATUSES:
        raise UpstreamFailure("status", f"the upstream refused the gateway's credentials (HTTP {status})",
                              status=status)
    if not 400 <= status < 500:
        raise UpstreamFailure("status", f"upstream answered HTTP {status}", status=status)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return data
    message = f"the upstream refused the request with HTTP {status} and no OpenAI error object"
    return PointsmanError(message, status=status, error_type="upstream_error", code=f"upstream_{status}").to_json()


def _content_type(value: str, default: str) -> str:
    """The upstream's Content-Type if it can be sent on as a header (latin-1), else ``default``:
    one with other characters failed the response with a 500 and lost its record."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return default
    return value


def _client_error(failure: UpstreamFailure, attempts: int) -> PointsmanError:
    """Translate the last upstream failure into what the client sees."""
    detail = f"{failure.message} (after {attempts} attempt{'s' if attempts != 1 else ''})"
    if failure.kind == "status" and failure.status == 429:
        headers = {}
        if failure.retry_after is not None:
            headers["Retry-After"] = str(max(int(failure.retry_after + 0.999), 1))
        return RateLimitError(f"upstream rate limit: {detail}", headers=headers)
    if failure.kind in ("connect_timeout", "first_byte_timeout", "total_timeout", "idle_timeout"):
        return UpstreamTimeoutError(f"upstream timed out: {detail}")
    return UpstreamError(f"upstream failed: {detail}")
