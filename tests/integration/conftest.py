"""A real local stack (nats-server + every service + the default model) for the session."""

from __future__ import annotations

import pytest
import torch

from libs.models import resolve_model
from libs.protocol import Bus, Subjects
from libs.protocol.messages import SchedStats, SchedStatsRequest, WorkersReply, WorkersRequest
from radixmesh.launcher import LocalStack, ephemeral_stack_config


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    config = ephemeral_stack_config(tmp_path_factory.mktemp("stack-logs"), workers=1,
                                    dtype="float32")  # NOTE: HF parity is fp32
    with LocalStack(config, progress=lambda msg: None) as running:
        yield running


@pytest.fixture(scope="session")
def model_dir():
    return resolve_model("default")


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class StackBus:
    """Bus access to the running stack (for scheduler stats in tests)."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.subjects = Subjects(stack.config.subject_prefix)

    async def workers(self) -> WorkersReply:
        bus = await Bus.connect(self.stack.nats_url, "test-client")
        try:
            return await bus.request(self.subjects.index_workers(), WorkersRequest(), WorkersReply)
        finally:
            await bus.close()

    async def sched_stats(self, worker_id: str) -> SchedStats:
        bus = await Bus.connect(self.stack.nats_url, "test-client")
        try:
            return await bus.request(
                self.subjects.sched_stats(worker_id), SchedStatsRequest(), SchedStats
            )
        finally:
            await bus.close()


@pytest.fixture(scope="session")
def stack_bus(stack) -> StackBus:
    return StackBus(stack)
