"""Prometheus metrics every service process shares, and the flag that exposes them.

The gateway serves ``/metrics`` on its HTTP port (request latencies and the
cluster view it gathers over the bus). Services without HTTP expose their own
process metrics on ``--metrics-port`` (0: off), for metrics only that process
sees (bus errors, the cache index's KV-event lag, the worker's step times).

Names: SGLang's (``sglang:*``) where a metric means what SGLang's means, so its
dashboards work unchanged; ``radixmesh:*`` for everything of our own.
"""

from __future__ import annotations

import argparse
import os

from prometheus_client import Counter, start_http_server

from .env_flags import env_default

BUS_ERRORS = Counter(
    "radixmesh:bus_errors", "Failed bus requests (no responder, timeout, typed error replies).",
    ["subject", "code"],
)


def subject_label(subject: str) -> str:
    """The subject without its deployment prefix (``rm.sched.w0.submit`` -> ``sched.w0.submit``)."""
    return subject.partition(".")[2] or subject


def bus_error(subject: str, code: str) -> None:
    BUS_ERRORS.labels(subject_label(subject), code).inc()


def add_metrics_args(parser: argparse.ArgumentParser, service: str | None = None) -> None:
    """``--metrics-port`` / ``--metrics-host``; with ``service``, also from
    RADIXMESH_<SERVICE>_METRICS_PORT (radixmesh up's name) before RADIXMESH_METRICS_PORT."""
    env = os.environ.get
    port = int(env("RADIXMESH_METRICS_PORT", "0"))
    host = env("RADIXMESH_METRICS_HOST", "0.0.0.0")
    if service is not None:
        port = env_default(service, "--metrics-port", 0, int)
        host = env_default(service, "--metrics-host", "0.0.0.0")
    parser.add_argument("--metrics-port", type=int, default=port,
                        help="serve Prometheus /metrics of this process on this port (0: off)")
    parser.add_argument("--metrics-host", default=host)


def serve_metrics(port: int, host: str = "0.0.0.0") -> int | None:
    """Serve the default registry from a daemon thread; returns the bound port, None if off."""
    if port <= 0:
        return None
    try:
        server, _ = start_http_server(port, host)
    except OSError as exc:
        raise SystemExit(f"--metrics-port {port}: {exc}") from None
    return server.server_port
