"""OTLP export switched on by env: a real service process sends its spans to a receiver."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from libs.protocol import telemetry
from libs.protocol.bus import Bus
from libs.protocol.errors import ServiceError
from libs.protocol.messages import Ping, Pong
from libs.protocol.subjects import Subjects

ROOT = Path(__file__).resolve().parents[2]
OTEL_VARS = [k for k in os.environ if k.startswith("OTEL_")]


def _receiver_module():
    spec = importlib.util.spec_from_file_location("otlp_receiver", ROOT / "observability" / "otlp_receiver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def receiver():
    with _receiver_module().Receiver() as recv:
        yield recv


@pytest.fixture()
def clean_env(monkeypatch):
    for key in OTEL_VARS:
        monkeypatch.delenv(key)
    return monkeypatch


def test_nothing_installed_without_endpoint(clean_env):
    assert not telemetry.tracing_requested()
    assert telemetry.configure_tracing("probe") is None


@pytest.mark.parametrize("off", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_switches_turn_export_off(clean_env, off):
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for key, value in off.items():
        clean_env.setenv(key, value)
    assert not telemetry.tracing_requested()
    assert telemetry.configure_tracing("probe") is None


def test_unsupported_protocol_is_a_clear_error(clean_env):
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="http/json"):
        telemetry.configure_tracing("probe")


def _start_service(nats_url: str, prefix: str, instance: str, env: dict[str, str]) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.Popen(
        [sys.executable, "-m", "services.cache_index", "--nats-url", nats_url,
         "--subject-prefix", prefix, "--instance", instance, "--log-level", "WARNING"],
        cwd=ROOT, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


async def _ping_when_up(bus: Bus, subject: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        try:
            await bus.request(subject, Ping(), Pong, timeout=1.0)
            return
        except ServiceError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"no pong on {subject} within {timeout}s")


async def _ping_in_trace(bus: Bus, subject: str, trace_id: int) -> None:
    parent = SpanContext(trace_id, 0x1234, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        await bus.request(subject, Ping(), Pong, timeout=5.0)
    finally:
        otel_context.detach(token)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


CASES = {
    "default-name": ({}, "radixmesh-cache_index", True),
    "env-name": ({"OTEL_SERVICE_NAME": "custom-index"}, "custom-index", True),
    "sampled-out": ({"OTEL_TRACES_SAMPLER": "always_off"}, "radixmesh-cache_index", False),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_service_spans_reach_the_collector(nats_server, subject_prefix, receiver, case):
    extra, service_name, exported = CASES[case]
    # NOTE: a one-minute batch delay means only the flush at exit can deliver the span
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "60000", **extra}
    proc = _start_service(nats_server.url, subject_prefix, "idx-1", env)
    bus = await Bus.connect(nats_server.url, "telemetry-test")
    subject = Subjects(subject_prefix).ping("cache_index")
    trace_id = int.from_bytes(os.urandom(16), "big")
    try:
        await _ping_when_up(bus, subject, proc)
        await _ping_in_trace(bus, subject, trace_id)
    finally:
        await bus.close()
        _stop(proc)
    spans = [s for s in receiver.snapshot() if s["trace_id"] == f"{trace_id:032x}"]
    if not exported:
        assert spans == []
        return
    assert [(s["service"], s["instance"], s["kind"], s["name"]) for s in spans] == [
        (service_name, "idx-1", "CONSUMER", f"process {subject}")
    ]
    assert spans[0]["parent_span_id"]  # a child of the requester's span, not a new root
