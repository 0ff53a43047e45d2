"""The Mooncake path's failures between real workers (the helpers of the fault tests):
a byte flipped in the landing buffer fails the checksum, an absent peer is no_route at
once, a peer slower than the deadline is a timeout whose late "written" is refused, and
a landing buffer never written is reaped; none leaves anything staged or reserved."""

from __future__ import annotations

import asyncio

import pytest

from libs.protocol.messages import KVChunkAck, KVLand
from libs.transfer import HEADER_BYTES
from services.gpu_worker.kv.recv import LANDING_GRACE_S
from services.gpu_worker.kv.transfer import KVTransferConfig

from .pair import Pair
from .test_transfer_faults import _failed_send, _nothing_held, _relay

pytestmark = pytest.mark.usefixtures("mooncake")

MOONCAKE = KVTransferConfig(mode="mooncake")


async def test_a_flipped_byte_in_the_landing_buffer_fails_with_checksum(nats_server):
    async with Pair(nats_server.url, MOONCAKE) as pair:
        receiver = pair.d.paths.receiver

        def flip(msg: KVLand) -> KVLand:
            if msg.written:  # NOTE: the bytes are in D's landing buffer by now
                receiver.books.landing[msg.transfer_id].landing.data[-100] ^= 0x04
            return msg

        await _relay(pair, "relay", flip)
        error, _ = await _failed_send(pair, "bad-landing", "relay")
        assert error == "checksum"
        assert not receiver.books.retired  # checked after the write: freed at once


async def test_an_absent_peer_is_no_route_at_once(nats_server):
    async with Pair(nats_server.url, MOONCAKE) as pair:
        error, seconds = await _failed_send(pair, "nobody-mc", "nobody")
        assert error == "no_route" and seconds < 2.0


async def test_a_peer_slower_than_the_deadline_is_timeout_and_its_late_landing_refused(nats_server):
    async with Pair(nats_server.url, MOONCAKE) as pair:
        await _relay(pair, "slow", lambda msg: msg, sleep_s=0.6)
        error, seconds = await _failed_send(pair, "slow-mc", "slow", deadline_s=1.0)
        assert error == "timeout" and seconds < 1.6
        await asyncio.sleep(0.8)  # the relay forwards "written" after the sender gave up: D refuses it
        _nothing_held(pair, "slow-mc")


async def test_a_landing_never_written_is_reaped_and_its_memory_kept_for_the_grace(nats_server):
    async with Pair(nats_server.url, MOONCAKE) as pair:
        receiver, land = pair.d.paths.receiver, pair.subjects.worker_kv_land(pair.d.wid)
        nbytes = HEADER_BYTES + 2 * receiver.layout.token_bytes
        ack = await pair.bus.request(land, KVLand(transfer_id="idle", nbytes=nbytes), KVChunkAck)
        assert ack.ok and ack.session == pair.d.paths.engine.session_id and ack.address
        assert receiver.books.reserved == nbytes
        receiver.books.landing["idle"].seen -= receiver.config.partial_idle_s + 1
        assert receiver.reap() == (1, 0)
        _nothing_held(pair, "idle")
        assert [r.landing.nbytes for r in receiver.books.retired] == [nbytes]  # counted in the budget
        receiver.books.retired[0].seen -= LANDING_GRACE_S + 1
        receiver.reap()
        assert not receiver.books.retired
        late = await pair.bus.request(land, KVLand(transfer_id="idle", nbytes=nbytes, written=True), KVChunkAck)
        assert not late.ok and late.error.startswith("dropped")
