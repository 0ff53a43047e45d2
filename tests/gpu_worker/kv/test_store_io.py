"""The worker's side of the shared KV store, on the real model and a real nats-server with
JetStream (and, for the round trip, on a real mooncake_master): pages put from host slots survive those slots being overwritten at once, come back
by FetchPages into other host slots, and load onto the device as the KV they were; a missing
page ends the leading run; a store that goes away fails fetches and puts, never a step."""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AsyncExitStack

import pytest
import torch

from libs.models import resolve_model
from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import AdoptRequest, FetchPages, FetchReply, ForwardBatch, KVCopy, NewRow, WorkerInfo
from libs.protocol.service import CommonConfig, ServiceContext
from libs.transfer import page_keys
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.service import WorkerService
from services.gpu_worker.kv.store_service import StoreConfig, serve_store
from libs.transfer.mooncake_master import MooncakeMaster
from tests.transfer.jetstream import JetStreamServer
from tests.transfer.mooncake import require_mooncake

P = 16
EMPTY = dict(new_rows=[], rows=[], prefix_lens=[], extend_lens=[], input_ids=[], out_slots=[])
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    torch.set_num_threads(1)
    return ModelRunner(RunnerConfig(model=str(resolve_model()), kv_slots=256, max_requests=2, dtype="float32",
                                    host_kv_slots=128))


class _Worker:
    """A worker service with ``--kv-store nats`` on ``server``, adopted by scheduler "s"."""

    def __init__(self, runner: ModelRunner, server: JetStreamServer, prefix: str,
                 store: StoreConfig | None = None) -> None:
        self.runner, self.server, self.subjects = runner, server, Subjects(prefix)
        self.store = store or StoreConfig("nats", "w" + prefix, 8 << 20)
        self.step = 0

    async def __aenter__(self) -> "_Worker":
        self.stack = AsyncExitStack()
        self.bus = await Bus.connect(self.server.url, "test")
        self.stack.push_async_callback(self.bus.close)
        ctx = ServiceContext("gpu_worker", CommonConfig(self.server.url, self.subjects.prefix, "w1", "INFO"),
                             self.bus, asyncio.Event(), self.stack)
        service = WorkerService(self.runner, "w1", "m", self.subjects, announce_s=5)
        self.io = await serve_store(ctx, service, self.store)
        await service.start(self.bus)
        self.stack.push_async_callback(service.stop)
        self.info = await self.bus.request(self.subjects.worker_adopt("w1"),
                                           AdoptRequest(scheduler_id="s", lease_s=60), WorkerInfo)
        return self

    async def __aexit__(self, *exc) -> None:
        self.runner.kv_copies.store_io = None
        await self.stack.aclose()

    async def copies(self, *copies: KVCopy) -> None:
        self.step += 1
        await asyncio.to_thread(self.runner.run, ForwardBatch(step=self.step, copies=list(copies), **EMPTY))

    async def fetch(self, keys: list[str], host_slots: list[int], deadline_s: float = 10.0) -> FetchReply:
        return await self.bus.request(self.subjects.worker_fetch("w1"),
                                      FetchPages(keys=keys, host_slots=host_slots, deadline_s=deadline_s),
                                      FetchReply, timeout=deadline_s + 5)


def _prefill(runner: ModelRunner, ids: list[int], slots: list[int]) -> None:
    runner.run(ForwardBatch(step=0, new_rows=[NewRow(row=0, **GREEDY)], rows=[0], prefix_lens=[0],
                            extend_lens=[len(ids)], input_ids=ids, out_slots=slots))


def _device(runner: ModelRunner, slots: list[int]) -> list[torch.Tensor]:
    return [t[slots].clone() for t in runner.kv.k + runner.kv.v]


@pytest.fixture
def jetstream():
    with JetStreamServer() as server:
        yield server


@pytest.fixture(params=["nats", "mooncake"])
def backend(request) -> str:
    if request.param == "mooncake":
        require_mooncake()
    return request.param


async def test_put_overwrite_fetch_h2d_gives_back_the_device_kv(runner, jetstream, subject_prefix, backend):
    with contextlib.ExitStack() as stack:
        store = None
        if backend == "mooncake":
            master = stack.enter_context(MooncakeMaster())
            store = StoreConfig("mooncake", url=master.address, max_bytes=32 << 20)
        await _put_overwrite_fetch_h2d(runner, jetstream, subject_prefix, store)


