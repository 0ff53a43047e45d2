"""``python -m services.gpu_worker --role decode`` in its own process: it announces its role,
KV layout and host, and takes KV from a prefill worker in this process by shared memory
(across processes) and by NATS chunks, then decodes from it as the prefill worker would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import AsyncExitStack

from libs.protocol import Bus, Subjects
from libs.protocol.messages import (
    AdoptRequest, ForwardBatch, ForwardResult, KVCopy, KVSend, KVSendReply, NewRow, WorkerInfo, staging_id,
)
from libs.transfer import shm
from services.gpu_worker.kv.service import start_kv_paths
from services.gpu_worker.kv.transfer import KVTransferConfig
from services.gpu_worker.service import WorkerService

from .pair import EMPTY, GREEDY, N, load_runner, prompt_ids
from ..test_worker_service import _Announcements

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository


class _Steps:
    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus, self.subjects, self.step = bus, subjects, 0

    async def __call__(self, worker: str, copies=(), **fields) -> list[int]:
        self.step += 1
        batch = ForwardBatch(step=self.step, copies=list(copies), **dict(EMPTY, **fields))
        result = await self.bus.request(self.subjects.worker_forward(worker), batch, ForwardResult, timeout=120)
        return result.next_token_ids

    async def decode(self, worker: str, row: int, prefix: list[int], token: int, first_out: int, copies=()):
        out = await self(worker, copies, new_rows=[NewRow(row=row, prefix_slots=prefix, **GREEDY)], rows=[row],
                         prefix_lens=[len(prefix)], extend_lens=[1], input_ids=[token], out_slots=[first_out])
        for i in range(1, N):
            out += await self(worker, rows=[row], prefix_lens=[len(prefix) + i], extend_lens=[1],
                              input_ids=[out[-1]], out_slots=[first_out + i])
        return out


async def _senders(bus: Bus, subjects: Subjects, stack: AsyncExitStack) -> list[WorkerService]:
    """Two prefill workers on one runner: one sends by shared memory, one by chunks."""
    out = []
    for wid, mode in (("pshm", "shm"), ("pnats", "nats")):
        worker = WorkerService(load_runner("P"), wid, "SmolLM2-135M-Instruct", subjects, announce_s=5, role="prefill")
        await worker.start(bus)
        stack.push_async_callback(worker.stop)
        paths = await start_kv_paths(bus, worker, KVTransferConfig(mode=mode))
        stack.push_async_callback(paths.receiver.stop)
        worker.adoption.adopt("s", 60)
        out.append(worker)
    return out


async def test_a_decode_worker_process_takes_kv_by_both_paths(nats_server, subject_prefix):
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    seen = _Announcements()
    await bus.subscribe(subjects.worker_announce(), seen, WorkerInfo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gpu_worker", "--model", "default", "--dtype", "float32",
         "--kv-slots", "512", "--max-requests", "4", "--attention-backend", "torch", "--threads", "1",
         "--worker-id", "wdec", "--role", "decode", "--nats-url", nats_server.url, "--subject-prefix", subject_prefix],
        cwd=ROOT,
    )
    stack = AsyncExitStack()
    try:
        senders = await _senders(bus, subjects, stack)
        info = await seen.wait_for(lambda i: i.worker_id == "wdec", timeout=120)
        assert (info.role, info.host_id) == ("decode", shm.host_id())
        assert info.kv_layout == senders[0].info().kv_layout == "30 layers x 3 KV heads x 64 dims, float32"
        await bus.request(subjects.worker_adopt("wdec"), AdoptRequest(scheduler_id="s", lease_s=60), WorkerInfo)
        step, ids = _Steps(bus, subjects), prompt_ids()
        slots = list(range(1000, 1000 + len(ids)))
        [first] = await step("pshm", new_rows=[NewRow(row=0, **GREEDY)], rows=[0], prefix_lens=[0],
                             extend_lens=[len(ids)], input_ids=ids, out_slots=slots)
        expected = await step.decode("pshm", 1, slots, first, 1100)
        for n, sender in enumerate(senders):
            tid = f"x-{sender.worker_id}"
            msg = KVSend(transfer_id=tid, slots=slots, dest_worker="wdec", dest_host=info.host_id, deadline_s=20)
            reply = await bus.request(subjects.worker_kv_send(sender.worker_id), msg, KVSendReply, timeout=30)
            assert reply.ok and reply.path == ("shm", "nats")[n], reply
            dst = list(range(100 * n, 100 * n + len(ids)))
            copy = KVCopy(kind="import", dst=dst, buffer=staging_id(tid))
            assert await step.decode("wdec", n, dst, first, 300 + 20 * n, [copy]) == expected
        assert not [name for name in shm.leftovers() if "pshm" in name]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        await stack.aclose()
        await bus.close()
