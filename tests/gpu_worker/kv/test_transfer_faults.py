"""KV transfers that fail end in seconds with one reason, stage nothing and leave no
shared-memory file: a corrupted chunk or file (a relay on the real broker flips a byte),
an absent peer, a peer too slow for the deadline, a drop before late chunks, refusals."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest
import torch
from prometheus_client import REGISTRY

from libs.kernels import KVPool
from libs.protocol.messages import KVChunk, KVChunkAck, KVDrop, KVLand, KVShmReady, staging_id
from libs.transfer import HEADER_BYTES, export_slots, shm
from libs.transfer.chunks import chunks_of
from services.gpu_worker.kv.transfer import KVTransferConfig

from .pair import Pair, prompt_ids


async def _relay(pair: Pair, name: str, tamper, sleep_s: float = 0.0) -> None:
    """Worker ``name``'s chunk, shm and land subjects, answered by forwarding to D after
    ``tamper`` (and its drops forwarded as they are)."""
    s, d = pair.subjects, pair.d.wid

    async def on_chunk(msg: KVChunk) -> KVChunkAck:
        await asyncio.sleep(sleep_s)
        return await pair.bus.request(s.worker_kv_recv(d), tamper(msg), KVChunkAck, timeout=30)

    async def on_shm(msg: KVShmReady) -> KVChunkAck:
        await asyncio.sleep(sleep_s)
        return await pair.bus.request(s.worker_kv_shm(d), tamper(msg), KVChunkAck, timeout=30)

    async def on_land(msg: KVLand) -> KVChunkAck:
        await asyncio.sleep(sleep_s)
        return await pair.bus.request(s.worker_kv_land(d), tamper(msg), KVChunkAck, timeout=30)

    async def on_drop(msg: KVDrop) -> None:
        await pair.bus.publish(s.worker_kv_drop(d), msg)

    await pair.bus.subscribe(s.worker_kv_drop(name), on_drop, KVDrop)
    await pair.bus.subscribe(s.worker_kv_recv(name), on_chunk, KVChunk, concurrent=True)
    await pair.bus.subscribe(s.worker_kv_shm(name), on_shm, KVShmReady, concurrent=True)
    await pair.bus.subscribe(s.worker_kv_land(name), on_land, KVLand, concurrent=True)
    await pair.bus.nc.flush()


def _flip_chunk(recompute_crc: bool):
    def tamper(msg: KVChunk) -> KVChunk:
        if msg.index == msg.count - 1:
            data = bytearray(msg.data)
            data[len(data) // 2] ^= 0x10
            msg.data = bytes(data)
            msg.crc = zlib.crc32(data) if recompute_crc else msg.crc
        return msg
    return tamper


def _flip_file(msg: KVShmReady) -> KVShmReady:
    path = shm.SHM_DIR / msg.name
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 100)
        byte = f.read(1)
        f.seek(HEADER_BYTES + 100)
        f.write(bytes([byte[0] ^ 0x01]))
    return msg


def _nothing_held(pair: Pair, tid: str) -> None:
    books = pair.d.paths.receiver.books
    assert staging_id(tid) not in pair.d.staging and tid not in books.partial and books.reserved == 0
    assert tid not in books.landing
    assert pair.leftovers() == []


async def _failed_send(pair: Pair, tid: str, dest: str, deadline_s: float = 10.0) -> tuple[str, float]:
    slots, _ = await pair.prefill(pair.p, prompt_ids())
    start = time.monotonic()
    reply = await pair.send(tid, slots, dest, pair.d.service.host_id, deadline_s)
    assert not reply.ok
    await asyncio.sleep(0.1)  # the sender's KVDrop, the relay's late forwards
    _nothing_held(pair, tid)
    return reply.error, time.monotonic() - start


@pytest.mark.parametrize("recompute_crc", [False, True], ids=["chunk-crc", "buffer-crc"])
async def test_a_corrupted_chunk_fails_the_transfer_with_checksum(nats_server, recompute_crc):
    async with Pair(nats_server.url, KVTransferConfig(mode="nats")) as pair:
        await _relay(pair, "relay", _flip_chunk(recompute_crc))
        error, _ = await _failed_send(pair, "bad-chunk", "relay")
        assert error == "checksum"


async def test_a_corrupted_shm_file_fails_the_transfer_with_checksum(nats_server):
    async with Pair(nats_server.url, KVTransferConfig(mode="shm")) as pair:
        await _relay(pair, "relay", _flip_file)
        error, _ = await _failed_send(pair, "bad-file", "relay")
        assert error == "checksum"


@pytest.mark.parametrize("mode", ["shm", "nats"])
async def test_an_absent_peer_is_no_route_at_once(nats_server, mode):
    failures = REGISTRY.get_sample_value("radixmesh:kv_transfer_failures_total", {"reason": "no_route"}) or 0.0
    async with Pair(nats_server.url, KVTransferConfig(mode=mode)) as pair:
        error, seconds = await _failed_send(pair, f"nobody-{mode}", "nobody")
        assert error == "no_route" and seconds < 2.0
    assert REGISTRY.get_sample_value("radixmesh:kv_transfer_failures_total", {"reason": "no_route"}) == failures + 1


@pytest.mark.parametrize("mode", ["shm", "nats"])
async def test_a_peer_slower_than_the_deadline_is_timeout(nats_server, mode):
    async with Pair(nats_server.url, KVTransferConfig(mode=mode)) as pair:
        await _relay(pair, "slow", lambda msg: msg, sleep_s=1.5)
        error, seconds = await _failed_send(pair, f"slow-{mode}", "slow", deadline_s=0.5)
        assert error == "timeout" and seconds < 1.5
        await asyncio.sleep(1.6)  # the relay forwards after the sender gave up: D refuses it
        _nothing_held(pair, f"slow-{mode}")


async def test_auto_falls_back_to_chunks_when_the_peer_cannot_read_the_file(nats_server):
    def lose_file(msg):
        if isinstance(msg, KVShmReady):
            shm.remove(msg.name)
        return msg

    async with Pair(nats_server.url, KVTransferConfig(mode="auto")) as pair:
        await _relay(pair, "relay", lose_file)
        slots, _ = await pair.prefill(pair.p, prompt_ids())
        reply = await pair.send("lost-file", slots, "relay", pair.d.service.host_id)
        assert reply.ok and reply.path == "nats" and staging_id("lost-file") in pair.d.staging
        assert pair.leftovers() == []


def _chunks(tid: str, buffer, limit: int = 20_000) -> list[KVChunk]:
    return [KVChunk(transfer_id=tid, index=c.index, count=c.count, total_bytes=c.total_bytes, crc=c.crc,
                    data=bytes(c.data)) for c in chunks_of(buffer, limit)]


async def _send_chunks(pair: Pair, chunks: list[KVChunk]) -> list[KVChunkAck]:
    subject = pair.subjects.worker_kv_recv(pair.d.wid)
    return [await pair.bus.request(subject, c, KVChunkAck) for c in chunks]


async def test_a_dropped_or_idle_transfer_refuses_its_late_chunks(nats_server):
    async with Pair(nats_server.url) as pair:
        slots, _ = await pair.prefill(pair.p, prompt_ids())
        buffer = export_slots(pair.p.runner.kv, torch.tensor(slots))
        receiver = pair.d.paths.receiver
        chunks = {tid: _chunks(tid, buffer) for tid in ("late", "idle")}
        for tid, (first, *_) in chunks.items():
            [ack] = await _send_chunks(pair, [first])
            assert ack.ok and tid in receiver.books.partial
        await pair.bus.publish(pair.subjects.worker_kv_drop(pair.d.wid), KVDrop(transfer_ids=["late"]))
        await pair.bus.nc.flush()
        await asyncio.sleep(0.1)
        receiver.books.partial["idle"].seen -= receiver.config.partial_idle_s + 1  # no chunk for long
        assert receiver.reap() == (1, 0)
        for tid, (_, *rest) in chunks.items():
            acks = await _send_chunks(pair, rest)
            assert not any(a.ok or a.staged for a in acks) and all(a.error.startswith("dropped") for a in acks)
            _nothing_held(pair, tid)


async def test_kv_of_another_layout_is_refused(nats_server):
    async with Pair(nats_server.url) as pair:
        lay = pair.d.paths.receiver.layout
        other = KVPool(lay.num_layers, 64, lay.num_kv_heads * 2, lay.head_dim, torch.bfloat16)  # same token bytes
        acks = await _send_chunks(pair, _chunks("alien", export_slots(other, torch.arange(20))))
        assert all(a.ok for a in acks[:-1]) and acks[-1].error.startswith("refused: KV layout mismatch")
        _nothing_held(pair, "alien")


async def test_a_staged_transfer_is_freed_by_a_drop_or_after_its_ttl(nats_server):
    async with Pair(nats_server.url, KVTransferConfig(mode="nats")) as pair:
        slots, _ = await pair.prefill(pair.p, prompt_ids())
        assert (await pair.send("staged", slots, pair.d.wid)).ok
        await pair.bus.publish(pair.subjects.worker_kv_drop(pair.d.wid), KVDrop(transfer_ids=["staged"]))
        await pair.bus.nc.flush()
        await asyncio.sleep(0.1)
        _nothing_held(pair, "staged")
        receiver = pair.d.paths.receiver
        assert (await pair.send("ttl", slots, pair.d.wid)).ok
        receiver.books.staged["ttl"] -= receiver.config.staged_ttl_s + 1  # staged long ago
        assert receiver.reap() == (0, 1)
        _nothing_held(pair, "ttl")


async def test_transfers_over_the_staging_budget_or_to_an_unadopted_worker_are_refused(nats_server):
    async with Pair(nats_server.url, KVTransferConfig(mode="nats")) as pair:
        slots, _ = await pair.prefill(pair.p, prompt_ids())
        staging = pair.d.staging
        budget, staging.max_bytes = staging.max_bytes, 100_000
        try:
            reply = await pair.send("big", slots, pair.d.wid)
        finally:
            staging.max_bytes = budget
        assert not reply.ok and reply.error.startswith("refused:") and "staging budget" in reply.error
        _nothing_held(pair, "big")
        pair.d.service.adoption.owner = None
        reply = await pair.send("orphan", slots, pair.d.wid)
        assert not reply.ok and "not adopted" in reply.error
        _nothing_held(pair, "orphan")
