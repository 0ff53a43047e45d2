"""Span export for a service process, switched on by the standard OTEL_* env vars.

``configure_tracing(service)`` installs an SDK TracerProvider that batches spans
to an OTLP collector (Jaeger, an OpenTelemetry Collector, ...) only when the
environment asks for it:

| variable | effect |
|---|---|
| ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` | export on (unset: nothing is installed) |
| ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``..._TRACES_PROTOCOL``) | ``http/protobuf`` (default) or ``grpc`` |
| ``OTEL_SERVICE_NAME`` | resource ``service.name`` (default ``radixmesh-<service>``) |
| ``OTEL_TRACES_SAMPLER`` / ``_ARG`` | sampling, read by the SDK itself |
| ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` | export off |

Headers, timeouts, compression and certificates come from the exporters' own
``OTEL_EXPORTER_OTLP_*`` variables. Pending spans are flushed at exit.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

log = logging.getLogger("radixmesh.telemetry")

PROTOCOLS = ("http/protobuf", "grpc")


def tracing_requested(env: os._Environ | dict[str, str] = os.environ) -> bool:
    """True when the env names an OTLP endpoint and does not switch the SDK off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure_tracing(service: str, instance: str | None = None) -> TracerProvider | None:
    """Install the global SDK provider for ``service`` if OTLP export is requested.

    Returns the installed provider, or None when export is off (nothing is
    installed then: spans stay no-op and cost nothing) or a provider is already
    installed in this process. Raises ValueError on an unsupported protocol.
    """
    if not tracing_requested():
        return None
    protocol = _protocol()
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return None  # NOTE: the global provider can be set only once per process
    provider = TracerProvider(resource=_resource(service, instance))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(_exporter(protocol)))
    trace.set_tracer_provider(provider)
    log.info("exporting spans over OTLP %s as %s", protocol, provider.resource.attributes[SERVICE_NAME])
    return provider


def _protocol() -> str:
    env = os.environ
    raw = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOLS[0]
    protocol = raw.strip().lower()
    if protocol not in PROTOCOLS:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={raw!r} is not supported; use one of {PROTOCOLS}")
    return protocol


def _resource(service: str, instance: str | None) -> Resource:
    """OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win; else radixmesh-<service>."""
    detected = Resource.create({SERVICE_INSTANCE_ID: instance} if instance else {})
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: f"radixmesh-{service}"}))
    return detected


def _exporter(protocol: str) -> SpanExporter:
    """The OTLP exporter for ``protocol``; it reads endpoint/headers/timeout from env."""
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ValueError(
                "OTLP over grpc needs: pip install opentelemetry-exporter-otlp-proto-grpc"
            ) from None
        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
