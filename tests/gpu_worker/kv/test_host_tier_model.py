"""The host tier on the real model: the scheduler core demotes evicted documents to
the worker's host pool and loads them back through the step's copies; greedy
outputs equal those of a run that recomputes them, and of one with no cache."""

from __future__ import annotations

import pytest
import torch

from libs.models import resolve_model
from libs.protocol.messages import ForwardResult, SamplingParams, WorkerInfo
from services.gpu_worker import ModelRunner, RunnerConfig
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

TOPICS = ("rivers and the sea", "the history of bread", "how bees find flowers",
          "building a stone bridge", "the night sky in winter")


@pytest.fixture(scope="module")
def tiered_runner() -> ModelRunner:
    torch.set_num_threads(1)
    return ModelRunner(RunnerConfig(model=str(resolve_model()), kv_slots=320, max_requests=4,
                                    dtype="float32", host_kv_slots=2048))


@pytest.fixture(scope="module")
def prompts(tiered_runner) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiered_runner.path)
    docs = [tokenizer(f"A short note about {t}. " * 9)["input_ids"] for t in TOPICS]
    assert all(80 <= len(d) <= 130 for d in docs)  # five of them do not fit in 320 slots
    return [docs[i % len(docs)] + tokenizer(f" Question {i}:")["input_ids"] for i in range(10)]


def serve(runner: ModelRunner, prompts: list[list[int]], host: bool, **cfg) -> tuple[list, SchedulerCore]:
    info = WorkerInfo(worker_id="w", model="m", kv_slots=runner.config.kv_slots,
                      max_requests=runner.config.max_requests, max_model_len=runner.max_model_len,
                      vocab_size=runner.vocab_size, eos_token_ids=runner.eos_token_ids,
                      dtype="float32", host_kv_slots=runner.kv_copies.host_slots if host else 0)
    runner.table.zero_()
    core = SchedulerCore(info, CoreConfig(page_size=16, chunked_prefill_size=64, **cfg))
    outputs: dict[str, list[int]] = {}
    for wave in range(0, len(prompts), 2):  # two at a time: the pool cycles through documents
        for i in range(wave, min(wave + 2, len(prompts))):
            core.submit(Req(rid=f"r{i}", input_ids=prompts[i], detok_instance="t",
                            sampling=SamplingParams(max_new_tokens=8, temperature=0.0)))
        while core.has_work():
            batch = core.next_batch()
            core.complete(ForwardResult(step=batch.step, forward_ms=0,
                                        next_token_ids=runner.execute(batch)))
            for _, d in core.take_deltas():
                outputs.setdefault(d.rid, []).extend(d.token_ids)
    return [outputs[f"r{i}"] for i in range(len(prompts))], core


def test_loaded_back_documents_decode_like_recomputed_ones(tiered_runner, prompts):
    runner = tiered_runner
    reference, _ = serve(runner, prompts, host=False, enable_cache=False)
    recomputed, plain = serve(runner, prompts, host=False)
    tiered, core = serve(runner, prompts, host=True)
    assert tiered == reference and recomputed == reference
    assert core.host.demoted > 0 and core.host.loaded >= 2 * 80  # documents came back
    assert core.stats().cached_tokens >= plain.stats().cached_tokens + 160
