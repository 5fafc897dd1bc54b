"""OpenTelemetry tracing, behind one small boundary (the ``otel`` extra).

With ``tracing.enabled: false`` (the default) :func:`build_tracer` returns None and the request path
creates no span object at all: callers test ``tracer is not None`` first, and nothing here imports
``opentelemetry``. When enabled, a :class:`Tracer` owns its own ``TracerProvider`` (the process's
global provider is left alone) and the gateway makes these spans:

``pointsman.request``        one per proxied request (endpoint, route, requested model, model,
                             backend, status, outcome); ended when its last byte is sent; a child of
                             the client's trace when the request carries a ``traceparent``
``pointsman.policy``         the route's policy deciding (policy, candidates, reason)
``pointsman.signals``        the signals that decision computed (inside the policy span)
``pointsman.upstream``       one per upstream attempt (model, backend, replica, attempt, status)
``pointsman.workflow.step``  one per workflow sub-call (workflow, step, model, outcome)

Each upstream request carries a W3C ``traceparent`` header naming its attempt span, and the
request's trace id (32 hex digits) is stored on its decision record (``trace_id``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from gateway.config import TracingConfig
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("pointsman.tracing")

Attributes = Mapping[str, Any]  # str, bool, int, float or a sequence of one of them


class Tracer:
    """Starts the gateway's spans and propagates their context (built by :func:`build_tracer`)."""

    def __init__(self, provider: Any, service_name: str) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = provider
        self._trace = trace
        self._context = otel_context
        self._tracer = provider.get_tracer("pointsman", schema_url=None)
        self._propagator = TraceContextTextMapPropagator()
        self.service_name = service_name

    def start(self, name: str, attributes: Attributes | None = None, carrier: Mapping[str, str] | None = None) -> Span:
        """A span that is a child of the current one, or of the W3C ``traceparent`` in ``carrier`` (a
        client's request headers) when it has one; the caller ends it (``span.end()``)."""
        context = self._propagator.extract(carrier) if carrier is not None else None
        return self._tracer.start_span(name, context=context, attributes=attributes)

    @contextlib.contextmanager
    def current(self, span: Span) -> Iterator[Span]:
        """Make ``span`` the current span within the block (it is not ended on exit)."""
        token = self._context.attach(self._trace.set_span_in_context(span))
        try:
            yield span
        finally:
            self._context.detach(token)

    @contextlib.contextmanager
    def span(self, name: str, attributes: Attributes | None = None) -> Iterator[Span]:
        """A child span of the current one, current within the block and ended after it (an
        exception escaping the block is recorded on it)."""
        with self._tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    def active(self) -> bool:
        """Whether a recording span is current (spans are only made inside a traced request)."""
        return bool(self._trace.get_current_span().is_recording())

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add the current span's W3C ``traceparent`` to ``headers`` (an upstream request's)."""
        self._propagator.inject(headers)

    @staticmethod
    def trace_id(span: Span) -> str | None:
        """``span``'s trace id as 32 lowercase hex digits (None for an invalid span)."""
        context = span.get_span_context()
        return format(context.trace_id, "032x") if context.trace_id else None

    def error(self, span: Span, description: str) -> None:
        """Mark ``span`` as failed."""
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, description))

    def shutdown(self) -> None:
        """Export what is buffered and stop the provider."""
        self._provider.shutdown()


class TracedSignals:
    """A :class:`policies.signals.SignalProvider` that computes inside a ``pointsman.signals`` span
    (when a traced request is current; a dry run or a shadow decision makes none)."""

    def __init__(self, provider: Any, tracer: Tracer) -> None:
        self.inner = provider
        self._tracer = tracer

    async def compute(self, names: set[str], ctx: Any) -> Mapping[str, Any]:
        if not self._tracer.active():
            return await self.inner.compute(names, ctx)
        with self._tracer.span("pointsman.signals", {"pointsman.signals": sorted(names)}) as span:
            signals = await self.inner.compute(names, ctx)
            span.set_attribute("pointsman.signals.computed", sorted(signals))
            return signals

    def __getattr__(self, name: str) -> Any:  # anything else a policy asks of its provider
        return getattr(self.inner, name)


def trace_signals(policies: Iterable[Any], tracer: Tracer) -> None:
    """Have every policy that computes signals through a provider (``policy: rules``) compute them in
    a ``pointsman.signals`` span (the policies live below the gateway and know nothing of tracing)."""
    for policy in policies:
        provider = getattr(policy, "provider", None)
        if provider is not None and not isinstance(provider, TracedSignals):
            policy.provider = TracedSignals(provider, tracer)


def build_tracer(config: TracingConfig, exporter: Any = None) -> Tracer | None:
    """The tracer ``config`` asks for, or None when tracing is off. ``exporter`` (a span exporter,
    e.g. an in-memory one in tests) replaces the configured one and is exported to synchronously.
    Raises :class:`ConfigError` when tracing is on but the ``otel`` extra is not installed."""
    if not config.enabled:
        return None
    preflight(config, exporter=exporter is None)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif config.exporter != "none":
        provider.add_span_processor(BatchSpanProcessor(_exporter(config)))
    return Tracer(provider, config.service_name)


def preflight(config: TracingConfig, *, exporter: bool = True) -> None:
    """:class:`ConfigError` when tracing is on but what it needs is not installed (the ``otel`` extra,
    and with ``exporter`` the OTLP exporter ``exporter: otlp`` needs); builds nothing (``pointsman
    check-config`` runs it)."""
    if not config.enabled:
        return
    try:
        import opentelemetry.sdk.resources
        import opentelemetry.sdk.trace
        import opentelemetry.sdk.trace.export
    except ImportError as exc:
        raise ConfigError(
            "tracing.enabled: OpenTelemetry is not installed; pip install 'pointsman[otel]' "
            f"(or turn tracing off): {exc}"
        ) from exc
    if exporter and config.exporter == "otlp":
        try:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        except ImportError as exc:
            raise ConfigError(_NO_OTLP + f": {exc}") from exc


_NO_OTLP = ("tracing.exporter: otlp needs opentelemetry-exporter-otlp-proto-http (pip install 'pointsman[otel]'), "
            "or use exporter: console or none")


def _exporter(config: TracingConfig) -> Any:
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(_NO_OTLP + f": {exc}") from exc
    return OTLPSpanExporter(endpoint=config.endpoint) if config.endpoint else OTLPSpanExporter()
