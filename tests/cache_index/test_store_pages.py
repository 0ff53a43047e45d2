"""The index's view of the shared store (L3): keys parsed into pages, leading pages
counted per key prefix, a watch on a real JetStream bucket, and routing that credits
store pages at the worker's measured fetch rate."""

from __future__ import annotations

import asyncio
import uuid

import nats
import torch

from libs.protocol.hashing import block_hashes
from libs.protocol.messages import RouteRequest
from libs.transfer import KVLayout, PageSpec, page_key, page_values
from libs.transfer.host_pool import HostKVPool
from libs.transfer.jetstream_store import JetStreamStore
from services.cache_index.prefix_index import PrefixIndex
from services.cache_index.registry import Registry
from services.cache_index.router import Router
from services.cache_index.store_pages import StorePages, watch_bucket

from ..transfer.conftest import filled_pool
from ..transfer.jetstream import JetStreamServer
from .test_registry import Clock, report

PREFIX = "SmolLM2-135M.float32"
DOC = list(range(1000, 1320))  # 20 pages of 16


def keys_of(tokens, salt=""):
    return [page_key("SmolLM2-135M", "float32", h) for h in block_hashes(tokens, 16, salt)]


def test_leading_pages_per_prefix_and_bad_keys_ignored():
    pages = StorePages()
    for key in keys_of(DOC)[:5] + keys_of(DOC)[6:]:
        assert pages.add_key(key)
    assert not pages.add_key("not-a-page-key") and not pages.add_key("a.b.zz")
    hashes = block_hashes(DOC, 16)
    assert pages.leading(PREFIX, hashes) == 5  # the sixth page is missing
    assert pages.leading("SmolLM2-135M.bfloat16", hashes) == 0  # another KV dtype
    assert pages.leading(PREFIX, block_hashes(DOC, 16, "tenant")) == 0  # another tenant


def test_the_view_is_bounded_oldest_first():
    pages = StorePages(max_pages=3)
    for key in keys_of(DOC)[:5]:
        pages.add_key(key)
    assert len(pages) == 3 and pages.leading(PREFIX, block_hashes(DOC, 16)) == 0


def test_store_pages_make_a_cold_worker_cheaper_than_recomputing():
    clock = Clock()
    reg = Registry(clock=clock)
    reg.update(report("a", running=4, prefill_tps=500.0, store_prefix=PREFIX, store_load_tps=20000.0))
    reg.update(report("b", running=3, prefill_tps=500.0))  # no store
    pages = StorePages()
    for key in keys_of(DOC):
        pages.add_key(key)
    router = Router(reg, PrefixIndex(), "cache_aware", pages)
    decision = router.route(RouteRequest(rid="r", model="m", num_tokens=len(DOC) + 5,
                                         input_ids=DOC + [1, 2, 3, 4, 5]))
    by_id = {c.worker_id: c for c in decision.candidates}
    assert by_id["a"].cached_store == len(DOC) and by_id["b"].cached_store == 0
    assert decision.chosen.worker_id == "a"
    attrs = decision.attributes("cache_aware")
    assert dict(zip(attrs["radixmesh.route.candidates"], attrs["radixmesh.route.store_tokens"])) \
        == {"a": len(DOC), "b": 0}


async def test_a_watch_learns_the_pages_workers_put():
    pool = filled_pool(num_slots=64)
    spec = PageSpec(KVLayout.of_pool(pool), 16)
    host = HostKVPool.for_pool(pool, 32)
    host.save(pool, torch.arange(32), torch.arange(32))
    values = page_values(spec, host.read(torch.arange(32)))
    bucket = "t" + uuid.uuid4().hex[:10]
    with JetStreamServer() as server:
        nc = await nats.connect(server.url)
        try:
            pages = StorePages()
            task = asyncio.create_task(watch_bucket(nc, bucket, pages))  # before the bucket exists
            store = await JetStreamStore.open(nc, spec, bucket=bucket, max_bytes=16 << 20)
            keys = keys_of(DOC)[:2]
            assert await store.batch_set(list(zip(keys, values))) == 2
            for _ in range(100):
                if pages.leading(PREFIX, block_hashes(DOC, 16)) == 2:
                    break
                await asyncio.sleep(0.1)
            assert pages.leading(PREFIX, block_hashes(DOC, 16)) == 2
            task.cancel()
        finally:
            await nc.close()
