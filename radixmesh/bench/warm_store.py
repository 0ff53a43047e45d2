"""The ``radixmesh-store-tier`` system's start: the shared store (L3) holds the
workload's documents, its workers hold nothing.

One request per distinct opening message (a document) is sent, untimed; once the
store's bucket has their pages (its message count settles), every worker process
is killed and the launcher restarts it with empty device and host tiers. The run
starts when the scheduler has adopted each of them again, so whatever the run does
not compute itself and did not reuse on the device or in host memory came from the
store: a worker that restarts (or joins) next to a warm store.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from libs.protocol import Bus, Subjects
from libs.protocol.limits import KV_STORE_BUCKET
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest

from .client import StreamClient
from .record import Record
from .workload import RequestSpec, Workload

if TYPE_CHECKING:
    from radixmesh.launcher import LocalStack

PAGE_TOKENS = 16
SETTLE_S = 2.0  # the bucket's count unchanged this long: the uploads are done


class WarmStoreError(RuntimeError):
    pass


def openers(workload: Workload) -> list[RequestSpec]:
    """The first request of every distinct opening message (a document), in order."""
    seen: set = set()
    out = []
    for spec in workload.roots:
        if spec.messages and spec.messages[0] not in seen:
            seen.add(spec.messages[0])
            out.append(spec)
    return out


async def prime(stream: StreamClient, workload: Workload) -> int:
    """Send :func:`openers` one by one; returns the pages their prompts fill."""
    pages = 0
    for spec in openers(workload):
        record = Record("prime", spec.id, spec.kind)
        await stream.send(spec.render({}), 1, record)
        if not record.ok:
            raise WarmStoreError(f"priming request {spec.id} failed: {record.error}")
        pages += record.prompt_tokens // PAGE_TOKENS
    return pages


async def stored_pages(bus: Bus, bucket: str = KV_STORE_BUCKET) -> int:
    info = await bus.nc.jetstream().stream_info(f"KV_{bucket}")
    return info.state.messages


async def wait_stored(bus: Bus, pages: int, limit_s: float = 300.0) -> int:
    """Until the bucket holds about ``pages`` pages and its count stopped growing."""
    deadline = time.monotonic() + limit_s
    last, since = -1, time.monotonic()
    while True:
        count = await stored_pages(bus)
        if count != last:
            last, since = count, time.monotonic()
        elif count >= 0.9 * pages and time.monotonic() - since >= SETTLE_S:
            return count
        if time.monotonic() > deadline:
            raise WarmStoreError(f"the store holds {count} pages after {limit_s:.0f} s, "
                                 f"expected about {pages}")
        await asyncio.sleep(0.5)


def kill_workers(stack: "LocalStack") -> int:
    """Kill every gpu_worker process (the launcher restarts each, empty)."""
    workers = [p for p in stack.procs if p.service == "gpu_worker"]
    for proc in workers:
        proc.popen.kill()
    return len(workers)


async def rejoined(bus: Bus, subjects: Subjects, workers: int, limit_s: float) -> None:
    """Until ``workers`` workers are adopted in fresh sessions (no step run yet)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            reply = await bus.request(subjects.index_workers(), WorkersRequest(), WorkersReply)
            stats = [await bus.request(subjects.sched_stats(w.worker_id), SchedStatsRequest(), SchedStats)
                     for w in reply.workers]
            if len(stats) == workers and all(s.steps == 0 for s in stats):
                return
        except Exception:  # noqa: BLE001 - the workers are away: keep asking
            pass
        if time.monotonic() > deadline:
            raise WarmStoreError(f"the restarted workers did not come back within {limit_s:.0f} s")
        await asyncio.sleep(0.5)


async def warm_store(stack: "LocalStack", stream: StreamClient, workload: Workload,
                     limit_s: float = 300.0) -> int:
    """Prime the store with ``workload``'s documents, restart the workers empty; returns
    the pages the store holds."""
    subjects = Subjects(stack.config.subject_prefix)
    bus = await Bus.connect(stack.nats_url, "bench-warm-store")
    try:
        held = await wait_stored(bus, await prime(stream, workload), limit_s)
        await rejoined(bus, subjects, kill_workers(stack), limit_s)
        return held
    finally:
        await bus.close()
