"""The proxy service: what happens to one OpenAI request, from bytes in to decision record out.

Route handlers in ``gateway.app`` stay thin and call :meth:`ProxyService.handle`. The service owns
the request's lifecycle: auth, body limits, parsing, the routing decision (a concrete model goes
straight to its backend; a virtual route asks its policy for a plan), forwarding, response headers,
metrics and the decision record.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from classifiers.offload import ScanPool, ScanUnavailable, redact, with_model_first
from gateway.auth import KeyChecker
from gateway.cache import CacheLookup, ResponseCache, cache_headers
from gateway.client_gone import SCOPE_KEY as CLIENT_GONE
from gateway.client_gone import ClientGone
from gateway.config import Config
from gateway.direct import dedupe, direct_plans, explain_direct
from gateway.errors import ModelNotFoundError, PointsmanError, ServiceUnavailableError
from gateway.feedback import IssuedIds
from gateway.followups import Followups, Served
from gateway.forward import Completed, Forwarder, OpenedStream
from gateway.http_protocol import DISCONNECTED, STALLED, WRITTEN_KEY
from gateway.logs import request_id as current_request_id
from gateway.metrics import Metrics
from gateway.pool import BackendPool
from gateway.protocol import (
    CHAT,
    COMPLETIONS,
    ClientDisconnected,
    Endpoint,
    decode_body_off_loop,
    read_body,
    validate_request,
)
from gateway.responses import error_response, gateway_headers, json_response, new_request_id
from gateway.streaming import ProxyStream
from gateway.trace import RequestTrace
from gateway.tracing import Tracer, trace_signals
from gateway.upstream import UpstreamClient
from gateway.usage import SSEUsageScanner, cost_usd
from gateway.workflows import WorkflowDone, WorkflowRunner
from policies import Plan, Policy, PolicyError, RequestContext
from policies.brain import ActiveRouter, explain_policy, request_context
from policies.echo import client_echo, masked_prefix
from policies.knob import REQUEST_FIELD
from policies.sticky import SESSION_HEADER
from policies.workflows import workflow_models
from store.recorder import DecisionRecorder
from store.records import DecisionRecord

if TYPE_CHECKING:  # the runtime (and the statistics it imports) loads only when experiments are configured
    from gateway.experiments import Assignment, ExperimentRuntime
    from gateway.quota import Quotas

log = logging.getLogger("pointsman.service")
T = TypeVar("T")

DIRECT_ROUTE = "direct"  # the x-pointsman-route value when a concrete model was requested


class ProxyService:
    """Serves the OpenAI endpoints for one configuration."""

    def __init__(
        self,
        config: Config,
        pool: BackendPool,
        client: UpstreamClient,
        metrics: Metrics,
        recorder: DecisionRecorder,
        policies: Mapping[str, Policy],
        scan_pool: ScanPool | None = None,
        router: ActiveRouter | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self.recorder = recorder
        self.keys = KeyChecker(config.auth.api_keys)
        # OpenTelemetry (gateway.tracing): None when tracing is off, and then no span is ever made.
        self.tracer = tracer
        self.forwarder = Forwarder(pool, client, config.retry, metrics, tracer)
        self.draining = False
        self.policies: dict[str, Policy] = dict(policies)
        if tracer is not None:
            trace_signals(self.policies.values(), tracer)
        self.scan_pool = scan_pool
        # The router version (registry promotions swap it): every decision is pinned to one.
        self.router = router
        # A/B experiments (:meth:`use_experiments`): which arm's policy decides a request of a route that
        # has one, and the shadow arms.
        self.experiments: ExperimentRuntime | None = None
        self._experiment_routes: frozenset[str] = frozenset()
        # Rate limits and spend budgets (:meth:`use_quotas`; None when none is configured).
        self.quotas: Quotas | None = None
        # Request ids answered recently, with their tenant: /v1/feedback knows them before the
        # batch writer has flushed their decision records.
        self.issued = IssuedIds(config.feedback.recent_ids)
        # Conversation capture, implicit feedback and comparisons (the eval loop's share of serving).
        self.followups = Followups(config, self.forwarder, pool, recorder)
        # Cascades, fusions, ratings and graphs: their sub-calls go through the same forwarder.
        self.workflows = WorkflowRunner(config, self.forwarder, pool, metrics, recorder)
        # The routes' opt-in response cache (gateway/cache/): looked up once the forwarded body is known.
        self.cache = ResponseCache(config, metrics.registry)
        # Plans for concrete model names never change: built once (a workflow's virtual model is one
        # more name a client may send).
        self._direct_plans = direct_plans(config)
        self._workflow_models = workflow_models(config.workflows)

    def use_quotas(self, quotas: Quotas) -> None:
        """Reserve every request's rate limits and budgets before forwarding, settle them after."""
        self.quotas = quotas

    def use_experiments(self, experiments: ExperimentRuntime) -> None:
        """Serve the routes of ``experiments`` through their arms (the runtime needs this service's forwarder)."""
        self.experiments = experiments
        self._experiment_routes = experiments.routes

    def authenticate(self, request: Request) -> str | None:
        """Tenant of the request's API key (None when auth is off); raises 401."""
        return self.keys.tenant_for(request.headers.get("authorization"))

    async def handle(self, request: Request, endpoint: Endpoint) -> Response | ProxyStream:
        """Serve one proxied OpenAI request; every outcome ends in exactly one decision record."""
        request_id = new_request_id()
        current_request_id.set(request_id)  # every log line of this request carries its id
        trace = RequestTrace(request_id=request_id, endpoint=endpoint.name)
        tracer = self.tracer
        if tracer is None:
            return await self._handle(request, endpoint, trace)
        # The request's span: current while it is decided and forwarded, ended by _finish (for a
        # stream, once its last byte is sent).
        trace.span = tracer.start("pointsman.request", {"pointsman.endpoint": endpoint.name,
                                                        "pointsman.request_id": request_id}, request.headers)
        trace.trace_id = tracer.trace_id(trace.span)
        with tracer.current(trace.span):
            return await self._handle(request, endpoint, trace)

    async def _handle(self, request: Request, endpoint: Endpoint, trace: RequestTrace) -> Response | ProxyStream:
        self.metrics.in_flight.inc()
        streaming = False
        trace.session_id = request.headers.get(SESSION_HEADER)
        served = Served(trace=trace)
        response: Response | None = None
        answer: bytes | None = None
        joined: RequestContext | None = None  # the request's context, when shadow arms will decide on it too
        try:
            if self.draining:
                raise ServiceUnavailableError("the gateway is shutting down", headers={"Retry-After": "1"})
            trace.tenant = self.authenticate(request)
            upload_started = time.perf_counter()
            try:
                raw = await self._read_body(request)
            finally:  # a slow client's upload is its time, not the gateway's overhead
                trace.client_seconds += time.perf_counter() - upload_started
            body = validate_request(await decode_body_off_loop(raw, self.scan_pool), endpoint)
            served.decided, served.size = body, len(raw)
            trace.stream = bool(body.get("stream"))
            with self._pinned_router(trace):
                plan, joined = await self._plan(request, endpoint, body, trace, raw)
            if self.quotas is not None:  # 429 when a limit or budget is exhausted (the plan prices it)
                trace.quota = await self.quotas.reserve(
                    trace.tenant, body["model"], plan.candidates[0], plan.workflow, body, len(raw)
                )
            if plan.redact:
                # The policy asked to strip PII before the request leaves the gateway (and the
                # gateway's own namespace, e.g. a threshold override, never goes upstream).
                redacted, raw = await redact(self.scan_pool, body, raw, plan.redact, drop=(REQUEST_FIELD,))
                body = redacted  # what every later reader gets: never the unredacted request
            elif REQUEST_FIELD in body:
                body = {k: v for k, v in body.items() if k != REQUEST_FIELD}
                raw = with_model_first(body)
            served.forwarded = body
            await self.followups.decided(served, plan.signals)
            cached: CacheLookup | None = None
            if self.cache.enabled:
                cached = await self.cache.lookup(trace, plan, endpoint.name, body)
                if cached is not None and cached.hit is not None:
                    response = self._cached(cached, trace, body)  # no upstream call
                    return response
            if plan.workflow is not None:
                done = await self._unless_disconnected(
                    request, self.workflows.run(plan.workflow, endpoint, body, trace)
                )
                if done is None:
                    trace.outcome, trace.status = "client_disconnected", 499
                    return Response(status_code=499)
                if done.opened is not None:
                    streaming = True
                    return self._workflow_stream(done, trace, served, joined)
                response, answer = self._workflow_answer(done, trace)
                return response
            result = await self._unless_disconnected(request, self.forwarder.forward(
                path=endpoint.path, body=body, raw_body=raw, candidates=plan.candidates,
                stream=bool(body.get("stream")), trace=trace,
            ))
            if result is None:
                trace.outcome, trace.status = "client_disconnected", 499
                return Response(status_code=499)
            if isinstance(result, OpenedStream):
                streaming = True
                trace.headers_sent_at = time.perf_counter()
                trace.status = 200
                on_done: Callable[[RequestTrace, SSEUsageScanner], None] = functools.partial(
                    self._finish_stream, served, joined
                )
                scanner = self.followups.stream_scanner(served)
                if cached is not None and cached.keys is not None:  # a miss: store the answer if it completes
                    on_done = self.cache.stream_finisher(cached, on_done)
                    scanner.keep_text()
                return ProxyStream(result, trace, self._headers(trace), on_done, scanner=scanner)
            response = self._completed(result, trace)
            answer = result.body
            if cached is not None and cached.keys is not None:
                self.cache.completed(cached, trace, answer)
            return response
        except PointsmanError as error:
            response = self._error(error, trace)
            return response
        except ScanUnavailable as exc:
            response = self._error(_scan_unavailable(exc), trace)
            return response
        except ClientDisconnected:
            trace.outcome, trace.status = "client_disconnected", 499
            return Response(status_code=499)
        except Exception:
            # A bug: the app's handler answers 500 in OpenAI's shape; the record must say so too.
            trace.status, trace.outcome, trace.error_type = 500, "error", "internal_error"
            raise
        finally:
            # A stream is finished (and leaves in_flight) when its last byte is sent; a whole answer
            # once it has left the connection's write buffer, or never will (_after_sent).
            if not streaming:
                if response is None:  # nothing to send: a client gone before its answer, a bug's 500
                    self.metrics.in_flight.dec()
                    self.followups.failed(served, self._finish(trace))
                else:
                    response.background = BackgroundTask(self._after_sent, request.scope, served, joined, answer)

    async def _after_sent(
        self, scope: Scope, served: Served, joined: RequestContext | None, answer: bytes | None
    ) -> None:
        """A whole answer was handed to the connection (it runs as the response's background task):
        once it has left, finish the request, then start what follows an answer (comparison, shadow
        arms). A client that never takes it is cut by the server's write timeout (``server.write_timeout``):
        its request is then finished as one whose client went away."""
        written = scope.get(WRITTEN_KEY)  # absent under another ASGI server: taken as written
        undelivered: str | None = None
        try:
            if callable(written):
                undelivered = await written()
        finally:  # also when cancelled (a forced shutdown): the request keeps its record
            after = self._answered(served, joined, answer, undelivered)
        for task in after:
            await task()

    def _answered(
        self, served: Served, joined: RequestContext | None, answer: bytes | None, undelivered: str | None
    ) -> list[Callable[[], Awaitable[None]]]:
        """Finish a request whose response was sent (``undelivered``: why its bytes never left, or
        None); returns what follows it."""
        trace = served.trace
        if undelivered is not None and trace.outcome == "ok":
            # Accounted as a stream its client left: no comparison (the record is not "ok"), implicit
            # feedback without an answer, shadow arms still decide (the request was served upstream).
            trace.outcome, answer = DISCONNECTED, None
            if undelivered == STALLED:
                trace.error_type = STALLED
                trace.error_message = (
                    f"the client took none of its answer for {self.config.server.write_timeout:g}s"
                )
        self.metrics.in_flight.dec()
        record = self._finish(trace)
        after: list[Callable[[], Awaitable[None]]] = []
        if answer is None:
            self.followups.failed(served, record)
        else:
            launch = self.followups.completed(served, record, answer)
            if launch is not None:
                after.append(launch)
        if joined is not None and self.experiments is not None:
            after.append(functools.partial(self.experiments.after_response, joined, record, served.forwarded))
        return after

    async def _plan(
        self, request: Request, endpoint: Endpoint, body: Mapping[str, Any], trace: RequestTrace, raw: bytes
    ) -> tuple[Plan, RequestContext | None]:
        """The request's plan and, when it is in an experiment with shadow arms, the context it was decided on."""
        model = body["model"]
        direct = self._direct_plans.get(model)
        joined: RequestContext | None = None
        assignment: Assignment | None = None
        if direct is not None:
            trace.requested_model = model
            plan = direct
        else:
            policy = self.policies.get(model)
            if policy is None:
                # Client text, not a configured name: keep (and echo) only a masked prefix of it.
                trace.requested_model = masked_prefix(model)
                raise _unknown_model(model)
            trace.requested_model = model
            trace.route = model
            ctx = self.context(request, endpoint, body, trace.request_id, trace.tenant, raw)
            if model in self._experiment_routes:
                assert self.experiments is not None
                assignment = await self.experiments.assign(model, ctx)
                if assignment is not None:
                    policy = assignment.policy
                    if self.experiments.shadowed(assignment.experiment):
                        joined = ctx  # its shadow arms decide on it once the request is served
                    trace.experiment, trace.experiment_arm = assignment.experiment, assignment.arm
                    trace.arm_propensity = assignment.propensity
                    if assignment.router_version is not None:  # the arm decides on its own router version
                        trace.router_version = assignment.router_version
            try:
                if self.tracer is None:
                    plan = await policy.decide(ctx)
                else:
                    plan = await self._traced_decide(policy, ctx)
            except PolicyError as exc:
                trace.decision = {"policy": policy.name, "blocked": exc.code}
                if assignment is not None:
                    trace.decision["experiment"] = assignment.describe()
                raise _policy_error(exc) from exc
            plan = self._with_model_fallbacks(plan)
        trace.decision = plan.describe()
        if assignment is not None:
            trace.decision["experiment"] = assignment.describe()
        trace.reason = plan.reason
        trace.signals = plan.signals
        trace.propensity = plan.details.get("propensity")
        return plan, joined

    async def _traced_decide(self, policy: Policy, ctx: RequestContext) -> Plan:
        """``policy.decide`` inside a ``pointsman.policy`` span (a block is recorded as its error)."""
        assert self.tracer is not None
        with self.tracer.span("pointsman.policy", {"pointsman.policy": policy.name}) as span:
            plan = await policy.decide(ctx)
            span.set_attributes({
                "pointsman.decision.policy": plan.policy, "pointsman.candidates": list(plan.candidates),
                "pointsman.reason": plan.reason,
                **({"pointsman.workflow": plan.workflow} if plan.workflow is not None else {}),
            })
            return plan

    @contextlib.contextmanager
    def _pinned_router(self, trace: RequestTrace) -> Iterator[None]:
        """Decide on one router version, and record which (``x-pointsman-router`` says it too)."""
        if self.router is None:
            yield
            return
        with self.router.pin() as version:
            trace.router_version = version.version
            yield

    def context(
        self,
        request: Request,
        endpoint: Endpoint,
        body: Mapping[str, Any],
        request_id: str,
        tenant: str | None,
        raw: bytes | None = None,
    ) -> RequestContext:
        """What a policy sees of this request."""
        return request_context(
            body["model"], body, request_id=request_id, endpoint=endpoint.name, tenant=tenant,
            headers=request.headers, raw_body=raw,
        )

    async def explain(self, request: Request) -> Response:
        """``POST /v1/route``: the routing decision for a request, without calling any backend."""
        request_id = new_request_id()
        current_request_id.set(request_id)
        arm_header: bytes | None = None  # x-pointsman-arm, when an experiment arm would decide
        try:
            tenant = self.authenticate(request)
            raw = await self._read_body(request)
            body = await decode_body_off_loop(raw, self.scan_pool)
            validate_request(body, CHAT if "messages" in body else COMPLETIONS)
            model = body["model"]
            direct = self._direct_plans.get(model)
            if direct is not None:
                explanation: dict[str, Any] = explain_direct(direct, self.router)
            else:
                policy = self.policies.get(model)
                if policy is None:
                    raise _unknown_model(model)
                ctx = self.context(request, CHAT, body, request_id, tenant, raw)
                assignment = None
                if model in self._experiment_routes:
                    assert self.experiments is not None
                    assignment = await self.experiments.assign(model, ctx, dry_run=True)
                if assignment is None:
                    explanation = await explain_policy(policy, ctx, self.router)
                else:
                    router = None if assignment.router_version is not None else self.router
                    explanation = await explain_policy(assignment.policy, ctx, router)
                    if assignment.router_version is not None:
                        explanation["router_version"] = assignment.router_version
                    explanation["experiment"] = assignment.describe()
                    arm_header = assignment.header
        except PointsmanError as error:
            return error_response(error, gateway_headers(request_id))
        except PolicyError as exc:
            return error_response(_policy_error(exc), gateway_headers(request_id))
        except ScanUnavailable as exc:
            return error_response(_scan_unavailable(exc), gateway_headers(request_id))
        except ClientDisconnected:
            return Response(status_code=499)
        explanation["request_id"] = request_id
        headers = gateway_headers(request_id)
        if arm_header is not None:
            headers.append((b"x-pointsman-arm", arm_header))
        return json_response(explanation, headers)

    async def _read_body(self, request: Request) -> bytes:
        server = self.config.server
        return await read_body(
            request.receive, request.headers.get("content-length"), server.max_body_bytes, server.body_timeout
        )

    def _with_model_fallbacks(self, plan: Plan) -> Plan:
        expanded: list[str] = []
        for name in plan.candidates:
            direct = self._direct_plans.get(name)
            expanded.extend(direct.candidates if direct else (name,))
        candidates = dedupe(expanded)
        if candidates == plan.candidates:
            return plan
        return dataclasses.replace(plan, candidates=candidates)

    async def _unless_disconnected(self, request: Request, work: Awaitable[T]) -> T | None:
        """Await ``work`` (forwarding, a workflow), but cancel it at once — upstream calls included —
        if the client disconnects meanwhile (then None)."""
        task = asyncio.current_task()
        assert task is not None
        disconnected = False

        def gone() -> None:
            nonlocal disconnected
            disconnected = True
            task.cancel()

        stop_watching = _on_disconnect(request, gone)  # already gone: cancelled before work's first step
        try:
            return await work
        except asyncio.CancelledError:
            if disconnected:
                task.uncancel()
                return None
            raise
        finally:
            await stop_watching()

    def _completed(self, result: Completed, trace: RequestTrace) -> Response:
        trace.status = result.status
        trace.model, trace.backend = result.target.name, result.target.backend.name
        trace.prompt_tokens, trace.completion_tokens = result.prompt_tokens, result.completion_tokens
        trace.cost_usd = cost_usd(result.target.model, result.prompt_tokens, result.completion_tokens)
        if result.status >= 400:
            trace.outcome = "error"
            trace.error_type = f"upstream_{result.status}"
        return self._buffered(trace, result.status, result.body, result.content_type)

    def _cached(self, cached: CacheLookup, trace: RequestTrace, body: Mapping[str, Any]) -> Response:
        """A cached answer, as JSON or replayed as an SSE stream when the client streams."""
        content, content_type = self.cache.serve(cached, trace, body)
        if trace.stream:
            trace.ttft_ms = trace.elapsed_ms()  # the whole answer is the first byte
        return self._buffered(trace, 200, content, content_type)

    def _workflow_answer(self, done: WorkflowDone, trace: RequestTrace) -> tuple[Response, bytes]:
        """A workflow's buffered answer (JSON, or an SSE stream when the client streams) and the
        answer as JSON for the follow-ups."""
        status, body, content_type, answer = done.body()  # also fills the record's workflow part
        trace.status = status
        if status >= 400:
            trace.outcome = "error"
            trace.error_type = f"upstream_{status}"
        elif trace.stream:
            trace.ttft_ms = trace.elapsed_ms()  # the whole answer is the first byte
        return self._buffered(trace, status, body, content_type, done.headers()), answer

    def _buffered(
        self, trace: RequestTrace, status: int, body: bytes, content_type: str,
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> Response:
        """A whole answer as one response (an upstream's, a cached one, a workflow's), with the
        gateway's headers; the headers' time is the time the gateway's work ended."""
        trace.headers_sent_at = time.perf_counter()
        response = Response(content=body, status_code=status, media_type=None)
        response.raw_headers = [
            (b"content-type", content_type.encode("latin-1")),
            (b"content-length", str(len(body)).encode()),
            *self._headers(trace),
            *extra,
        ]
        return response

    def _workflow_stream(
        self, done: WorkflowDone, trace: RequestTrace, served: Served, joined: RequestContext | None
    ) -> ProxyStream:
        """Relay a workflow's final stage, live, with the workflow's totals put into the stream."""
        assert done.final.stream is not None and done.opened is not None
        call = done.final.stream.call
        trace.model, trace.backend = call.answered or call.model, call.backend
        trace.status = 200
        trace.headers_sent_at = time.perf_counter()
        return ProxyStream(
            done.opened, trace, [*self._headers(trace), *done.headers()],
            functools.partial(self._finish_workflow_stream, served, joined, done), rewrite=done.rewriter().feed,
        )

    def _finish_workflow_stream(
        self, served: Served, joined: RequestContext | None, done: WorkflowDone, trace: RequestTrace,
        scanner: SSEUsageScanner,
    ) -> None:
        done.finish_stream(scanner)  # the record's totals, sub-calls and tree
        self._stream_done(served, joined, trace, scanner)

    def _error(self, error: PointsmanError, trace: RequestTrace) -> Response:
        trace.status = error.status
        trace.outcome = "error"
        trace.error_type = error.error_type if error.code is None else error.code
        trace.error_message = error.message
        trace.headers_sent_at = time.perf_counter()
        headers = self._headers(trace)
        workflow = self._workflow_models.get(trace.decision.get("workflow") or "")
        if workflow is not None:  # a workflow's own error (cap, timeout, no answer) names it like its answers
            headers.append((b"x-pointsman-workflow", workflow.encode()))
        return error_response(error, headers)

    def _headers(self, trace: RequestTrace) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-pointsman-request-id", trace.request_id.encode()),
            (b"x-pointsman-model", (trace.model or "").encode()),
            (b"x-pointsman-backend", (trace.backend or "").encode()),
            (b"x-pointsman-route", (trace.route or DIRECT_ROUTE).encode()),
            (b"x-pointsman-overhead-ms", f"{trace.overhead_ms():.3f}".encode()),
            *([(b"x-pointsman-router", trace.router_version.encode())] if trace.router_version else []),
            *([(b"x-pointsman-arm", f"{trace.experiment}/{trace.experiment_arm}".encode())]
              if trace.experiment is not None else []),
            *cache_headers(trace.decision),
            *(trace.quota.headers if trace.quota is not None else ()),
        ]

    def _finish_stream(
        self, served: Served, joined: RequestContext | None, trace: RequestTrace, scanner: SSEUsageScanner
    ) -> None:
        trace.prompt_tokens, trace.completion_tokens = scanner.prompt_tokens, scanner.completion_tokens
        target = self.pool.get(trace.model or "")
        if target is not None:
            trace.cost_usd = cost_usd(target.model, trace.prompt_tokens, trace.completion_tokens)
        self._stream_done(served, joined, trace, scanner)

    def _stream_done(
        self, served: Served, joined: RequestContext | None, trace: RequestTrace, scanner: SSEUsageScanner
    ) -> None:
        """A stream's last byte was sent (its record's usage filled in): finish the record, then what
        follows an answer (implicit feedback, comparison, shadow arms)."""
        self.metrics.in_flight.dec()
        record = self._finish(trace, scanner)
        self.followups.streamed(served, record, scanner)
        if joined is not None and self.experiments is not None:
            self.experiments.served(joined, record, served.forwarded)  # shadow arms decide now

    def _finish(self, trace: RequestTrace, scanner: SSEUsageScanner | None = None) -> DecisionRecord:
        """Build the request's decision record (once: the request is over), hand it to the batch writer,
        settle the quota reservation, update metrics and return it."""
        record = trace.record()
        # Queued first: nothing below (quota settling, metrics, tracing) may cost the request its record.
        self.issued.remember(record)  # its tenant and answer, for feedback before the record is flushed
        self.recorder.record(record)
        if trace.quota is not None and self.quotas is not None:
            # A stream without a usage chunk is settled from its chunks of text (one token each).
            chunks = None if scanner is None else max(scanner.events - int(scanner.saw_done) - 2, 0)
            self.quotas.settle(trace.quota, record, chunks)
        assert record.latency_ms is not None and record.overhead_ms is not None
        route, model, backend = record.route or DIRECT_ROUTE, record.model or "", record.backend or ""
        metrics = self.metrics
        metrics.requests_child(route, model, backend, str(record.status), record.outcome).inc()
        metrics.latency_child(route, model, backend, record.outcome).observe(record.latency_ms / 1000.0)
        metrics.overhead_child(route).observe(record.overhead_ms / 1000.0)
        if record.ttft_ms is not None:
            metrics.ttft_child(route, model, backend).observe(record.ttft_ms / 1000.0)
        if record.experiment is not None:
            metrics.experiment_requests.labels(record.experiment, record.experiment_arm or "").inc()
        if record.workflow is None:  # a workflow's tokens and cost were counted per sub-call model
            if record.prompt_tokens:
                metrics.tokens_child(route, model, backend, "prompt").inc(record.prompt_tokens)
            if record.completion_tokens:
                metrics.tokens_child(route, model, backend, "completion").inc(record.completion_tokens)
            if record.cost_usd:
                metrics.cost_child(route, model, backend).inc(record.cost_usd)
        if record.outcome != "ok":
            log.info(
                "request %s %s: %s %s (%s)", record.request_id, record.endpoint, record.status,
                record.outcome, record.error_type,
                extra={"route": route, "model": model, "backend": backend, "status": record.status,
                       "outcome": record.outcome, "error_type": record.error_type, "attempts": record.attempts},
            )
        if trace.span is not None:
            self._end_span(trace, record, route)
        return record

    def _end_span(self, trace: RequestTrace, record: DecisionRecord, route: str) -> None:
        span = trace.span
        span.set_attributes({
            "pointsman.route": route, "pointsman.requested_model": record.requested_model or "",
            "pointsman.model": record.model or "", "pointsman.backend": record.backend or "",
            "pointsman.status": record.status, "pointsman.outcome": record.outcome,
            "pointsman.attempts": record.attempts, "pointsman.stream": record.stream,
        })
        if record.error_type is not None:
            span.set_attribute("pointsman.error_type", record.error_type)
        if record.status >= 500 or record.outcome == "stream_error":
            assert self.tracer is not None
            self.tracer.error(span, record.error_type or record.outcome)
        span.end()
        trace.span = None


