import numpy as np
import pytest

from services.scheduler.allocator import OutOfSlots, RowAllocator, SlotAllocator


def test_slots_are_unique_and_recycled():
    alloc = SlotAllocator(10)
    a, b = alloc.alloc(4), alloc.alloc(6)
    assert sorted(np.concatenate([a, b]).tolist()) == list(range(10))
    assert alloc.num_free == 0
    with pytest.raises(OutOfSlots):
        alloc.alloc(1)
    alloc.free(a)
    c = alloc.alloc(4)
    assert sorted(c.tolist()) == sorted(a.tolist())
    alloc.free(b)
    alloc.free(c)
    with pytest.raises(RuntimeError):
        alloc.free(c)


def test_rows():
    rows = RowAllocator(2)
    r1, r2 = rows.alloc(), rows.alloc()
    assert {r1, r2} == {0, 1}
    with pytest.raises(OutOfSlots):
        rows.alloc()
    rows.free(r1)
    assert rows.alloc() == r1
