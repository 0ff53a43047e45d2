"""The page store on a real mooncake_master (TCP, no RDMA): pages round trip byte for byte into a
host pool, only leading pages count as present, a corrupted value is never returned, a stopped
master ends every call within the timeout with StoreUnavailable, and a missing one is named
at open."""

from __future__ import annotations

import time

import pytest
import torch

from libs.transfer import HostKVPool, KVLayout, PageSpec, StoreUnavailable, TransferError, page_keys, page_values
from libs.transfer.mooncake_master import free_port
from libs.transfer.mooncake_store import MooncakeConfig, MooncakeStore

from .conftest import filled_pool
from .mooncake import mooncake_master, require_mooncake  # noqa: F401 - the fixture

P = 16
TIMEOUT = 0.5


def _spec(pool) -> PageSpec:
    return PageSpec(KVLayout.of_pool(pool), P)


async def _open(master, pool, **options) -> MooncakeStore:
    return await MooncakeStore.open(_spec(pool), MooncakeConfig(master=master.address, segment_bytes=32 << 20),
                                    **options)


def _pages(pool, slots: torch.Tensor) -> tuple[HostKVPool, list[bytes]]:
    host = HostKVPool.for_pool(pool, len(slots))
    host.save(pool, slots, torch.arange(len(slots)))
    return host, page_values(_spec(pool), host.read(torch.arange(len(slots))))


def _keys(n: int, salt: str = "") -> list[str]:
    return page_keys("SmolLM2-135M", "float32", list(range(n * P)), salt, P)


async def test_pages_round_trip_leading_hits_and_bad_values(mooncake_master, pool):
    store = await _open(mooncake_master, pool)
    try:
        slots = torch.randperm(pool.num_slots, generator=torch.Generator().manual_seed(3))[: 3 * P]
        host, values = _pages(pool, slots)
        keys = _keys(5)
        assert await store.batch_set(list(zip(keys[:3], values))) == 3
        assert await store.batch_get(keys[:3]) == values  # byte for byte
        other = HostKVPool.for_pool(pool, 3 * P)
        for i, value in enumerate(await store.batch_get(keys[:3])):
            other.write(torch.arange(i * P, (i + 1) * P), _spec(pool).check(value))
        assert torch.equal(other.data, host.data)
        assert await store.batch_set([(keys[4], values[0])]) == 1
        assert await store.batch_exists(keys) == 3  # keys[3] missing: the leading run ends there
        assert await store.batch_exists(keys[3:]) == 0 and await store.batch_exists([]) == 0
        assert await store.batch_get([keys[3], keys[0]]) == [None, values[0]]
        assert store.stats.missing == 1
        damaged = bytearray(values[1])
        damaged[-5] ^= 0x40  # the CRC-32 no longer matches
        bad = _keys(3, "bad")
        for key, raw in zip(bad, (bytes(damaged), b"not a kv buffer", values[0] + values[1])):
            assert store.client.put(key, raw) == 0  # past the store's checks
        assert await store.batch_exists(bad) == 3  # present, though bad: a get tells
        assert await store.batch_get(bad) == [None, None, None]
        assert store.stats.bad == 3
        with pytest.raises(TransferError):
            await store.batch_set([(keys[0], bytes(damaged))])
    finally:
        await store.close()


async def test_a_stopped_master_ends_every_call_within_the_timeout(mooncake_master, pool):
    store = await _open(mooncake_master, pool, timeout_s=TIMEOUT)
    _, values = _pages(pool, torch.arange(2 * P))
    keys = _keys(2, "down")
    assert await store.batch_set(list(zip(keys, values))) == 2
    mooncake_master.stop()
    for call in (lambda: store.batch_exists(keys), lambda: store._exists(keys[0]),
                 lambda: store.batch_get(keys), lambda: store.batch_set(list(zip(keys, values)))):
        start = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await call()
        assert time.monotonic() - start < TIMEOUT + 1.0
    assert store.stats.errors >= 3
    start = time.monotonic()
    await store.close()  # not closed: the master is gone (closing would wait it out)
    assert time.monotonic() - start < TIMEOUT + 1.0
    mooncake_master.start()  # NOTE: back, so the client's destructor unmounts at once
    await store.close()


async def test_no_master_is_named_at_open(pool):
    require_mooncake()
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no Mooncake master listens"):
        await MooncakeStore.open(_spec(pool), MooncakeConfig(master=f"127.0.0.1:{free_port()}"), timeout_s=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT + 1.0


async def test_two_clients_read_each_others_pages(mooncake_master):
    """Pages land in either client's segment; each reads them all (the transfer engine over TCP)."""
    pool = filled_pool(num_slots=8 * P)
    a, b = await _open(mooncake_master, pool), await _open(mooncake_master, pool)
    try:
        _, values = _pages(pool, torch.arange(8 * P))
        keys = _keys(8, "two")
        assert await a.batch_set(list(zip(keys[:4], values[:4]))) == 4
        assert await b.batch_set(list(zip(keys[4:], values[4:]))) == 4
        assert await a.batch_get(keys) == values and await b.batch_get(keys) == values
    finally:
        await a.close()
        await b.close()
