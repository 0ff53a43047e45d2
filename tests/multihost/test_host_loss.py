"""Three hosts (network namespaces), a 3-node NATS cluster (a node per host), each host running
``radixmesh up`` (gateway, tokenizer, index, scheduler, worker) against the whole cluster.
Thirty greedy fp32 streams spread over the three gateways; one host is lost whole (SIGKILL of
everything on it, then its link cut): every stream on a surviving gateway ends identical to
an undisturbed run, those on the dead gateway end with a connection error (what a load
balancer retries), nothing hangs, and the two surviving hosts then serve the whole load.
Before that, one host's link is cut for 10 s and restored (a partition, its processes
alive): the streams on the other hosts' gateways end identical, none hangs, and all three
hosts serve afterwards."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.test_faults import first_success, stream

from .hosts import Bed, usable

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(usable() is not None, reason=str(usable()))]

PROMPTS = [f"Log {i}: the night shift at the lighthouse began when the keeper" for i in range(30)]
TOKENS = 24
UP = ["--workers", "1", "--dtype", "float32", "--kv-slots", "4096", "--threads", "1"]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with Bed(3, tmp_path_factory.mktemp("hosts")) as running:
        running.start(UP)
        asyncio.run(_all_serving(running, 420))
        yield running


async def _all_serving(bed: Bed, limit: float) -> None:
    """Until every host's gateway has served a request (each sees a worker: its own or another's)."""
    async with httpx.AsyncClient(timeout=10) as client:
        for host in bed.hosts:
            client.base_url = host.url
            await first_success(client, time.monotonic(), limit)


async def _spread(bed: Bed, hosts, started: list[asyncio.Event] | None = None):
    """The prompts round-robin over ``hosts``' gateways; each stream's result or its exception."""
    clients = [httpx.AsyncClient(base_url=h.url, timeout=httpx.Timeout(60, read=20)) for h in hosts]
    try:
        coros = [stream(clients[i % len(clients)], p, TOKENS, started[i] if started else None)
                 for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(*coros, return_exceptions=True)
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture(scope="module")
def reference(bed):
    got = asyncio.run(_spread(bed, bed.hosts))
    assert all(not isinstance(r, BaseException) and not r.errors and len(r.finishes) == 1
               for r in got), got
    return got


async def test_a_host_partitioned_for_ten_seconds_and_back(bed, reference):
    cut = bed.hosts[1]
    started = [asyncio.Event() for _ in PROMPTS]
    running = asyncio.create_task(_spread(bed, bed.hosts, started))
    await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 120)
    cut.partition(True)
    began = time.monotonic()
    await asyncio.sleep(10)
    cut.partition(False)
    results = await asyncio.wait_for(running, 180)
    done_s = time.monotonic() - began
    for i, (ref, got) in enumerate(zip(reference, results)):
        if i % 3 == 1:  # on the cut host's gateway: whole, one clear error, or a connection error
            assert isinstance(got, httpx.HTTPError) or got.terminal_events == 1, got
            assert isinstance(got, httpx.HTTPError) or got.errors or got.text == ref.text, got
            continue
        assert not isinstance(got, BaseException) and not got.errors, getattr(got, "errors", got)
        assert got.text == ref.text
    await _all_serving(bed, 90)
    whole = sum(not isinstance(r, BaseException) and r.text == ref.text for r, ref in zip(results, reference))
    print(f"\nhost {cut.name} partitioned 10 s: {whole}/30 streams whole, all done {done_s:.1f}s "
          f"after the cut; all three hosts serve again")


async def test_a_host_lost_whole_while_thirty_streams_run(bed, reference):
    victim = bed.hosts[2]
    started = [asyncio.Event() for _ in PROMPTS]
    running = asyncio.create_task(_spread(bed, bed.hosts, started))
    await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 120)
    victim.die()
    killed = time.monotonic()
    async with httpx.AsyncClient(base_url=bed.hosts[0].url, timeout=30) as client:
        served = asyncio.create_task(first_success(client, killed, 60))
        results = await asyncio.wait_for(running, 180)
        moved_s = time.monotonic() - killed
        served_s = await served
    for i, (ref, got) in enumerate(zip(reference, results)):
        if i % 3 == 2:  # on the dead host's gateway: a connection error, or it had finished
            assert isinstance(got, httpx.HTTPError) or got.text == ref.text, got
            continue
        assert not isinstance(got, BaseException), got
        assert got.status == 200 and not got.errors and got.terminal_events == 1, got.errors
        assert got.text == ref.text
    after = await _spread(bed, bed.hosts[:2])
    assert all(not isinstance(r, BaseException) and not r.errors for r in after), after
    assert [r.text for r in after] == [r.text for r in reference]
    cut = sum(isinstance(r, BaseException) for r in results)
    print(f"\nhost {victim.name} lost: {cut} streams on its gateway cut; every other stream done "
          f"{moved_s:.2f}s after the kill; a new request served {served_s:.2f}s after it; "
          f"the two survivors then served all {len(PROMPTS)} streams")
