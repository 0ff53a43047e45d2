from __future__ import annotations

import pytest
import torch

from libs.transfer import HostKVPool, LayoutMismatch, SlotError

from .conftest import filled_pool, snapshot


def test_device_to_host_to_device_round_trip(pool):
    host = HostKVPool.for_pool(pool, 16)
    assert not host.data.is_pinned()  # CPU device: nothing to pin for
    host.save(pool, torch.tensor([5, 30, 2]), torch.tensor([15, 0, 7]))
    # token-major: host slot 0 holds device slot 30's K/V of every layer
    assert torch.equal(host.data[0, 1, 2], pool.v[2][30])
    other = filled_pool(seed=3)
    host.load(other, torch.tensor([15, 0, 7]), torch.tensor([1, 2, 3]))
    for a, b in zip(pool.k + pool.v, other.k + other.v):
        assert torch.equal(a[[5, 30, 2]], b[[1, 2, 3]])


def test_bad_slots_are_refused_before_any_copy(pool):
    host = HostKVPool.for_pool(pool, 4)
    host.data.fill_(7.0)
    before = snapshot(pool)
    bad = [
        lambda: host.save(pool, torch.tensor([0, 1]), torch.tensor([4, 0])),  # host slot out of range
        lambda: host.save(pool, torch.tensor([64]), torch.tensor([0])),  # device slot out of range
        lambda: host.save(pool, torch.tensor([0, 1]), torch.tensor([2])),  # lengths differ
        lambda: host.save(pool, torch.tensor([0, 1]), torch.tensor([2, 2])),  # repeated destination
        lambda: host.load(pool, torch.tensor([0, 1]), torch.tensor([3, 3])),
        lambda: host.load(pool, torch.tensor([-1]), torch.tensor([3])),
    ]
    for call in bad:
        with pytest.raises(SlotError):
            call()
    with pytest.raises(LayoutMismatch):
        host.load(filled_pool(layers=2), torch.tensor([0]), torch.tensor([0]))
    assert bool((host.data == 7.0).all())
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool)))
