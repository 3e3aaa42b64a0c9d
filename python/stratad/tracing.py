"""OpenTelemetry tracing: opt-in, and free when off.

The daemon traces only when told to (``tracing = otlp`` or ``console``, see
docs/observability.md); the OpenTelemetry packages come with the ``otel``
extra (``pip install 'stratad[otel]'``). Until `install` is called nothing
here imports them: `span` returns one shared ``nullcontext`` and the other
hooks return at once, so the store and domain code may call them on every
request without the daemon depending on OpenTelemetry or paying for it.

What the daemon traces:

- a SERVER span per gRPC call (stratad.server.tracing, installed before
  every other interceptor so that it covers the whole call), continuing the
  caller's W3C ``traceparent``, with the ErrorInfo reason of a failed call,
  the session and request ID, and the tenant once authentication settled it;
- spans around the work a call does: journal appends, the wait for the
  group commit, object writes, GC, Verify, replication uploads; the group
  commit's one fsync per batch is a span of its own, child of the first
  waiting call and linked to the others.

The SDK (stratad.sdk) adds CLIENT spans and sends ``traceparent`` when the
application configured an OpenTelemetry tracer provider: `client_tracer_provider`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Final, TypeVar

from stratad.version import __version__

if TYPE_CHECKING:  # only for annotations: importing these is what `activate` does
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import SpanContext, Tracer

    from stratad.config import Config

_log = logging.getLogger(__name__)

T = TypeVar("T")
AttributeValue = str | bool | int | float
Attributes = Mapping[str, AttributeValue]

INSTRUMENTATION_NAME: Final = "stratad"
DEFAULT_OTLP_ENDPOINT: Final = "http://127.0.0.1:4317"
DEFAULT_SERVICE_NAME: Final = "stratad"
#: How long a stopping daemon waits for its last spans to reach the collector.
EXPORT_ON_STOP_SECONDS: Final = 2.0
EXTRA_HINT: Final = "install the otel extra: pip install 'stratad[otel]'"

#: Span attributes stratad sets on the SERVER span besides the rpc.* ones.
REASON_ATTRIBUTE: Final = "stratad.error.reason"
TENANT_ATTRIBUTE: Final = "stratad.tenant"
SESSION_ATTRIBUTE: Final = "stratad.session_id"
REQUEST_ID_ATTRIBUTE: Final = "stratad.request_id"

#: Services whose calls get no SERVER span: health checks and server reflection.
UNTRACED_SERVICES: Final = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)

_NO_SPAN: Final[AbstractContextManager[None]] = contextlib.nullcontext()

#: The daemon's tracer while tracing is installed; None = off (every hook is a no-op).
_tracer: Tracer | None = None


# --- hooks: called from the store and domain code, no-ops when off -------------------


def active() -> bool:
    """Whether the daemon traces (a tracer provider is installed)."""
    return _tracer is not None


def span(name: str, attributes: Attributes | None = None) -> AbstractContextManager[Any]:
    """A span around a block, child of the current one; a shared nullcontext when off.

    An exception leaving the block is recorded on the span, which then has
    status ERROR.
    """
    tracer = _tracer
    if tracer is None or _in_unsampled_trace():
        return _NO_SPAN
    return tracer.start_as_current_span(name, attributes=attributes)


def _in_unsampled_trace() -> bool:
    """Whether the current span belongs to a trace the sampler dropped.

    Its children would be dropped too (sampling is parent-based): skip making
    them. Without a current span (background work) a span is a new trace,
    which the sampler decides on.
    """
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context.is_valid and not context.trace_flags.sampled


def annotate(attributes: Attributes) -> None:
    """Set attributes on the current span (the call's SERVER span, in a servicer)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(attributes)


def current_span_context() -> SpanContext | None:
    """The current span's context, to link or parent work done elsewhere; None when off
    or when the current trace is not sampled."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def batch_span(
    name: str, contexts: Sequence[SpanContext | None], attributes: Attributes | None = None
) -> AbstractContextManager[Any]:
    """A span for work done once for many callers (a group commit's fsync).

    It is the child of the first caller's span, so that a lone call's trace
    shows it, and links to every caller's span. Off, or when no caller was
    traced: a nullcontext (a batch nobody traced would be a trace of its own
    on every commit).
    """
    tracer = _tracer
    if tracer is None:
        return _NO_SPAN
    traced = [c for c in contexts if c is not None]
    if not traced:
        return _NO_SPAN
    from opentelemetry import trace

    parent = trace.set_span_in_context(trace.NonRecordingSpan(traced[0]))
    links = [trace.Link(c) for c in traced]
    return tracer.start_as_current_span(name, context=parent, links=links, attributes=attributes)


def in_current_context(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn``, bound to run in a copy of the current context (the current span).

    For work handed to a thread pool (`loop.run_in_executor` does not carry
    the context): its spans then belong to the call's trace. Off: ``fn``.
    """
    if _tracer is None:
        return fn
    return functools.partial(contextvars.copy_context().run, fn)


def current_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) in hex of the current span, for log lines; None if none or off."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


# --- the daemon: turning tracing on and off -------------------------------------------


def provider_from_config(config: Config) -> TracerProvider | None:
    """The tracer provider ``config`` asks for (None: tracing off).

    Raises `ConfigError` when tracing is on but the otel extra is missing.
    The exporter reads the standard OTEL_EXPORTER_OTLP_* variables for what
    the config does not say (headers, timeout, certificate, compression), the
    batch processor OTEL_BSP_*, the resource OTEL_RESOURCE_ATTRIBUTES.
    """
    if config.tracing == "off":
        return None
    _require_extra(config.tracing)
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    service = (
        config.trace_service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    )
    resource = Resource.create({SERVICE_NAME: service, SERVICE_VERSION: __version__})
    sampler = ParentBased(TraceIdRatioBased(config.trace_sample_ratio))
    # Shut down by the server when it stops (`shutdown`), not at interpreter exit.
    provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
    if config.tracing == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # One JSON document per span on stdout (logs go to stderr), written at once.
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(config)))
    return provider


