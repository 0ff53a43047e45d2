"""The KV data paths on the worker's bus: the sender (``worker_kv_send``) and the receiver
(``worker_kv_recv`` / ``worker_kv_shm`` / ``worker_kv_land`` / ``worker_kv_drop``) on the
data connection, so bulk bytes never queue ahead of step messages on the control
connection. With mode mooncake both share one Mooncake engine of the worker."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from libs.protocol.bus import Bus
from libs.protocol.service import ServiceContext
from libs.transfer.mooncake import MooncakeEngine

from ..service import WorkerService
from .recv import KVReceiver
from .send import KVSender
from .store_service import open_data_bus
from .transfer import KVTransferConfig

log = logging.getLogger("gpu_worker.kv")


@dataclass(frozen=True)
class KVPaths:
    sender: KVSender
    receiver: KVReceiver
    engine: MooncakeEngine | None = None

    async def stop(self) -> None:
        """End the receiver's reaper and release its landing buffers."""
        await self.receiver.stop()


async def start_kv_paths(bus: Bus, worker: WorkerService, config: KVTransferConfig = KVTransferConfig(),
                         engine: MooncakeEngine | None = None) -> KVPaths:
    """Subscribe both sides of ``worker`` on ``bus``; ``await paths.stop()``. Mode mooncake:
    with ``engine``, else a new one (MooncakeUnavailable when it cannot start; NOTE: an
    engine takes a second to shut down, so tests share theirs)."""
    if config.mode != "mooncake":
        engine = None
    elif engine is None:
        engine = MooncakeEngine(config.mooncake_host)
    paths = KVPaths(KVSender(worker, config, engine), KVReceiver(worker, config, engine=engine), engine)
    await paths.receiver.start(bus)
    await paths.sender.start(bus)
    await bus.nc.flush()  # NOTE: subscribed at the broker before the worker announces itself
    return paths


async def serve_kv_transfer(ctx: ServiceContext, worker: WorkerService, config: KVTransferConfig,
                            bus: Bus | None = None) -> KVPaths:
    """Serve ``worker``'s KV data paths on ``bus`` (default: a data connection of its own) until ``ctx`` stops."""
    bus = bus if bus is not None else await open_data_bus(ctx)
    paths = await start_kv_paths(bus, worker, config)
    ctx.stack.push_async_callback(paths.stop)
    log.info("KV transfer: role %s, mode %s (shared memory %s%s), host %s", worker.role, config.mode,
             "writable" if paths.sender.shm_ok else "unavailable",
             f", Mooncake session {paths.engine.session_id}" if paths.engine else "", worker.host_id)
    return paths
