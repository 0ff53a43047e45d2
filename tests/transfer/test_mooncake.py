"""The Mooncake path between two real transfer engines in this process (TCP, P2P
handshake): a sealed buffer written into a landing buffer arrives byte for byte and
verifies; a flipped byte fails its checksum; writes outside a registered landing
buffer, after it was sealed, or to an unreachable peer fail with a typed error."""

from __future__ import annotations

import pytest
import torch

from libs.transfer import ChecksumMismatch, KVLayout, TransferError, export_slots
from libs.transfer.codec import export_wire, import_slots
from libs.transfer.mooncake import MooncakeEngine, MooncakeWriteFailed

from .conftest import filled_pool, snapshot

pytestmark = pytest.mark.usefixtures("mooncake")


@pytest.fixture(scope="module")
def engines() -> tuple[MooncakeEngine, MooncakeEngine]:
    return MooncakeEngine("127.0.0.1"), MooncakeEngine("127.0.0.1")


def test_a_written_landing_holds_the_sealed_buffer_byte_for_byte(engines):
    sender, receiver = engines
    pool = filled_pool(dtype=torch.bfloat16)
    slots = torch.tensor([7, 3, 40, 12, 9])
    wire = export_wire(pool, slots)
    assert bytes(wire) == export_slots(pool, slots).to_bytes()
    landing = receiver.land(wire.nbytes)
    sender.write(receiver.session_id, wire, landing.address)
    buffer = landing.seal()
    assert bytes(landing.data) == bytes(wire)
    buffer.verify(KVLayout.of_pool(pool), len(slots))
    other = filled_pool(dtype=torch.bfloat16, seed=1)
    import_slots(other, torch.tensor([0, 1, 2, 3, 4]), buffer)
    assert all(torch.equal(a[[0, 1, 2, 3, 4]], b[slots]) for a, b in zip(snapshot(other), snapshot(pool)))


def test_a_flipped_byte_fails_the_checksum(engines):
    sender, receiver = engines
    pool = filled_pool()
    wire = export_wire(pool, torch.arange(10))
    landing = receiver.land(wire.nbytes)
    sender.write(receiver.session_id, wire, landing.address)
    landing.data[-5] ^= 0x01  # NOTE: damage after arrival, as a bad link or a bug would
    with pytest.raises(ChecksumMismatch):
        landing.seal().verify(KVLayout.of_pool(pool), 10)


def test_writes_only_where_invited_and_only_until_sealed(engines):
    sender, receiver = engines
    wire = export_wire(filled_pool(), torch.arange(4))
    landing = receiver.land(wire.nbytes)
    with pytest.raises(MooncakeWriteFailed):  # past its end
        sender.write(receiver.session_id, wire, landing.address + 64)
    sender.write(receiver.session_id, wire, landing.address)
    landing.seal()
    with pytest.raises(MooncakeWriteFailed):  # unregistered once sealed
        sender.write(receiver.session_id, wire, landing.address)
    with pytest.raises(MooncakeWriteFailed):  # nobody listens there
        sender.write("127.0.0.1:1", wire, landing.address)
    with pytest.raises(TransferError):
        receiver.land(0)
