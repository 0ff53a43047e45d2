"""KV copies through the worker service on a real nats-server: the host pool announced,
a copy-only step answered with no tokens, a bad copy a typed 400."""

from __future__ import annotations

import pytest

from libs.models import resolve_model
from libs.protocol import Bus, ServiceError, Subjects
from libs.protocol.messages import AdoptRequest, ForwardBatch, ForwardResult, KVCopy, WorkerInfo
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.service import WorkerService

EMPTY = dict(new_rows=[], rows=[], prefix_lens=[], extend_lens=[], input_ids=[], out_slots=[])


@pytest.fixture(scope="module")
def small_runner() -> ModelRunner:
    config = RunnerConfig(model=str(resolve_model()), kv_slots=256, max_requests=2, dtype="float32",
                          host_kv_slots=64)
    return ModelRunner(config)


async def test_copy_steps_over_the_bus(nats_server, subject_prefix, small_runner):
    subjects = Subjects(subject_prefix)
    bus = await Bus.connect(nats_server.url, "test")
    worker = WorkerService(small_runner, "wc", "SmolLM2-135M-Instruct", subjects, announce_s=0.1)
    await worker.start(bus)
    try:
        info = await bus.request(subjects.worker_adopt("wc"), AdoptRequest(scheduler_id="s", lease_s=30), WorkerInfo)
        assert info.host_kv_slots == 64
        forward = subjects.worker_forward("wc")
        copies = [KVCopy(kind="d2h", src=[3, 4], dst=[0, 1]), KVCopy(kind="export", src=[3, 4], buffer="b")]
        result = await bus.request(forward, ForwardBatch(step=0, copies=copies, **EMPTY), ForwardResult, timeout=30)
        assert (result.step, result.next_token_ids) == (0, [])
        assert "b" in small_runner.kv_copies.staging
        with pytest.raises(ServiceError) as err:
            await bus.request(forward, ForwardBatch(step=1, copies=[KVCopy(kind="h2d", src=[64], dst=[0])], **EMPTY),
                              ForwardResult, timeout=30)
        assert (err.value.code, err.value.status) == ("invalid_request_error", 400)
        assert "slot out of range [0, 64)" in err.value.message
    finally:
        await worker.stop()
        await bus.close()
