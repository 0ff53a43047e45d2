"""The shared KV store on the worker's bus: ``--kv-store nats`` opens the JetStream bucket
over a second NATS connection (page traffic never queues ahead of the step messages on
the control connection), ``--kv-store mooncake`` a Mooncake Store client (its master at
``--kv-store-url``; this worker's segment of ``--kv-store-max-bytes``); either way it attaches
puts to the copier and answers ``worker_fetch(id)``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import numpy as np
from prometheus_client import Gauge

from libs.protocol.bus import Bus
from libs.protocol.errors import invalid_request
from libs.protocol.messages import FetchPages, FetchReply
from libs.protocol.service import ServiceContext
from libs.transfer import (
    KVLayout, PageSpec, PageStore, StoreError, StoreNotInstalled, StoreUnavailable, TransferError, valid_key,
)
from libs.transfer.jetstream_store import DEFAULT_BUCKET, DEFAULT_MAX_BYTES, JetStreamStore

from ..service import WorkerService
from .store_io import StoreIO

log = logging.getLogger("gpu_worker.store")

STORE_KINDS = ("none", "nats", "mooncake")
STORE_CONNECT_S = 10.0  # --kv-store-url: how long a starting worker waits for the store's server
STORE_AVAILABLE = Gauge("radixmesh:kv_store_available",
                        "1: the worker serves the shared KV store; 0: it serves without one (none asked "
                        "for, or --kv-store-url unreachable at start: see its log; restart to retry)")


@dataclass(frozen=True)
class StoreConfig:
    kind: str = "none"
    bucket: str = DEFAULT_BUCKET
    max_bytes: int = DEFAULT_MAX_BYTES
    url: str = ""  # nats: the store's own NATS server ("": the worker's broker); mooncake: the master
    mooncake_metadata: str = "P2PHANDSHAKE"
    mooncake_hostname: str = ""  # what peers reach this worker's segment at ("": the route to the master)


class FetchEndpoint:
    """``worker_fetch(id)``: FetchPages -> FetchReply; 409 unless adopted, 400 for a bad
    request (slots out of range, repeated or already being fetched into)."""

    def __init__(self, worker: WorkerService, io: StoreIO) -> None:
        self.worker = worker
        self.io = io
        self._busy: set[int] = set()  # host slots of fetches in flight

    async def start(self, bus: Bus) -> None:
        w = self.worker
        await bus.subscribe(w.subjects.worker_fetch(w.worker_id), self.on_fetch, FetchPages, concurrent=True)

    async def on_fetch(self, msg: FetchPages) -> FetchReply:
        self.worker.adoption.require_owner()
        slots = self._check(msg)
        self._busy.update(slots.tolist())
        try:
            return await self.io.fetch(msg.keys, slots, msg.deadline_s)
        finally:
            self._busy.difference_update(slots.tolist())

    def _check(self, msg: FetchPages) -> np.ndarray:
        page, size = self.io.page_tokens, self.io.host.num_slots
        slots = np.asarray(msg.host_slots, dtype=np.int64).reshape(-1)
        checks = (
            (len(slots) == len(msg.keys) * page, f"{len(slots)} host slots for {len(msg.keys)} keys of {page} tokens"),
            (not len(slots) or (slots.min() >= 0 and slots.max() < size), f"host slot out of range [0, {size})"),
            (len(np.unique(slots)) == len(slots), "host slots repeat"),
            (self._busy.isdisjoint(slots.tolist()), "host slots already being fetched into"),
            (all(valid_key(k) for k in msg.keys), "keys must be store keys (libs.transfer.page_key)"),
            (msg.deadline_s > 0, "deadline_s must be > 0"),
        )
        for ok, problem in checks:
            if not ok:
                raise invalid_request(f"fetch: {problem}")
        return slots


async def open_data_bus(ctx: ServiceContext, url: str = "") -> Bus:
    """The worker's second NATS connection, for bulk bytes (store pages, KV transfers), open until ``ctx``
    stops (``url``: another server, e.g. the store's own; default the worker's broker)."""
    bus = await Bus.connect(url or ctx.config.nats_url, f"{ctx.service}:{ctx.config.instance}:data",
                            credentials=ctx.config.credentials)
    ctx.stack.push_async_callback(bus.close)
    return bus


async def serve_store(ctx: ServiceContext, worker: WorkerService, config: StoreConfig,
                      bus: Bus | None = None) -> StoreIO | None:
    """Open the store ``config`` names and serve it for ``worker`` until ``ctx`` stops; its
    pages ride ``bus`` (default: a data connection of its own)."""
    if config.kind == "none":
        return None
    copier = worker.runner.kv_copies
    if copier.host is None:
        raise SystemExit("gpu_worker: --kv-store needs a host KV pool (--host-kv-slots > 0)")
    spec = PageSpec(KVLayout.of_pool(copier.pool))
    opened = await (_open_mooncake(config, spec) if config.kind == "mooncake" else _open_nats(ctx, config, spec, bus))
    if opened is None:
        STORE_AVAILABLE.set(0)
        return None
    store, where = opened
    ctx.stack.push_async_callback(store.close)  # NOTE: after the uploader stops (the stack runs backwards)
    io = StoreIO(store, copier.host)
    io.start()
    ctx.stack.push_async_callback(io.stop)
    copier.store_io = io
    await FetchEndpoint(worker, io).start(ctx.bus)
    STORE_AVAILABLE.set(1)
    log.info("shared KV store: %s (%d-token pages of %d bytes)", where, spec.page_tokens, spec.value_bytes)
    return io


async def _open_nats(ctx: ServiceContext, config: StoreConfig, spec: PageSpec,
                     bus: Bus | None) -> tuple[PageStore, str] | None:
    if config.url:
        try:  # NOTE: a store of its own may be down: serve without it rather than hang here
            bus = await asyncio.wait_for(open_data_bus(ctx, config.url), STORE_CONNECT_S)
        except (asyncio.TimeoutError, OSError) as exc:
            log.error("shared KV store at %s unreachable (%s, waited up to %.0f s): serving without it "
                      "(restart to retry)", config.url, type(exc).__name__, STORE_CONNECT_S)
            return None
    bus = bus if bus is not None else await open_data_bus(ctx)
    try:
        store = await JetStreamStore.open(bus.nc, spec, config.bucket, config.max_bytes)
    except (StoreError, TransferError) as exc:
        raise SystemExit(f"gpu_worker: --kv-store nats: {exc}") from None
    return store, f"JetStream bucket {config.bucket} (at most {config.max_bytes} bytes)"


async def _open_mooncake(config: StoreConfig, spec: PageSpec) -> tuple[PageStore, str] | None:
    from libs.transfer.mooncake_store import DEFAULT_MASTER, MooncakeConfig, MooncakeStore

    mooncake = MooncakeConfig(master=config.url or DEFAULT_MASTER, metadata=config.mooncake_metadata,
                              hostname=config.mooncake_hostname, segment_bytes=config.max_bytes)
    try:
        store = await MooncakeStore.open(spec, mooncake, setup_timeout_s=STORE_CONNECT_S)
    except StoreNotInstalled as exc:
        raise SystemExit(f"gpu_worker: --kv-store mooncake: {exc}") from None
    except StoreUnavailable as exc:  # NOTE: as an unreachable NATS store: serve without it
        log.error("shared KV store unreachable (%s): serving without it (restart to retry)", exc)
        return None
    return store, f"Mooncake Store, master {mooncake.master} (this worker's segment: {mooncake.segment_bytes} bytes)"
