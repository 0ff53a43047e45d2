"""The prefill side of a KV transfer: ``worker_kv_send(id)``, KVSend -> KVSendReply.

Export the slots (in a thread: the scheduler keeps them locked, so reading them while
forwards run is safe), then push the sealed buffer to the destination worker:

    shm       a file under /dev/shm, then KVShmReady (the receiver reads and removes it)
    nats      KVChunk requests of <= max_payload, ``in_flight`` outstanding, each with its CRC
    mooncake  KVLand (the receiver's landing buffer: session, address), one engine write
              of the sealed buffer, KVLand written (the receiver checks it whole); a
              receiver without an engine (mooncake_unavailable) gets chunks instead

The reply comes once the destination staged the whole buffer, checked, or says why not
within ``deadline_s`` (error "timeout", "no_route", "checksum", "refused: ...", ...):
never a hang, never an exception. A failed transfer is dropped on the destination
(KVDrop) and leaves no shared-memory file behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import torch

from libs.protocol.bus import Bus
from libs.protocol.errors import ServiceError
from libs.protocol.messages import KVChunk, KVChunkAck, KVDrop, KVLand, KVSend, KVSendReply, KVShmReady
from libs.protocol.subjects import check_token
from libs.transfer import HEADER_BYTES, KVLayout, TransferError, shm
from libs.transfer.chunks import Chunk, chunk_count, iter_chunks
from libs.transfer.codec import export_payload, export_wire
from libs.transfer.mooncake import MooncakeEngine

from ..compute import side_thread
from ..service import WorkerService
from .transfer import (
    MOONCAKE, MOONCAKE_UNAVAILABLE, NO_ROUTE, REFUSED, SHM_UNAVAILABLE, TIMEOUT, TRANSFER_BYTES,
    TRANSFER_FAILURES, TRANSFER_SECONDS, KVTransferConfig, chunk_limit, reason_of,
)

log = logging.getLogger("gpu_worker.kv_send")

_NO_ROUTE_CODES = ("service_unavailable", "broker_unavailable")


class _Failed(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class KVSender:
    def __init__(self, worker: WorkerService, config: KVTransferConfig = KVTransferConfig(),
                 engine: MooncakeEngine | None = None) -> None:
        if config.mode == "mooncake" and engine is None:
            raise ValueError("kv transfer mode mooncake needs a Mooncake engine")
        self.worker = worker
        self.config = config
        self.engine = engine
        self.shm_ok = shm.writable()
        self._bus: Bus | None = None
        self._no_engine: set[str] = set()  # receivers that answered mooncake_unavailable (logged once)

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        await bus.subscribe(self.worker.subjects.worker_kv_send(self.worker.worker_id), self.on_send, KVSend,
                            concurrent=True)

    def path_for(self, dest_host: str) -> str:
        """"shm", "nats" or "mooncake": forced by the mode, else shm for a peer on this host."""
        if self.config.mode != "auto":
            return self.config.mode
        same_host = bool(dest_host) and dest_host == self.worker.host_id
        return "shm" if same_host and self.shm_ok else "nats"

    async def on_send(self, msg: KVSend) -> KVSendReply:
        self.worker.adoption.require_owner()
        start = time.perf_counter()
        try:
            reply = await asyncio.wait_for(self._send(msg), timeout=max(msg.deadline_s, 0.0))
        except TimeoutError:
            reply = KVSendReply(ok=False, error=TIMEOUT)
        except _Failed as exc:
            reply = KVSendReply(ok=False, error=exc.error)
        reply.seconds = time.perf_counter() - start
        await self._account(msg, reply)
        return reply

    async def _account(self, msg: KVSend, reply: KVSendReply) -> None:
        if reply.ok:
            TRANSFER_BYTES.labels(reply.path, "send").inc(reply.nbytes)
            TRANSFER_SECONDS.labels(reply.path).observe(reply.seconds)
            return
        TRANSFER_FAILURES.labels(reason_of(reply.error)).inc()
        log.warning("transfer %s to %s failed after %.3fs: %s", msg.transfer_id, msg.dest_worker,
                    reply.seconds, reply.error)
        if _valid_token(msg.dest_worker):  # NOTE: best effort: the receiver also reaps what stays
            try:
                await self._bus.publish(self.worker.subjects.worker_kv_drop(msg.dest_worker),
                                        KVDrop(transfer_ids=[msg.transfer_id]))
            except Exception as exc:  # noqa: BLE001 - the reply matters more than the cleanup
                log.debug("KVDrop for %s not sent: %r", msg.transfer_id, exc)

    async def _send(self, msg: KVSend) -> KVSendReply:
        self._check(msg)
        path = self.path_for(msg.dest_host)
        if path != "nats":
            try:
                return await (self._push_mooncake(msg) if path == "mooncake" else self._push_shm(msg))
            except _Failed as exc:
                if not self._falls_back(msg, path, exc.error):
                    raise
        layout, payload = await side_thread(self._export, msg.slots)
        return await self._push_nats(msg, layout, payload)

    def _falls_back(self, msg: KVSend, path: str, error: str) -> bool:
        """Whether a failed push goes out as chunks instead: to a receiver without an
        engine (mooncake; logged once per receiver), or one that cannot read the file
        (shm, in auto mode)."""
        reason = reason_of(error)
        if path == "mooncake" and reason == MOONCAKE_UNAVAILABLE:
            if msg.dest_worker not in self._no_engine:
                self._no_engine.add(msg.dest_worker)
                log.warning("%s; sending it chunks instead", error)
            return True
        if path == "shm" and self.config.mode == "auto" and reason == SHM_UNAVAILABLE:
            log.info("transfer %s: %s; sending chunks instead", msg.transfer_id, error)
            return True
        return False

    def _check(self, msg: KVSend) -> None:
        size = self.worker.runner.kv.num_slots
        if not _valid_token(msg.dest_worker) or not 0 < len(msg.transfer_id) <= 256:
            raise _Failed(f"{REFUSED}: dest_worker must be a subject token, transfer_id 1-256 characters")
        if msg.slots and (min(msg.slots) < 0 or max(msg.slots) >= size):
            raise _Failed(f"{REFUSED}: slot out of range [0, {size})")

    def _export(self, slots: list[int]) -> tuple[KVLayout, memoryview]:
        """The slots' bytes, not checksummed yet: each chunk's CRC is computed as it is sent."""
        try:
            return export_payload(self.worker.runner.kv, torch.tensor(slots, dtype=torch.int64))
        except TransferError as exc:
            raise _Failed(f"{REFUSED}: {exc}") from None

    # -- paths ------------------------------------------------------------------

    async def _push_shm(self, msg: KVSend) -> KVSendReply:
        """Gather straight into the shared-memory file (in a thread), then hand it over."""
        name = shm.new_name(self.worker.worker_id)
        slots = torch.tensor(msg.slots, dtype=torch.int64)
        writing = asyncio.ensure_future(side_thread(shm.export, name, self.worker.runner.kv, slots))
        try:
            nbytes = await asyncio.shield(writing)
            ready = KVShmReady(transfer_id=msg.transfer_id, name=name, nbytes=nbytes)
            ack = await self._request(self.worker.subjects.worker_kv_shm(msg.dest_worker), ready)
        except OSError as exc:
            raise _Failed(f"{SHM_UNAVAILABLE}: cannot write {name}: {exc.strerror}") from None
        except TransferError as exc:
            raise _Failed(f"{REFUSED}: {exc}") from None
        finally:
            _remove_when_written(writing, name)
        _require(ack, last=True)
        return KVSendReply(ok=True, nbytes=nbytes, path="shm", chunks=1)

    async def _push_mooncake(self, msg: KVSend) -> KVSendReply:
        """Gather the sealed buffer (in a thread), write it into the receiver's landing buffer."""
        try:
            wire = await side_thread(export_wire, self.worker.runner.kv, torch.tensor(msg.slots, dtype=torch.int64))
        except TransferError as exc:
            raise _Failed(f"{REFUSED}: {exc}") from None
        subject = self.worker.subjects.worker_kv_land(msg.dest_worker)
        land = await self._request(subject, KVLand(transfer_id=msg.transfer_id, nbytes=wire.nbytes))
        _require(land, last=False)
        try:
            await asyncio.to_thread(self.engine.write, land.session, wire, land.address)
        except TransferError as exc:
            raise _Failed(f"{MOONCAKE}: {exc}") from None
        done = await self._request(subject, KVLand(transfer_id=msg.transfer_id, nbytes=wire.nbytes, written=True))
        _require(done, last=True)
        return KVSendReply(ok=True, nbytes=wire.nbytes, path="mooncake", chunks=1)

    async def _push_nats(self, msg: KVSend, layout: KVLayout, payload: memoryview) -> KVSendReply:
        limit = chunk_limit(self.config, self._bus.nc.max_payload)
        total = HEADER_BYTES + len(payload)
        count = chunk_count(total, limit)
        chunks = iter_chunks(layout, len(payload) // layout.token_bytes, payload, limit)
        subject = self.worker.subjects.worker_kv_recv(msg.dest_worker)
        staged: list[bool] = []
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(min(self.config.in_flight, count)):
                    tg.create_task(self._pump(subject, msg.transfer_id, chunks, staged))
        except* _Failed as group:
            raise group.exceptions[0] from None
        if not any(staged):
            raise _Failed(f"{REFUSED}: every chunk acknowledged, the transfer not staged")
        return KVSendReply(ok=True, nbytes=total, path="nats", chunks=count)

    async def _pump(self, subject: str, tid: str, chunks: Iterator[Chunk], staged: list[bool]) -> None:
        """Send chunks until none are left (the iterator is shared by ``in_flight`` pumps)."""
        for c in chunks:
            chunk = KVChunk(transfer_id=tid, index=c.index, count=c.count, total_bytes=c.total_bytes,
                            crc=c.crc, data=c.data)
            ack = await self._request(subject, chunk)
            _require(ack, last=False)
            staged.append(ack.staged)

    async def _request(self, subject: str, msg: KVChunk | KVShmReady | KVLand) -> KVChunkAck:
        # NOTE: no own timeout: on_send's deadline cancels whatever is in flight
        try:
            return await self._bus.request(subject, msg, KVChunkAck, timeout=3600.0)
        except ServiceError as exc:
            if exc.code in _NO_ROUTE_CODES:
                raise _Failed(NO_ROUTE) from None
            if exc.code == "timeout":
                raise _Failed(TIMEOUT) from None
            raise _Failed(f"{REFUSED}: {exc.code}: {exc.message}") from None


def _require(ack: KVChunkAck, last: bool) -> None:
    """Raise the receiver's reason unless ``ack`` is ok (and, for the last, staged)."""
    if not ack.ok:
        reason = reason_of(ack.error)
        raise _Failed(ack.error if reason in (REFUSED, SHM_UNAVAILABLE, MOONCAKE_UNAVAILABLE) else reason)
    if last and not ack.staged:
        raise _Failed(f"{REFUSED}: the receiver did not stage the transfer")


def _remove_when_written(writing: asyncio.Future, name: str) -> None:
    """Remove the file once the writer thread is done (at once if it is): whatever the outcome."""
    def remove(_: object = None) -> None:
        if writing.done() and not writing.cancelled():
            writing.exception()  # NOTE: retrieved: the caller has already failed or moved on
        try:
            shm.remove(name)
        except OSError as exc:
            log.warning("could not remove %s: %s", name, exc)

    if writing.done():
        remove()
    else:
        writing.add_done_callback(remove)


def _valid_token(value: str) -> bool:
    try:
        check_token(value)
    except ValueError:
        return False
    return True
