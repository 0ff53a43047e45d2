"""The decode side of a KV transfer: chunks (or a shared-memory file) in, one checked
buffer staged as ``staging_id(transfer_id)`` for a step's KVCopy "import".

    worker_kv_recv(id)  KVChunk -> KVChunkAck     (staged True on the chunk that completed it)
    worker_kv_shm(id)   KVShmReady -> KVChunkAck  (the file is read and removed)
    worker_kv_land(id)  KVLand -> KVChunkAck      (a registered landing buffer: session and
                                                  address; once written, checked and staged)
    worker_kv_drop(id)  KVDrop (publish)          partial chunks and staged buffers freed

A chunk that fails its CRC, its place or its size discards the whole transfer; a complete
buffer is verified whole against the own pool's layout (layout, size, checksum) before it
is staged. Dropped, failed and reaped transfers are remembered (bounded), so their late
chunks are refused instead of starting over. Partial transfers idle for
``partial_idle_s`` and staged buffers not imported within ``staged_ttl_s`` are freed.
Bytes in flight plus staged stay within the staging budget: a transfer that would pass
it is refused at its first chunk. A landing buffer dropped before it was written stays
allocated (not registered) for LANDING_GRACE_S: a write the sender started may still
be arriving into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.protocol.bus import Bus
from libs.protocol.messages import KVChunk, KVChunkAck, KVDrop, KVLand, KVShmReady, staging_id
from libs.transfer import HEADER_BYTES, KVBuffer, KVLayout, TransferError, shm
from libs.transfer.chunks import Assembly
from libs.transfer.errors import ChecksumMismatch, LayoutMismatch
from libs.transfer.mooncake import Landing, MooncakeEngine

from ..service import WorkerService
from .transfer import (
    CHECKSUM, DROPPED, MOONCAKE, MOONCAKE_UNAVAILABLE, REFUSED, SHM_UNAVAILABLE, SIZE, TRANSFER_BYTES,
    TRANSFER_FAILURES, KVTransferConfig,
)

log = logging.getLogger("gpu_worker.kv_recv")

MAX_DROP = 1024  # transfer ids taken from one KVDrop
LANDING_GRACE_S = 10.0


@dataclass
class _Partial:
    assembly: Assembly
    seen: float  # monotonic time of its last chunk


@dataclass
class _Landed:
    landing: Landing
    seen: float  # monotonic time it was reserved (or released: retired)


@dataclass
class _Books:
    """What the receiver holds: partial transfers, landing buffers (Mooncake), staged
    ones (by staging time) and the ids it forgot on purpose."""

    partial: dict[str, _Partial] = field(default_factory=dict)
    landing: dict[str, _Landed] = field(default_factory=dict)
    retired: list[_Landed] = field(default_factory=list)  # released unwritten: freed after the grace
    staged: dict[str, float] = field(default_factory=dict)
    dropped: OrderedDict[str, None] = field(default_factory=OrderedDict)
    reserved: int = 0  # bytes of transfers arriving, not yet staged

    @property
    def retired_bytes(self) -> int:
        return sum(r.landing.nbytes for r in self.retired)


class KVReceiver:
    def __init__(self, worker: WorkerService, config: KVTransferConfig = KVTransferConfig(),
                 clock: Callable[[], float] = time.monotonic, engine: MooncakeEngine | None = None) -> None:
        self.worker = worker
        self.config = config
        self.engine = engine
        self.staging = worker.runner.kv_copies.staging
        self.layout = KVLayout.of_pool(worker.runner.kv)
        self.books = _Books()
        self._clock = clock
        self._task: asyncio.Task | None = None

    async def start(self, bus: Bus) -> None:
        s, wid = self.worker.subjects, self.worker.worker_id
        await bus.subscribe(s.worker_kv_recv(wid), self.on_chunk, KVChunk, concurrent=True)
        await bus.subscribe(s.worker_kv_shm(wid), self.on_shm, KVShmReady, concurrent=True)
        await bus.subscribe(s.worker_kv_land(wid), self.on_land, KVLand, concurrent=True)
        await bus.subscribe(s.worker_kv_drop(wid), self.on_drop, KVDrop)
        self._task = asyncio.create_task(self._reap_loop())

    async def stop(self) -> None:
        for tid in list(self.books.landing):
            self.drop(tid)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- handlers ---------------------------------------------------------------

    async def on_chunk(self, msg: KVChunk) -> KVChunkAck:
        tid = msg.transfer_id
        if staging_id(tid) in self.staging and tid in self.books.staged:
            return KVChunkAck(ok=True, staged=True)  # a repeat of the completing chunk
        part = self.books.partial.get(tid)
        if part is None:
            refusal = self._refusal(tid) or self._reserve(msg.total_bytes)
            if refusal:
                return _failed(refusal)
            try:
                part = self.books.partial[tid] = _Partial(Assembly(msg.count, msg.total_bytes), self._clock())
            except TransferError as exc:
                self.books.reserved -= msg.total_bytes
                return self._fail(tid, f"{SIZE}: {exc}")
        try:
            done = part.assembly.add(msg.index, msg.count, msg.total_bytes, msg.crc, msg.data)
        except ChecksumMismatch as exc:
            return self._fail(tid, f"{CHECKSUM}: {exc}")
        except TransferError as exc:
            return self._fail(tid, f"{SIZE}: {exc}")
        part.seen = self._clock()
        if not done:
            return KVChunkAck(ok=True)
        del self.books.partial[tid]
        try:
            return await self._stage(tid, part.assembly.buffer, "nats")
        finally:
            self.books.reserved -= msg.total_bytes

    async def on_shm(self, msg: KVShmReady) -> KVChunkAck:
        tid = msg.transfer_id
        refusal = self._refusal(tid) or self._duplicate(tid) or self._reserve(msg.nbytes)
        if refusal:
            with contextlib.suppress(TransferError, OSError):
                shm.remove(msg.name)
            return _failed(refusal)
        try:
            buffer = await asyncio.to_thread(shm.open_buffer, msg.name, msg.nbytes)  # mapped, not copied
            return await self._stage(tid, lambda: buffer, "shm")
        except shm.ShmUnavailable as exc:  # NOTE: not remembered: the sender may fall back to chunks
            return _failed(f"{SHM_UNAVAILABLE}: {exc}")
        except TransferError as exc:
            return self._fail(tid, f"{SIZE}: {exc}")
        finally:
            self.books.reserved -= msg.nbytes

    async def on_land(self, msg: KVLand) -> KVChunkAck:
        if msg.written:
            return await self._landed(msg)
        tid = msg.transfer_id
        if self.engine is None:
            return _failed(f"{MOONCAKE_UNAVAILABLE}: worker {self.worker.worker_id} runs no Mooncake engine "
                           "(--kv-transfer mooncake)")
        refusal = self._refusal(tid) or self._duplicate(tid) or self._reserve(msg.nbytes)
        if refusal:
            return _failed(refusal)
        try:
            landing = self.engine.land(msg.nbytes)
        except TransferError as exc:
            self.books.reserved -= msg.nbytes
            return self._fail(tid, f"{MOONCAKE}: {exc}")
        self.books.landing[tid] = _Landed(landing, self._clock())
        return KVChunkAck(ok=True, session=self.engine.session_id, address=landing.address)

    async def _landed(self, msg: KVLand) -> KVChunkAck:
        """The sender wrote the landing buffer of ``msg.transfer_id``: seal, check, stage."""
        tid = msg.transfer_id
        landed = self.books.landing.pop(tid, None)
        if landed is None:
            return _failed(self._refusal(tid) or f"{REFUSED}: no landing buffer for transfer {tid}")
        landing = landed.landing
        try:
            if msg.nbytes != landing.nbytes:
                landing.release()
                return self._fail(tid, f"{SIZE}: {msg.nbytes} bytes written, {landing.nbytes} reserved")
            return await self._stage(tid, landing.seal, "mooncake")
        finally:
            self.books.reserved -= landing.nbytes

    async def on_drop(self, msg: KVDrop) -> None:
        for tid in msg.transfer_ids[:MAX_DROP]:
            self.drop(tid)

    # -- books ------------------------------------------------------------------

    def drop(self, tid: str) -> None:
        """Forget transfer ``tid``: its partial chunks and staged buffer freed, later chunks refused."""
        self._remember(tid)
        part = self.books.partial.pop(tid, None)
        if part is not None:
            self.books.reserved -= part.assembly.total_bytes
        landed = self.books.landing.pop(tid, None)
        if landed is not None:  # NOTE: kept (unregistered) a while: a write may be arriving
            self.books.reserved -= landed.landing.nbytes
            landed.landing.release()
            self.books.retired.append(_Landed(landed.landing, self._clock()))
        if self.books.staged.pop(tid, None) is not None:
            with contextlib.suppress(KeyError):  # NOTE: imported by a step meanwhile
                self.staging.take(staging_id(tid))

    def reap(self) -> tuple[int, int]:
        """Drop partial transfers idle too long and staged buffers never imported;
        forget staged ones a step imported. Returns (partials reaped, staged expired)."""
        now, cfg = self._clock(), self.config
        idle = [tid for tid, p in self.books.partial.items() if now - p.seen > cfg.partial_idle_s]
        idle += [tid for tid, x in self.books.landing.items() if now - x.seen > cfg.partial_idle_s]
        self.books.retired = [r for r in self.books.retired if now - r.seen <= LANDING_GRACE_S]
        for tid in [tid for tid in self.books.staged if staging_id(tid) not in self.staging]:
            del self.books.staged[tid]  # imported
        expired = [tid for tid, t in self.books.staged.items() if now - t > cfg.staged_ttl_s]
        for tid in idle + expired:
            self.drop(tid)
        TRANSFER_FAILURES.labels("abandoned").inc(len(idle))
        TRANSFER_FAILURES.labels("expired").inc(len(expired))
        if idle or expired:
            log.warning("reaped %d idle partial transfer(s), %d staged never imported", len(idle), len(expired))
        return len(idle), len(expired)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_every_s)
            self.reap()

    def _refusal(self, tid: str) -> str:
        if tid in self.books.dropped:
            return f"{DROPPED}: transfer {tid} was dropped or failed"
        if self.worker.adoption.owner is None:
            return f"{REFUSED}: worker {self.worker.worker_id} is not adopted"
        return ""

    def _duplicate(self, tid: str) -> str:
        busy = tid in self.books.partial or tid in self.books.landing or staging_id(tid) in self.staging
        return f"{REFUSED}: transfer {tid} is already arriving or staged" if busy else ""

    def _reserve(self, nbytes: int) -> str:
        """Book ``nbytes`` for a transfer about to arrive, or say why not."""
        if (nbytes - HEADER_BYTES) % self.layout.token_bytes or nbytes < HEADER_BYTES:
            return f"{REFUSED}: {nbytes} bytes is not a whole number of tokens of {self.layout.describe()}"
        in_use = self.staging.nbytes + self.books.reserved + self.books.retired_bytes
        if in_use + nbytes > self.staging.max_bytes:
            return (f"{REFUSED}: {nbytes} bytes exceed the staging budget "
                    f"({in_use} of {self.staging.max_bytes} bytes in use)")
        self.books.reserved += nbytes
        return ""

    async def _stage(self, tid: str, parse: Callable[[], KVBuffer], path: str) -> KVChunkAck:
        """Parse, verify whole (in a thread: the CRC reads every byte) and stage."""
        try:
            buffer = parse()
            await asyncio.to_thread(buffer.verify, self.layout, buffer.num_tokens)
        except ChecksumMismatch as exc:
            return self._fail(tid, f"{CHECKSUM}: {exc}")
        except LayoutMismatch as exc:
            return self._fail(tid, f"{REFUSED}: {exc}")
        except TransferError as exc:
            return self._fail(tid, f"{SIZE}: {exc}")
        if tid in self.books.dropped:  # dropped while it was being checked
            return _failed(f"{DROPPED}: transfer {tid} was dropped")
        try:
            self.staging.put(staging_id(tid), buffer)
        except TransferError as exc:
            return self._fail(tid, f"{REFUSED}: {exc}")
        self.books.staged[tid] = self._clock()
        TRANSFER_BYTES.labels(path, "recv").inc(HEADER_BYTES + buffer.nbytes)
        return KVChunkAck(ok=True, staged=True)

    def _fail(self, tid: str, error: str) -> KVChunkAck:
        """Discard transfer ``tid`` (remembered: its other chunks are refused)."""
        self.drop(tid)
        log.warning("transfer %s failed: %s", tid, error)
        return _failed(error)

    def _remember(self, tid: str) -> None:
        dropped = self.books.dropped
        dropped[tid] = None
        dropped.move_to_end(tid)
        while len(dropped) > self.config.remember_dropped:
            dropped.popitem(last=False)


def _failed(error: str) -> KVChunkAck:
    return KVChunkAck(ok=False, error=error)
