"""What every service process shares: config from flags/env, bus, ping, SIGTERM.

A service is an async context manager; ``run_service`` connects the bus,
answers health pings on ``<prefix>.ping.<service>``, and waits until SIGTERM or
SIGINT sets the stop event, then closes everything in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from . import tracing
from .bus import Bus, BusAuthError
from .credentials import ENV as NATS_ENV
from .credentials import NatsCredentials
from .messages import Ping, Pong
from .subjects import Subjects
from .telemetry import configure_tracing

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


@dataclass(frozen=True)
class CommonConfig:
    nats_url: str
    subject_prefix: str
    instance: str
    log_level: str
    credentials: NatsCredentials | None = None  # None: from the environment

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.subject_prefix)


def add_common_args(parser: argparse.ArgumentParser, service: str) -> None:
    env = os.environ.get
    parser.add_argument("--nats-url", default=env("NATS_URL", DEFAULT_NATS_URL),
                        help="NATS server URL, or a cluster's URLs comma-separated (env NATS_URL); "
                             "credentials go in the --nats-* options, not in the URL")
    parser.add_argument(
        "--subject-prefix", default=env("RADIXMESH_SUBJECT_PREFIX", "rm"),
        help="prefix of every NATS subject (lets several stacks share a broker)",
    )
    parser.add_argument(
        "--instance", default=env("RADIXMESH_INSTANCE") or f"{service}-{uuid.uuid4().hex[:8]}",
        help="unique id of this process",
    )
    parser.add_argument("--log-level", default=env("RADIXMESH_LOG_LEVEL", "INFO"))
    nats = parser.add_argument_group("NATS credentials (prefer the env: flags show in ps)")
    for name, flag in _NATS_FLAGS.items():
        nats.add_argument(flag, dest=f"nats_{name}", default=env(NATS_ENV[name]) or None,
                          help=f"default: env {NATS_ENV[name]}")


_NATS_FLAGS = {
    "user": "--nats-user", "password": "--nats-password", "token": "--nats-token",
    "creds_file": "--nats-creds", "nkey_seed_file": "--nats-nkey-seed",
    "tls_ca": "--nats-tls-ca", "tls_cert": "--nats-tls-cert", "tls_key": "--nats-tls-key",
}


def common_config(args: argparse.Namespace) -> CommonConfig:
    creds = NatsCredentials(**{name: getattr(args, f"nats_{name}", None) for name in _NATS_FLAGS})
    return CommonConfig(args.nats_url, args.subject_prefix, args.instance, args.log_level, creds)


def setup_logging(service: str, level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
    tracing.install_log_context()  # lines written inside a request carry rid + trace id


@dataclass
class ServiceContext:
    """Handed to a service body: the bus, the config and the stop event."""

    service: str
    config: CommonConfig
    bus: Bus
    stop: asyncio.Event
    stack: AsyncExitStack
    detail: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    # NOTE: this process's own id: a service restarted under the same instance id (compose
    # names instances by hostname) is told apart from its predecessor by it
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    probes: dict[str, Callable[[], str]] = field(default_factory=dict)  # detail read at each ping

    @property
    def subjects(self) -> Subjects:
        return self.config.subjects


Body = Callable[[ServiceContext], Awaitable[None]]


async def run_service(service: str, config: CommonConfig, body: Body) -> None:
    """Connect, start ``body`` (which registers its handlers), serve until stopped."""
    configure_tracing(service, config.instance)  # no-op unless OTEL_EXPORTER_OTLP_* is set
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        try:
            bus = await Bus.connect(config.nats_url, f"{service}:{config.instance}",
                                    credentials=config.credentials)
        except (BusAuthError, ValueError, OSError) as exc:
            logging.getLogger(service).error("cannot connect to NATS: %s", exc)
            raise SystemExit(2) from None
        stack.push_async_callback(bus.close)
        ctx = ServiceContext(service, config, bus, stop, stack)

        async def on_ping(_: Ping) -> Pong:
            return Pong(
                service=service, instance=config.instance,
                uptime_s=time.monotonic() - ctx.started,
                detail={**ctx.detail, **{k: probe() for k, probe in ctx.probes.items()},
                        **bus.broker(), "nonce": ctx.nonce},
            )

        await body(ctx)
        freeze_startup_objects()
        await bus.subscribe(config.subjects.ping(service), on_ping, Ping)
        # NOTE: a service that still loads its state says so in its Pong (ready "false")
        state = "up, loading its state" if ctx.detail.get("ready") == "false" else "ready"
        logging.getLogger(service).info("%s %s %s", service, config.instance, state)
        await stop.wait()
        logging.getLogger(service).info("%s %s stopping", service, config.instance)


# NOTE: a young collection every GC_THRESHOLDS[0] container allocations, not CPython's 700: a
# decode step at batch 256 allocates thousands (deltas, lists, messages) that refcounting frees
# anyway; at 700 the requests' long-lived objects are promoted, and then walked by full
# collections, every few steps (the mesh benchmark: docs/benchmarks.md)
GC_THRESHOLDS = (int(os.environ.get("RADIXMESH_GC_GEN0", "50000")), 10, 10)


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (modules, the model's Python objects, a
    tokenizer's tables) out of the cyclic collector's reach, as vLLM and SGLang do.

    NOTE: a full collection walks every tracked object (all of torch's in a process that
    imports it), and the per-step deltas and requests that outlive a young collection keep
    triggering full ones (docs/benchmarks.md, the mesh). Frozen, a collection walks only
    what came after; garbage cycles among start-up objects are never freed (there are few)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
