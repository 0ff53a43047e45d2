"""The worker on a real nats-server: announce, adoption, lease, forward, typed errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import msgspec
import pytest

from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import (
    AdoptRequest, ForwardBatch, ForwardResult, LeaseRenew, NewRow, PrepareRegex, WorkerInfo,
)
from services.gpu_worker.service import WorkerService

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


def _prefill(tokenizer, text: str, row: int, first_slot: int, step: int = 0) -> ForwardBatch:
    ids = tokenizer(text)["input_ids"]
    return ForwardBatch(
        step=step, new_rows=[NewRow(row=row, **GREEDY)], rows=[row], prefix_lens=[0], extend_lens=[len(ids)],
        input_ids=ids, out_slots=list(range(first_slot, first_slot + len(ids))),
    )


class _Announcements:
    def __init__(self) -> None:
        self.seen: list[WorkerInfo] = []

    async def __call__(self, info: WorkerInfo) -> None:
        self.seen.append(info)

    async def wait_for(self, pred, timeout: float = 5.0) -> WorkerInfo:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for info in reversed(self.seen):
                if pred(info):
                    return info
            await asyncio.sleep(0.05)
        raise AssertionError(f"no matching announcement in {timeout}s: {self.seen[-3:]}")


async def _start(nats_server, subject_prefix, runner):
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    seen = _Announcements()
    await bus.subscribe(subjects.worker_announce(), seen, WorkerInfo)
    worker = WorkerService(runner, "w1", "SmolLM2-135M-Instruct", subjects, announce_s=0.1)
    await worker.start(bus)
    return subjects, bus, seen, worker


async def test_adopt_forward_and_typed_errors(nats_server, subject_prefix, runner, tokenizer, monkeypatch):
    threads, real_run = [], runner.run
    monkeypatch.setattr(runner, "run", lambda msg: (threads.append(threading.current_thread().name), real_run(msg))[1])
    subjects, bus, seen, worker = await _start(nats_server, subject_prefix, runner)
    try:
        info = await seen.wait_for(lambda i: i.adopted_by is None)
        # NOTE: max_model_len is capped by the pool (the fixture's 2048 slots), not the config's 8192
        assert (info.worker_id, info.vocab_size, info.eos_token_ids, info.max_model_len) == ("w1", 49152, [2], 2048)
        batch = _prefill(tokenizer, "The capital of France is", row=1, first_slot=0)
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.worker_forward("w1"), batch, ForwardResult)
        assert (err.value.code, err.value.status) == ("not_adopted", 409)

        info = await bus.request(subjects.worker_adopt("w1"), AdoptRequest(scheduler_id="s1", lease_s=30), WorkerInfo)
        assert (info.adopted_by, info.epoch) == ("s1", 0)
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.worker_adopt("w1"), AdoptRequest(scheduler_id="s2", lease_s=30), WorkerInfo)
        assert (err.value.code, err.value.status) == ("already_adopted", 409)
        await seen.wait_for(lambda i: i.adopted_by == "s1")
        stale = msgspec.structs.replace(batch, owner="s0", epoch=0)  # a scheduler whose lease lapsed
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.worker_forward("w1"), stale, ForwardResult)
        assert (err.value.code, err.value.status) == ("stale_owner", 409)

        batch = msgspec.structs.replace(batch, owner="s1", epoch=info.epoch)
        result = await bus.request(subjects.worker_forward("w1"), batch, ForwardResult, timeout=30)
        assert result.step == 0 and tokenizer.decode(result.next_token_ids) == " Paris"

        bad = _prefill(tokenizer, "Hello there", row=2, first_slot=runner.config.kv_slots - 1)
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.worker_forward("w1"), bad, ForwardResult)
        assert (err.value.code, err.value.status) == ("invalid_request_error", 400)
        # the worker goes on: the next step decodes " Paris" -> "."
        decode = ForwardBatch(step=1, new_rows=[], rows=[1], prefix_lens=[len(batch.input_ids)], extend_lens=[1],
                              input_ids=result.next_token_ids, out_slots=[50])
        result = await bus.request(subjects.worker_forward("w1"), decode, ForwardResult, timeout=30)
        assert result.step == 1 and len(result.next_token_ids) == 1

        await bus.request(subjects.worker_lease("w1"), LeaseRenew(scheduler_id="s1"), WorkerInfo)
        with pytest.raises(ServiceError) as err:
            await bus.request(subjects.worker_lease("w1"), LeaseRenew(scheduler_id="s2"), WorkerInfo)
        assert (err.value.code, err.value.status) == ("not_adopted", 409)
        # every forward ran on the one compute thread (one OpenMP team)
        assert len(threads) == 3 and len(set(threads)) == 1 and threads[0].startswith("compute")
    finally:
        await worker.stop()
        await bus.close()


async def test_lease_lapses_and_leases_answered_during_forward(nats_server, subject_prefix, runner, tokenizer):
    subjects, bus, seen, worker = await _start(nats_server, subject_prefix, runner)
    try:
        await bus.request(subjects.worker_adopt("w1"), AdoptRequest(scheduler_id="s1", lease_s=0.3), WorkerInfo)
        info = await seen.wait_for(lambda i: i.adopted_by is None and i.epoch == 1, timeout=3)
        assert info.epoch == 1
        await bus.request(subjects.worker_adopt("w1"), AdoptRequest(scheduler_id="s2", lease_s=30), WorkerInfo)

        long = _prefill(tokenizer, "word " * 1500, row=3, first_slot=200, step=5)
        forward = asyncio.create_task(bus.request(subjects.worker_forward("w1"), long, ForwardResult, timeout=60))
        await asyncio.sleep(0.1)
        renewed = await bus.request(subjects.worker_lease("w1"), LeaseRenew(scheduler_id="s2"), WorkerInfo, timeout=1)
        assert renewed.adopted_by == "s2" and not forward.done()
        assert (await forward).step == 5
    finally:
        await worker.stop()
        await bus.close()


async def test_the_step_sent_ahead_waits_on_the_worker_not_on_the_bus(
        nats_server, subject_prefix, runner, tokenizer, monkeypatch):
    """With overlap the scheduler sends step N+1 while N runs: the worker takes it in
    (decoded, queued behind N) before N ends, then runs it in order with N's token."""
    subjects, bus, _, worker = await _start(nats_server, subject_prefix, runner)
    entered, real_run, real_enter = threading.Event(), runner.run, worker._run
    waited: list[bool] = []

    async def enter(msg):
        if msg.step == 11:
            entered.set()
        return await real_enter(msg)

    def run(msg):
        if msg.step == 10:
            waited.append(entered.wait(timeout=5))
            time.sleep(0.4)  # step 11 waits behind this one
        return real_run(msg)

    monkeypatch.setattr(worker, "_run", enter)
    monkeypatch.setattr(runner, "run", run)
    try:
        await bus.request(subjects.worker_adopt("w1"), AdoptRequest(scheduler_id="s1", lease_s=30), WorkerInfo)
        first = _prefill(tokenizer, "The capital of France is", row=5, first_slot=400, step=10)
        ahead = ForwardBatch(step=11, new_rows=[], rows=[5], prefix_lens=[len(first.input_ids)], extend_lens=[1],
                             input_ids=[-1], out_slots=[450])  # -1: the token step 10 samples
        sent = [asyncio.create_task(bus.request(subjects.worker_forward("w1"), b, ForwardResult, timeout=30))
                for b in (first, ahead)]
        r10, r11 = await asyncio.gather(*sent)
        assert waited == [True]  # step 11 was on the worker while step 10 ran
        assert (r10.step, r11.step) == (10, 11)
        assert tokenizer.decode(r10.next_token_ids + r11.next_token_ids) == " Paris."
        # the reported time is the step's own, not its wait behind step 10
        assert r10.forward_ms >= 400 and 0 < r11.forward_ms < 400
    finally:
        await worker.stop()
        await bus.close()