def _otlp_exporter(config: Config) -> Any:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    endpoint = (
        config.otlp_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or DEFAULT_OTLP_ENDPOINT
    )
    # None lets the exporter decide: plaintext for http://, TLS for https://
    # and, without a scheme, what OTEL_EXPORTER_OTLP_(TRACES_)INSECURE says.
    insecure = True if config.otlp_insecure else None
    return OTLPSpanExporter(endpoint=endpoint, insecure=insecure)


def _require_extra(mode: str) -> None:
    import importlib.util

    needed: tuple[str, ...] = ("opentelemetry.sdk",)
    if mode == "otlp":
        needed += ("opentelemetry.exporter.otlp.proto.grpc",)
    for module in needed:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            from stratad.config import ConfigError

            raise ConfigError(f"tracing = {mode!r} needs {module}: {EXTRA_HINT}")


def activate(provider: TracerProvider) -> Tracer:
    """Trace with ``provider`` from now on and return its tracer.

    Process-wide (the store's hooks are module functions): a second server
    in the same process shares it. Undo with `uninstall`. The daemon calls
    it through `stratad.server.tracing.install`, which adds the gRPC
    server interceptor (kept there so this module never imports the server).
    """
    global _tracer
    _tracer = provider.get_tracer(INSTRUMENTATION_NAME, __version__)
    return _tracer


def shutdown(provider: TracerProvider) -> None:
    """Export the spans still batched and close the exporter, waiting at most
    `EXPORT_ON_STOP_SECONDS`: with the collector down, the exporter would
    retry for its whole timeout (10 s) and hold up the daemon's exit."""
    worker = threading.Thread(target=provider.shutdown, name="stratad-trace-stop", daemon=True)
    worker.start()
    worker.join(EXPORT_ON_STOP_SECONDS)
    if worker.is_alive():
        _log.warning(
            "spans of the last calls not exported within %gs (is the collector reachable?)",
            EXPORT_ON_STOP_SECONDS,
        )


def uninstall() -> None:
    """Stop tracing: every hook is a no-op again."""
    global _tracer
    _tracer = None


# --- the SDK: client spans when the application traces ----------------------------------


def client_tracer_provider() -> Any | None:
    """The application's tracer provider, if it configured one and can trace gRPC.

    Without the otel extra, or before the application set a tracer provider
    (``opentelemetry.trace.set_tracer_provider``), None: the SDK then adds
    no interceptor. Never imports OpenTelemetry itself: an application that
    set a provider has imported it already.
    """
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    try:
        import opentelemetry.instrumentation.grpc  # noqa: F401
    except ImportError:
        return None
    return provider


def aio_client_interceptors() -> list[Any]:
    """CLIENT-span interceptors for a grpc.aio channel (they also send ``traceparent``);
    [] when the application does not trace."""
    provider = client_tracer_provider()
    if provider is None:
        return []
    from opentelemetry.instrumentation import grpc as otel_grpc

    return list(otel_grpc.aio_client_interceptors(tracer_provider=provider))  # type: ignore[no-untyped-call]


def traced_channel(channel: Any) -> Any:
    """``channel`` (sync grpc) with CLIENT spans when the application traces, else itself."""
    provider = client_tracer_provider()
    if provider is None:
        return channel
    from opentelemetry.instrumentation import grpc as otel_grpc
    from opentelemetry.instrumentation.grpc import grpcext

    interceptor = otel_grpc.client_interceptor(tracer_provider=provider)  # type: ignore[no-untyped-call]
    return grpcext.intercept_channel(channel, interceptor)  # type: ignore[no-untyped-call]


__all__ = [
    "DEFAULT_OTLP_ENDPOINT",
    "REASON_ATTRIBUTE",
    "REQUEST_ID_ATTRIBUTE",
    "SESSION_ATTRIBUTE",
    "TENANT_ATTRIBUTE",
    "activate",
    "active",
    "aio_client_interceptors",
    "annotate",
    "batch_span",
    "client_tracer_provider",
    "current_ids",
    "current_span_context",
    "in_current_context",
    "provider_from_config",
    "shutdown",
    "span",
    "traced_channel",
    "uninstall",
]
