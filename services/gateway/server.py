"""Run the gateway: the pipeline on the bus plus uvicorn, in one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Callable

import uvicorn
from prometheus_client import CollectorRegistry

from libs.protocol.service import ServiceContext

from .app import create_app
from .admin import CacheAdmin
from .health import BusHealth
from .metrics import ClusterView, MetricsPage, RequestMetrics
from .pipeline import Pipeline, PipelineConfig
from .routes import GatewaySettings
from .utility import ServerInfo, public_config

log = logging.getLogger("radixmesh.gateway")
END_MARGIN_S = 2.0  # after end_open(): time for the final events to go out before uvicorn cancels


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    graceful_shutdown_s: float = 10.0  # asked to stop: open requests may finish this long
    reuse_port: bool = False  # several gateway processes share the port (the kernel spreads connections)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: run_service owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """Bind before serving so a busy port is a clear error, and port 0 works. ``reuse_port``:
    other processes that ask for it too may bind the same port (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve_http(ctx: ServiceContext, app, server_cfg: ServerConfig, log_level: str,
                     end_open: Callable[[], int] = lambda: 0) -> str:
    """Start uvicorn as a task of this loop; stopping ``ctx`` stops it. Returns the URL.

    Stopping takes no new connection and lets open requests finish for ``graceful_shutdown_s``
    less a margin; then ``end_open()`` ends those left with their final event (a stream's
    error event and [DONE], a JSON 503), so no response is cut off mid-way."""
    sock = bind(server_cfg.host, server_cfg.port, server_cfg.reuse_port)
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, log_level=log_level.lower(), access_log=False,
        timeout_graceful_shutdown=server_cfg.graceful_shutdown_s + END_MARGIN_S,
    )
    server = _Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    # a server that dies on its own takes the service down with it
    task.add_done_callback(lambda _: ctx.stop.set())

    async def shutdown() -> None:
        server.should_exit = True
        done, _ = await asyncio.wait((task,), timeout=server_cfg.graceful_shutdown_s)
        if not done:
            log.warning("stopping: %d open requests end now, before their output did", end_open())
            await asyncio.wait((task,))
        sock.close()

    ctx.stack.push_async_callback(shutdown)
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        task.result()  # raises what went wrong
        raise RuntimeError("uvicorn stopped during startup")
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


def gateway_body(settings: GatewaySettings, pipeline_cfg: PipelineConfig, server_cfg: ServerConfig,
                 worker_model: str | None = None, model_path: str | None = None):
    """The ``run_service`` body of the gateway.

    ``worker_model`` is the name the workers announce (``served_name(--model)``),
    used for routing; it differs from the public name under --served-model-name.
    """

    async def body(ctx: ServiceContext) -> None:
        registry = CollectorRegistry()
        pipeline = Pipeline(ctx.bus, ctx.subjects, ctx.config.instance,
                            worker_model or settings.served_model_name, pipeline_cfg,
                            RequestMetrics(settings.served_model_name, registry))
        await pipeline.start()
        ctx.stack.push_async_callback(pipeline.stop)
        cluster = ClusterView(ctx.bus, ctx.subjects, pipeline.loads, settings.served_model_name,
                              registry, worker_model=pipeline.model)
        admin = CacheAdmin(ctx.bus, ctx.subjects)
        info = ServerInfo(model_path or settings.served_model_name,
                          public_config(settings, pipeline_cfg, server_cfg), admin.workers)
        health = BusHealth(ctx.bus, ctx.subjects, loads=pipeline.loads)
        await health.watch()
        app = create_app(pipeline, settings, health,
                         admin.flush, MetricsPage(registry, cluster), info)
        url = await serve_http(ctx, app, server_cfg, ctx.config.log_level, pipeline.end_open)
        ctx.detail.update(url=url, model=settings.served_model_name)
        ctx.probes["requests"] = lambda: str(pipeline.submitted)
        log.info("gateway listening on %s (model %s)", url, settings.served_model_name)

    return body
