"""The page store on a real 3-node NATS cluster with JetStream: the bucket is R3 (an R1 bucket
made before is raised to R3), and a page written before its client's node is killed is read
back byte for byte through another node."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest
import torch

from libs.transfer.errors import StoreUnavailable
from libs.transfer.jetstream_store import JetStreamStore, cluster_nodes, default_replicas
from radixmesh.nats_cluster import NatsCluster

from .test_store import P, _keys, _pages, _spec

pytestmark = pytest.mark.slow


@pytest.fixture()
def cluster(tmp_path):
    with NatsCluster(3, log_dir=tmp_path, jetstream_dir=tmp_path / "js") as c:
        yield c


async def _connect(cluster: NatsCluster):
    return await nats.connect([n.url for n in cluster.nodes], reconnect_time_wait=0.2, max_reconnect_attempts=-1)


async def _open_when_ready(nc, pool, bucket: str, replicas: int = 3) -> JetStreamStore:
    """The store once its stream has ``replicas`` copies. NOTE: a stream the cluster cannot
    place yet keeps one copy, and the next open asks for the rest again."""
    deadline = time.monotonic() + 20
    while True:
        try:
            store = await JetStreamStore.open(nc, _spec(pool), bucket=bucket, max_bytes=16 << 20,
                                              replicas=replicas)
            have = (await store.js.stream_info(store.stream)).config.num_replicas
            assert have == replicas, f"the stream has {have} replicas, not {replicas}"
            return store
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


async def test_the_bucket_is_r3_and_an_r1_bucket_is_raised(cluster, pool):
    nc = await _connect(cluster)
    try:
        assert cluster_nodes(nc) == 3 and default_replicas(nc) == 3
        bucket = "t" + uuid.uuid4().hex[:8]
        store = await _open_when_ready(nc, pool, bucket, replicas=1)
        assert (await store.js.stream_info(store.stream)).config.num_replicas == 1
        store = await JetStreamStore.open(nc, _spec(pool), bucket=bucket, max_bytes=16 << 20)
        assert (await store.js.stream_info(store.stream)).config.num_replicas == 3
    finally:
        await nc.close()


async def test_a_page_survives_the_node_its_writer_was_on(cluster, pool):
    nc = await _connect(cluster)
    try:
        store = await _open_when_ready(nc, pool, "t" + uuid.uuid4().hex[:8])
        _, values = _pages(pool, torch.arange(2 * P))
        keys = _keys(2)
        assert await store.batch_set(list(zip(keys, values))) == 2
        victim = next(n for n in cluster.nodes if n.url.endswith(nc.connected_url.netloc))
        victim.proc.kill()
        victim.proc.wait()
        deadline = time.monotonic() + 20
        while True:  # NOTE: while the stream elects a new leader, reads fail fast (StoreUnavailable)
            try:
                got = await store.batch_get(keys)
            except StoreUnavailable:
                got = None
            if got == values:
                break
            assert time.monotonic() < deadline, "the pages were not readable through the other nodes"
            await asyncio.sleep(0.25)
    finally:
        await nc.close()
