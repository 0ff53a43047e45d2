"""The stack on a real 3-node NATS cluster (``radixmesh up --nats-cluster 3``): ten greedy
fp32 streams run while one node is killed with SIGKILL (the first node; then the node the
scheduler is on): every stream ends identical to an undisturbed run, and the stack serves
afterwards."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from libs.protocol import Bus
from libs.protocol.messages import Ping, Pong
from radixmesh.launcher import LocalStack, ephemeral_stack_config

from .cluster import Cluster
from .test_faults import first_success, stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [f"Report {i}: the harbour at dawn, where the fishing boats" for i in range(10)]
TOKENS = 32


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = ephemeral_stack_config(tmp_path_factory.mktemp("nats-cluster"), workers=1, kv_slots=4096,
                                    dtype="float32", nats_cluster=3, supervise=())
    stack = LocalStack(config, progress=lambda m: None).start()
    try:
        yield Cluster(stack)
    finally:
        stack.stop()


async def _node_of(cluster: Cluster, service: str) -> str:
    """The launcher's name of the NATS node ``service`` is connected to now."""
    bus = await Bus.connect(cluster.stack.nats_url, "test-node-of")
    try:
        pong = await bus.request(cluster.subjects.ping(service), Ping(), Pong, timeout=3)
    finally:
        await bus.close()
    port = pong.detail["nats_url"].rsplit(":", 1)[1]
    return next(name for name, node in cluster.stack.nats_nodes.items() if str(node.port) == port)


@pytest.fixture(scope="module")
async def reference(cluster):
    """The undisturbed run's streams."""
    await cluster.wait_for_workers(1)
    async with httpx.AsyncClient(base_url=cluster.stack.url, timeout=180) as client:
        got = await asyncio.gather(*(stream(client, p, TOKENS) for p in PROMPTS))
    assert all(len(r.finishes) == 1 and not r.errors for r in got), got
    return got


async def _streams_through_a_node_kill(cluster: Cluster, reference, victim: str) -> None:
    async with httpx.AsyncClient(base_url=cluster.stack.url, timeout=180) as client:
        started = [asyncio.Event() for _ in PROMPTS]
        tasks = [asyncio.create_task(stream(client, p, TOKENS, ev)) for p, ev in zip(PROMPTS, started)]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 90)
        cluster.stack.kill(victim)
        killed = time.monotonic()
        results = await asyncio.gather(*tasks)
        done_s = time.monotonic() - killed
        served_s = await first_success(client, time.monotonic(), 30)
    for ref, got in zip(reference, results):
        assert got.status == 200 and not got.errors, got.errors
        assert got.terminal_events == 1 and got.done == 1
        assert got.text == ref.text  # no gap, no repeat
    print(f"\n{victim} killed: every stream done {done_s:.2f}s after; a new request served in {served_s:.2f}s")


async def test_the_first_node_killed_while_ten_streams_run(cluster, reference):
    await _streams_through_a_node_kill(cluster, reference, "nats-server-n1")


async def test_the_schedulers_node_killed_while_ten_streams_run(cluster, reference):
    victim = await _node_of(cluster, "scheduler")
    assert victim != "nats-server-n1"  # killed by the test before: nobody is on it now
    await _streams_through_a_node_kill(cluster, reference, victim)
