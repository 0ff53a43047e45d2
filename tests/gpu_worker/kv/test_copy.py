"""KVCopier on small pools (no model): order within a batch, and every refusal before any state."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool
from libs.protocol import ServiceError
from libs.protocol.messages import KVCopy
from libs.transfer import KVBuffer, StagingBuffers, export_slots
from services.gpu_worker.kv.copy import KVCopier


def _pool(layers: int = 2, slots: int = 32, heads: int = 2, dim: int = 4, seed: int = 0) -> KVPool:
    pool = KVPool(layers, slots, heads, dim)
    gen = torch.Generator().manual_seed(seed)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=gen))
    return pool


def _state(c: KVCopier) -> list[torch.Tensor]:
    host = [c.host.data.clone()] if c.host is not None else []
    return [t.clone() for t in c.pool.k + c.pool.v] + host


def _tokens(pool: KVPool, slots: list[int]) -> list[torch.Tensor]:
    return [t[slots] for t in pool.k + pool.v]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_copies_run_in_order_within_one_batch():
    c = KVCopier(_pool(), host_slots=8)
    original = _tokens(c.pool, [1, 2, 3])
    c.run([
        KVCopy(kind="export", src=[1, 2, 3], buffer="p"),
        KVCopy(kind="d2h", src=[1, 2, 3], dst=[5, 6, 7]),
        KVCopy(kind="import", dst=[10, 11, 12], buffer="p"),  # reads what the export just wrote
        KVCopy(kind="h2d", src=[5, 6, 7], dst=[20, 21, 22]),
        KVCopy(kind="d2h", src=[4, 4, 4], dst=[5, 6, 7]),  # host slots reused after the h2d
    ])
    assert _same(_tokens(c.pool, [10, 11, 12]), original) and _same(_tokens(c.pool, [20, 21, 22]), original)
    assert len(c.staging) == 0 and c.staging.nbytes == 0
    assert torch.equal(c.host.data[6], c.host.data[5])


def test_copies_of_no_slots_are_valid_and_change_nothing():
    c = KVCopier(_pool(), host_slots=8)
    before = _state(c)
    c.run([KVCopy(kind="d2h"), KVCopy(kind="h2d"), KVCopy(kind="export", buffer="e"),
           KVCopy(kind="import", buffer="e")])
    assert _same(before, _state(c)) and len(c.staging) == 0


def test_a_buffer_put_by_a_data_path_is_imported_and_released():
    source, c = _pool(seed=1), KVCopier(_pool())
    c.staging.put("remote-1", KVBuffer.from_bytes(export_slots(source, torch.tensor([7, 8])).to_bytes()))
    c.run([KVCopy(kind="import", dst=[0, 31], buffer="remote-1")])
    assert _same(_tokens(c.pool, [0, 31]), _tokens(source, [7, 8]))
    assert "remote-1" not in c.staging


def _corrupt(pool: KVPool) -> KVBuffer:
    wire = bytearray(export_slots(pool, torch.tensor([0, 1])).to_bytes())
    wire[-1] ^= 0xFF
    return KVBuffer.from_bytes(wire)


BAD = [
    ([KVCopy(kind="h2d", src=[0], dst=[0])], "no host KV pool", dict(host_slots=0)),
    ([KVCopy(kind="d2h", src=[0, 32], dst=[0, 1])], "slot out of range", {}),
    ([KVCopy(kind="d2h", src=[0, 1], dst=[0, 8])], "slot out of range", {}),
    ([KVCopy(kind="h2d", src=[0, 1], dst=[3, 3])], "slots repeat", {}),
    ([KVCopy(kind="d2h", src=[0, 1], dst=[2])], "2 source slots for 1", {}),
    ([KVCopy(kind="d2h", src=[0], dst=[1], buffer="x")], "takes no transfer buffer", {}),
    ([KVCopy(kind="export", src=[0])], "needs a buffer id", {}),
    ([KVCopy(kind="import", dst=[0], buffer="nope")], "no transfer buffer 'nope'", {}),
    ([KVCopy(kind="import", src=[0], dst=[0], buffer="old")], "no src slots", {}),
    ([KVCopy(kind="export", src=[0], buffer="old")], "already exists", {}),
    ([KVCopy(kind="import", dst=[0, 1, 2], buffer="old")], "holds 2 tokens, 3 slots given", {}),
    ([KVCopy(kind="import", dst=[0, 1], buffer="alien")], "layout mismatch", {}),
    ([KVCopy(kind="import", dst=[0, 1], buffer="corrupt")], "checksum mismatch", {}),
    ([KVCopy(kind="export", src=list(range(32)), buffer="big")], "staging budget", {}),
    ([KVCopy(kind="export", src=[1 << 70], buffer="x")], "64-bit integers", {}),
    ([KVCopy(kind="move", src=[0], dst=[1])], "unknown kind", {}),  # only in process: the wire refuses it
    # the third copy is bad: the first two must not have run
    ([KVCopy(kind="d2h", src=[0], dst=[0]), KVCopy(kind="import", dst=[9, 10], buffer="old"),
      KVCopy(kind="import", dst=[9, 10], buffer="old")], "no transfer buffer 'old'", {}),
    ([KVCopy(kind="export", src=[1], buffer="n"), KVCopy(kind="import", dst=[2, 3], buffer="n")],
     "holds 1 tokens, 2 slots given", {}),
]


@pytest.mark.parametrize("copies, message, kw", BAD)
def test_bad_copies_are_400_before_any_state_changes(copies, message, kw):
    c = KVCopier(_pool(), **dict(dict(host_slots=8, staging=StagingBuffers(max_bytes=20 * 2 * 2 * 2 * 4 * 4)), **kw))
    c.staging.put("old", export_slots(c.pool, torch.tensor([5, 6])))
    c.staging.put("alien", export_slots(_pool(heads=1, dim=8), torch.tensor([5, 6])))
    c.staging.put("corrupt", _corrupt(c.pool))
    before, ids = _state(c), c.staging.ids()
    with pytest.raises(ServiceError, match=message) as err:
        c.run(copies)
    assert (err.value.code, err.value.status) == ("invalid_request_error", 400)
    assert _same(before, _state(c)) and c.staging.ids() == ids


def test_negative_host_slots_are_refused():
    with pytest.raises(ValueError):
        KVCopier(_pool(), host_slots=-1)
