"""The shared page store on a real nats-server with JetStream: pages round trip byte for byte
into a host pool, only leading pages count as present, a corrupted value is never returned,
a full bucket drops old pages, and tenants' keys differ."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest
import torch

from libs.protocol.hashing import block_hashes
from libs.transfer import (
    HostKVPool, KVLayout, PageSpec, PageTooLarge, TransferError, page_key, page_keys, page_values, valid_key,
)
from libs.transfer.jetstream_store import JetStreamStore

from .conftest import filled_pool

P = 16  # tokens per page


@pytest.fixture
async def nc(jetstream):
    client = await nats.connect(jetstream.url)
    yield client
    await client.close()


def _spec(pool) -> PageSpec:
    return PageSpec(KVLayout.of_pool(pool), P)


async def _open(nc, pool, max_bytes: int = 16 << 20, **options) -> JetStreamStore:
    return await JetStreamStore.open(nc, _spec(pool), bucket="t" + uuid.uuid4().hex[:10], max_bytes=max_bytes,
                                     **options)


def _pages(pool, slots: torch.Tensor) -> tuple[HostKVPool, list[bytes]]:
    """``slots`` of ``pool`` saved to a host pool, then read back as one value per page."""
    host = HostKVPool.for_pool(pool, len(slots))
    host.save(pool, slots, torch.arange(len(slots)))
    return host, page_values(_spec(pool), host.read(torch.arange(len(slots))))


def _keys(n: int, salt: str = "") -> list[str]:
    return page_keys("SmolLM2-135M", "float32", list(range(n * P)), salt, P)


async def test_round_trip_into_a_host_pool_is_byte_identical(nc, pool):
    store = await _open(nc, pool)
    slots = torch.randperm(pool.num_slots, generator=torch.Generator().manual_seed(3))[: 3 * P]
    host, values = _pages(pool, slots)
    keys = _keys(3)
    assert await store.batch_set(list(zip(keys, values))) == 3
    for direct in (True, False):
        store.direct = direct
        got = await store.batch_get(keys)
        assert got == values
    other = HostKVPool.for_pool(pool, 4 * P)
    dst = torch.randperm(4 * P)[: 3 * P]
    for i, value in enumerate(got):
        other.write(dst[i * P:(i + 1) * P], _spec(pool).check(value))
    assert torch.equal(other.data[dst], host.data)
    back = filled_pool(seed=9)
    other.load(back, dst, slots)
    for a, b in zip(pool.k + pool.v, back.k + back.v):
        assert torch.equal(a[slots], b[slots])


async def test_exists_counts_only_leading_pages(nc, pool):
    store = await _open(nc, pool)
    _, values = _pages(pool, torch.arange(4 * P))
    keys = _keys(4)
    assert await store.batch_set([(keys[i], values[i]) for i in (0, 1, 3)]) == 3
    assert await store.batch_exists(keys) == 2
    assert await store.batch_exists(keys[2:]) == 0
    assert await store.batch_exists(keys[:2]) == 2
    assert await store.batch_get(keys) == [values[0], values[1], None, values[3]]
    assert store.stats.missing == 1


async def test_a_corrupted_value_is_counted_bad_and_never_returned(nc, pool):
    store = await _open(nc, pool)
    _, [good, other] = _pages(pool, torch.arange(2 * P))
    keys = _keys(3)
    damaged = bytearray(good)
    damaged[-5] ^= 0x40  # one bit of the payload: the CRC-32 no longer matches
    await store.batch_set([(keys[0], good)])
    for key, raw in ((keys[1], bytes(damaged)), (keys[2], b"not a kv buffer")):
        await nc.jetstream().publish(store.subject(key), raw)  # past the store's checks
    assert await store.batch_exists(keys) == 3  # present, though bad: a get tells
    assert await store.batch_get(keys) == [good, None, None]
    assert (store.stats.bad, store.stats.got_pages) == (2, 1)
    with pytest.raises(TransferError):
        await store.batch_set([(keys[1], bytes(damaged))])
    with pytest.raises(TransferError):
        await store.batch_set([("bad key with spaces", other)])


async def test_a_full_bucket_drops_old_pages_instead_of_refusing_puts(nc):
    pool = filled_pool(num_slots=12 * P)
    spec = _spec(pool)
    store = await _open(nc, pool, max_bytes=4 * spec.value_bytes)
    _, values = _pages(pool, torch.arange(12 * P))
    keys = _keys(12)
    for key, value in zip(keys, values):  # one at a time: the stream's order is the puts' order
        assert await store.batch_set([(key, value)]) == 1
    assert await store.batch_exists(keys) == 0  # the first ones went
    got = await store.batch_get(keys)
    assert got[-1] == values[-1] and got[0] is None
    assert 1 <= sum(v is not None for v in got) <= 4


async def test_pages_larger_than_the_broker_takes_are_refused_at_open(nc):
    huge = KVLayout(num_layers=64, num_kv_heads=16, head_dim=128, dtype="float32")  # 1 MiB a token
    with pytest.raises(PageTooLarge, match="max_payload"):
        await JetStreamStore.open(nc, PageSpec(huge, P), bucket="huge")


def test_tenants_keys_differ_and_keys_are_valid():
    tokens = list(range(4 * P))
    a, b = page_keys("m", "float32", tokens, "tenant-a", P), page_keys("m", "float32", tokens, "tenant-b", P)
    assert len(a) == 4 and not set(a) & set(b)
    assert a == [page_key("m", "float32", h) for h in block_hashes(tokens, P, "tenant-a")]
    assert page_keys("Qwen2.5-0.5B", "bfloat16", tokens, "", P) != page_keys("Qwen2=2E5-0.5B", "bfloat16", tokens, "", P)
    for key in a + page_keys("org/Model 1.5:q", "float16", tokens, "", P):
        assert valid_key(key) and key.count(".") == 2


async def test_a_page_of_one_tenant_is_not_found_under_another(nc, pool):
    store = await _open(nc, pool)
    _, values = _pages(pool, torch.arange(2 * P))
    await store.batch_set(list(zip(_keys(2, "tenant-a"), values)))
    assert await store.batch_exists(_keys(2, "tenant-a")) == 2
    assert await store.batch_exists(_keys(2, "tenant-b")) == 0


class CountingStore(JetStreamStore):
    """The real store, counting its gets in flight."""

    now = peak = 0

    async def _get(self, key: str) -> bytes | None:
        CountingStore.now += 1
        CountingStore.peak = max(CountingStore.peak, CountingStore.now)
        try:
            return await super()._get(key)
        finally:
            CountingStore.now -= 1


async def test_concurrent_calls_share_one_bound_on_gets_in_flight(nc, pool):
    """Several fetches at once must not pile up values unread by the client: NATS drops
    a connection with 64 MB pending (a slow consumer), and every fetch on it fails."""
    store = await CountingStore.open(nc, _spec(pool), bucket="t" + uuid.uuid4().hex[:10],
                                     max_bytes=16 << 20, in_flight=3)
    _, values = _pages(pool, torch.arange(4 * P))
    keys = _keys(4)
    assert await store.batch_set(list(zip(keys, values))) == 4
    got = await asyncio.gather(*(store.batch_get(keys) for _ in range(4)))
    assert got == [values] * 4
    assert CountingStore.peak == 3


async def test_more_replicas_than_nodes_falls_back_to_one_copy(nc, pool):
    store = await _open(nc, pool, replicas=3)  # one node: R3 cannot be placed
    assert (await store.js.stream_info(store.stream)).config.num_replicas == 1