async def _put_overwrite_fetch_h2d(runner, jetstream, subject_prefix, store: StoreConfig | None) -> None:
    ids = list(range(1000, 1000 + 3 * P))
    src, h1, h2, dst = list(range(3 * P)), list(range(3 * P)), list(range(64, 64 + 3 * P)), list(range(100, 100 + 3 * P))
    _prefill(runner, ids, src)
    original = _device(runner, src)
    keys = page_keys("m", "float32", ids, "tenant", P)
    async with _Worker(runner, jetstream, subject_prefix, store) as w:
        assert w.info.store_page_tokens == P
        await w.copies(KVCopy(kind="d2h", src=src, dst=h1), KVCopy(kind="put", src=h1, keys=keys))
        await w.copies(KVCopy(kind="d2h", src=list(range(200, 200 + 3 * P)), dst=h1))  # the put's slots reused
        await w.io.drain()
        assert (w.io.puts.stored, w.io.puts.failed) == (3, 0)
        reply = await w.fetch(keys, h2)
        assert (reply.arrived, reply.missing, reply.bad, reply.error) == (3, 0, 0, "")
        assert reply.nbytes == 3 * P * runner.kv_copies.layout.token_bytes and reply.seconds > 0
        await w.copies(KVCopy(kind="h2d", src=h2, dst=dst))
        for a, b in zip(_device(runner, dst), original):
            assert torch.equal(a, b)
        other = page_keys("m", "float32", ids, "another-tenant", P)
        reply = await w.fetch([keys[0], other[1], keys[2]], h2)  # a page missing: the leading run is 1
        assert (reply.arrived, reply.missing) == (1, 1)


async def test_bad_fetches_are_refused_and_a_deadline_is_kept(runner, jetstream, subject_prefix):
    ids = list(range(2000, 2000 + 4 * P))
    keys = page_keys("m", "float32", ids, "", P)
    async with _Worker(runner, jetstream, subject_prefix) as w:
        await w.copies(KVCopy(kind="put", src=list(range(4 * P)), keys=keys))
        await w.io.drain()
        for bad in (dict(keys=keys, host_slots=list(range(P))), dict(keys=keys[:1], host_slots=[0] * P),
                    dict(keys=["a b"], host_slots=list(range(P)))):
            with pytest.raises(ServiceError) as err:
                await w.bus.request(w.subjects.worker_fetch("w1"), FetchPages(**bad), FetchReply)
            assert err.value.status == 400
        with pytest.raises(ServiceError) as err:
            await w.copies(KVCopy(kind="put", src=list(range(P)), keys=keys[:2]))
        assert err.value.status == 400
        start = time.monotonic()
        reply = await w.fetch(keys, list(range(64, 64 + 4 * P)), deadline_s=0.001)
        assert time.monotonic() - start < 1.0
        assert reply.deadline and reply.arrived < 4
        w.io.max_queued_bytes = 3 * P * runner.kv_copies.layout.token_bytes  # the queue's bound: 3 pages
        await w.copies(KVCopy(kind="put", src=list(range(4 * P)), keys=keys))  # over it: dropped, the step runs
        await w.io.drain()
        assert (w.io.puts.stored, w.io.puts.dropped, w.io.puts.failed) == (4, 4, 0)


async def test_fetches_are_served_one_at_a_time_in_arrival_order(runner, jetstream, subject_prefix):
    """The scheduler predicts a fetch's time behind those queued before it: the worker
    serves them first come, first served (a later one does not slow an earlier one down)."""
    ids = list(range(3000, 3000 + 7 * P))
    keys = page_keys("m", "float32", ids, "", P)
    async with _Worker(runner, jetstream, subject_prefix) as w:
        await w.copies(KVCopy(kind="put", src=list(range(7 * P)), keys=keys))
        await w.io.drain()
        asked, get = [], w.io.store._get

        async def logged(key):
            asked.append(key)
            return await get(key)

        w.io.store._get, w.io.store.in_flight = logged, 1  # NOTE: one get at a time per call
        first, second = await asyncio.gather(w.fetch(keys[:4], list(range(4 * P))),
                                             w.fetch(keys[4:], list(range(64, 64 + 3 * P))))
    assert (first.arrived, second.arrived) == (4, 3)
    assert asked == keys  # not interleaved


async def test_a_store_gone_fails_fetches_and_puts_but_never_a_step(runner, jetstream, subject_prefix):
    keys = page_keys("m", "float32", list(range(2 * P)), "", P)
    async with _Worker(runner, jetstream, subject_prefix) as w:
        await w.copies(KVCopy(kind="put", src=list(range(2 * P)), keys=keys))
        await w.io.drain()
        await w.io.store.js.delete_stream(w.io.store.stream)  # the bucket gone; the broker stays
        await w.copies(KVCopy(kind="put", src=list(range(2 * P)), keys=keys))  # the step still succeeds
        await w.io.drain()
        assert (w.io.puts.stored, w.io.puts.failed) == (2, 2)
        start = time.monotonic()
        reply = await w.fetch(keys, list(range(64, 64 + 2 * P)))
        assert reply.error and reply.arrived == 0 and time.monotonic() - start < 3.0