def _scan_unavailable(exc: ScanUnavailable) -> ServiceUnavailableError:
    """A long request whose text could not be scanned (queue full, scan timed out): 503."""
    message = (
        "the gateway is busy scanning other long requests; retry shortly"
        if exc.retry_after is not None
        else f"the gateway could not scan this request's text: {exc}"
    )
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return ServiceUnavailableError(message, code=exc.code, headers=headers)


def _unknown_model(model: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"The model {client_echo(model)} does not exist; GET /v1/models lists models and routes",
        param="model",
    )


def _policy_error(exc: PolicyError) -> PointsmanError:
    error_type = "invalid_request_error" if exc.status < 500 else "server_error"
    return PointsmanError(exc.message, code=exc.code, status=exc.status, error_type=error_type)


def _on_disconnect(request: Request, gone: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    """Call ``gone`` when the request's client disconnects; returns the coroutine function that stops it.

    The gateway's own HTTP front fires a callback (:mod:`gateway.client_gone`); under another ASGI
    server a watcher task awaits ``receive()`` for ``http.disconnect`` (~6 us a request more).
    """
    signal = request.scope.get(CLIENT_GONE)
    if isinstance(signal, ClientGone):
        signal.add(gone)

        async def forget() -> None:
            signal.remove(gone)

        return forget

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone()

    watcher = asyncio.ensure_future(watch())

    async def stop() -> None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

    return stop