async def test_announced_patterns_compile_before_their_rows(nats_server, subject_prefix, runner):
    subjects, bus, _, worker = await _start(nats_server, subject_prefix, runner)
    compiler = runner.constraints.compiler
    pattern = r" (red|green|blue)"
    try:
        assert not compiler.compiled(pattern)
        await bus.publish(subjects.worker_prepare("w1"), PrepareRegex(patterns=[pattern]))
        deadline = time.monotonic() + 20
        while not compiler.compiled(pattern) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert compiler.compiled(pattern)
    finally:
        await worker.stop()
        await bus.close()


async def test_service_process(nats_server, subject_prefix, tokenizer):
    """``python -m services.gpu_worker`` announces, serves a forward and stops on SIGTERM."""
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    seen = _Announcements()
    await bus.subscribe(subjects.worker_announce(), seen, WorkerInfo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gpu_worker", "--model", "default", "--dtype", "float32",
         "--kv-slots", "256", "--max-requests", "4", "--attention-backend", "torch", "--threads", "1",
         "--worker-id", "wcli", "--nats-url", nats_server.url, "--subject-prefix", subject_prefix],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        info = await seen.wait_for(lambda i: i.worker_id == "wcli", timeout=90)
        assert (info.kv_slots, info.max_requests, info.dtype) == (256, 4, "float32")
        await bus.request(subjects.worker_adopt("wcli"), AdoptRequest(scheduler_id="s", lease_s=30), WorkerInfo)
        batch = _prefill(tokenizer, "The capital of France is", row=0, first_slot=0)
        result = await bus.request(subjects.worker_forward("wcli"), batch, ForwardResult, timeout=30)
        assert tokenizer.decode(result.next_token_ids) == " Paris"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        await bus.close()
