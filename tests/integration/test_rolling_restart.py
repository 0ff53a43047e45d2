"""A rolling restart under load: with two of every service (``radixmesh up --workers 2
--gateways 2 --tokenizers 2 --index-replicas 2``, two schedulers), every process is asked to
stop with SIGTERM, one at a time, and comes back (the launcher restarts it) while clients
stream without pause: no request fails and every stream ends with exactly one final event.
A connection refused before any response (a gateway between its listener closing and its
successor binding) is what a load balancer retries, and is retried here the same way."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from radixmesh.launcher import LocalStack, ephemeral_stack_config

from .cluster import Cluster
from .test_faults import MODEL, stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ORDER = ["cache_index", "cache_index-1", "tokenizer", "tokenizer-1", "scheduler", "scheduler-1",
         "gpu_worker-0", "gpu_worker-1", "gateway", "gateway-1"]


class Load:
    """``clients`` loops of short greedy streams, each stream's result kept."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url, self.clients = url, clients
        self.results: list = []
        self.retried = 0
        self.stop = asyncio.Event()

    async def _client(self, i: int) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=120,
                                     limits=httpx.Limits(max_keepalive_connections=0)) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    self.results.append(await stream(client, f"Note {i}.{n}: the tide came in and", 16))
                except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
                    self.retried += 1  # NOTE: no response began: retried, as a load balancer would
                    if isinstance(exc, httpx.RemoteProtocolError) and "without sending" not in str(exc):
                        self.results.append(exc)
                    await asyncio.sleep(0.05)

    async def run(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = ephemeral_stack_config(tmp_path_factory.mktemp("rolling"), workers=2, kv_slots=4096,
                                    threads_per_worker=1, dtype="float32", gateways=2, tokenizers=2,
                                    index_replicas=2)
    with LocalStack(config, progress=lambda m: None) as stack:
        yield Cluster(stack)


async def _restarted(cluster: Cluster, name: str, limit: float = 60) -> float:
    """SIGTERM ``name``; seconds until the launcher has started it again and it serves."""
    proc = cluster.stack.proc(name)
    restarts, began = proc.restarts, time.monotonic()
    cluster.stack.kill(name, signal.SIGTERM)
    while proc.restarts == restarts:
        assert time.monotonic() - began < limit, f"{name} was not restarted"
        await asyncio.sleep(0.1)
    if name.startswith("gpu_worker"):
        await cluster.wait_for_workers(2)
    await asyncio.sleep(2.0)  # NOTE: its first pings, adoption, index warm-up
    return time.monotonic() - began


async def test_every_process_restarted_in_turn_under_load_fails_nothing(cluster):
    await cluster.wait_for_workers(2)
    load = Load(cluster.stack.url)
    running = asyncio.create_task(load.run())
    await asyncio.sleep(3.0)
    took = {name: await _restarted(cluster, name) for name in ORDER}
    load.stop.set()
    await asyncio.wait_for(running, 120)
    failed = [r for r in load.results if isinstance(r, BaseException) or r.status != 200 or r.errors]
    unended = [r for r in load.results if not isinstance(r, BaseException)
               and (r.terminal_events != 1 or r.done != 1)]
    print(f"\nrolling restart: {len(load.results)} streams, {len(failed)} failed, {len(unended)} without "
          f"one final event, {load.retried} connections retried; restart to serving: "
          + ", ".join(f"{n} {s:.1f}s" for n, s in took.items()))
    assert len(load.results) > 40
    assert not failed, [r if isinstance(r, BaseException) else r.errors for r in failed]
    assert not unended, unended[:3]
    body = {"model": MODEL, "prompt": "After: the sea is", "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(base_url=cluster.stack.url, timeout=60) as client:
        assert (await client.post("/v1/completions", json=body)).status_code == 200
