from __future__ import annotations

import pytest
import torch

from libs.transfer import (
    HEADER_BYTES, ChecksumMismatch, KVBuffer, LayoutMismatch, SizeMismatch, SlotError, export_slots,
    import_slots,
)

from .conftest import filled_pool, snapshot


def _same_tokens(a, a_slots, b, b_slots) -> bool:
    return all(torch.equal(x[a_slots], y[b_slots]) for x, y in zip(a.k + a.v, b.k + b.v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_export_then_import_round_trips_through_bytes(dtype):
    src, dst = filled_pool(dtype=dtype), filled_pool(dtype=dtype, seed=1)
    buf = export_slots(src, torch.tensor([3, 1, 40, 8]))
    assert buf.num_tokens == 4 and buf.nbytes == 4 * buf.layout.token_bytes
    wire = buf.to_bytes()
    assert len(wire) == HEADER_BYTES + buf.nbytes
    import_slots(dst, torch.tensor([10, 11, 12, 13]), KVBuffer.from_bytes(wire))
    assert _same_tokens(src, [3, 1, 40, 8], dst, [10, 11, 12, 13])


def test_a_corrupted_payload_is_refused_and_nothing_is_written(pool):
    wire = bytearray(export_slots(filled_pool(seed=2), torch.tensor([0, 1, 2])).to_bytes())
    wire[HEADER_BYTES + 17] ^= 0x01
    before = snapshot(pool)
    with pytest.raises(ChecksumMismatch):
        import_slots(pool, torch.tensor([4, 5, 6]), KVBuffer.from_bytes(wire))
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool)))


def test_size_and_layout_mismatches_are_typed(pool):
    buf = export_slots(pool, torch.tensor([0, 1, 2]))
    wire = buf.to_bytes()
    with pytest.raises(SizeMismatch):
        KVBuffer.from_bytes(wire[:-4])  # truncated payload
    with pytest.raises(SizeMismatch):
        KVBuffer.from_bytes(wire[: HEADER_BYTES - 1])
    with pytest.raises(LayoutMismatch):
        KVBuffer.from_bytes(b"XXXX" + wire[4:])
    with pytest.raises(SizeMismatch):
        import_slots(pool, torch.tensor([4, 5]), buf)  # 3 tokens into 2 slots
    with pytest.raises(LayoutMismatch, match="2 KV heads x 4 dims, float32"):
        import_slots(filled_pool(heads=1, dim=8), torch.tensor([0, 1, 2]), buf)
    with pytest.raises(LayoutMismatch, match="bfloat16"):
        import_slots(filled_pool(dtype=torch.bfloat16), torch.tensor([0, 1, 2]), buf)
    with pytest.raises(SlotError):
        import_slots(pool, torch.tensor([0, 1, 64]), buf)
    with pytest.raises(SlotError):
        import_slots(pool, torch.tensor([0, 1, 1]), buf)
    with pytest.raises(SlotError):
        export_slots(pool, torch.tensor([-1]))


def test_header_describes_the_layout(pool):
    buf = KVBuffer.from_bytes(export_slots(pool, torch.tensor([9, 9])).to_bytes())
    lay = buf.layout
    assert (lay.num_layers, lay.num_kv_heads, lay.head_dim, lay.dtype, buf.num_tokens) == (3, 2, 4, "float32", 2)


def test_empty_export_round_trips(pool):
    buf = KVBuffer.from_bytes(export_slots(pool, torch.tensor([], dtype=torch.int64)).to_bytes())
    assert buf.num_tokens == 0
    import_slots(pool, torch.tensor([], dtype=torch.int64), buf)
