"""--deterministic through the scheduler's own decisions: the real SchedulerCore drives the
default model's runner in bf16 (its ForwardBatches, host-tier copies included, run as the
worker runs them) and every logit row that picks a greedy token is compared bit for bit
against an undisturbed run. Two things only the scheduler does: a prefix evicted from the
device pool to the host tier and loaded back (``HostTier`` -> ``KVCopy`` d2h / h2d ->
``KVCopier``), and retraction of running requests when the pool runs short (the planner's
own, not a forced one). Without the mode the same comparison differs in bf16 (measured on an
AMX CPU, where the default linears are oneDNN's): each test checks that too, so it can fail.

NOTE: the drive is synchronous (each step's result applied before the next is planned),
so the tokens the core sees are the argmax of the logits compared here."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from libs.kernels import gemm
from libs.models import resolve_model
from libs.protocol.messages import ForwardResult, SamplingParams, WorkerInfo
from services.gpu_worker import ModelRunner, RunnerConfig
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

pytestmark = pytest.mark.skipif(not gemm.f32_available(), reason="--deterministic runs on the C++ "
                                "linear kernels (AVX2 and FMA at least), which this CPU lacks")

TOPICS = ("rivers and the sea", "the history of bread", "how bees find flowers")
SHORT = ["def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea, there lived",
         "The three primary colors are", "SELECT name FROM users WHERE"]


def runner(deterministic: bool) -> ModelRunner:
    torch.set_num_threads(1)  # NOTE: two OpenMP threads on two shared cores spin: 15x slower measured
    return ModelRunner(RunnerConfig(model=str(resolve_model()), kv_slots=2048, max_requests=8, dtype="bfloat16",
                                    host_kv_slots=1024, deterministic=deterministic, threads=1))


@pytest.fixture(scope="module", params=[True, False], ids=["deterministic", "default"])
def mode(request):
    r = runner(request.param)
    # NOTE: where the default linears are row-invariant already (the bf16 tiles on AVX512-BF16
    # without AMX), nothing says the default must differ; oneDNN's do with the row count
    if not request.param and r.model.linear_kernel != "onednn":
        pytest.skip(f"the default linears here ({r.model.linear_kernel}) are batch-invariant already")
    return request.param, r


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model())


@dataclass
class Served:
    """What a core served: each request's tokens and the logit rows that picked them."""

    core: SchedulerCore
    reqs: dict[str, Req] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    rows: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (rid, seq len) -> logits

    def picks(self, rid: str) -> list[torch.Tensor]:
        """Token j of ``rid`` was picked by the row of the step whose sequence ended at
        prompt + j (a resumed request computes earlier positions again: not picks)."""
        start = self.reqs[rid].prompt_len
        return [self.rows[rid, start + j] for j in range(len(self.tokens[rid]))]


def serve(runner: ModelRunner, waves: list[list[list[int]]], kv_slots: int, host: bool = False,
          new: int = 8, chunk: int = 64, **cfg) -> Served:
    """Each wave's prompts submitted together, run to the end before the next wave."""
    info = WorkerInfo(worker_id="w", model="m", kv_slots=kv_slots, max_requests=runner.config.max_requests,
                      max_model_len=runner.max_model_len, vocab_size=runner.vocab_size,
                      eos_token_ids=runner.eos_token_ids, dtype="bfloat16",
                      host_kv_slots=runner.kv_copies.host_slots if host else 0)
    runner.table.zero_()
    served = Served(SchedulerCore(info, CoreConfig(page_size=16, chunked_prefill_size=chunk, **cfg)))
    for wave in waves:
        for prompt in wave:
            req = Req(rid=f"r{len(served.reqs)}", input_ids=prompt, detok_instance="t",
                      sampling=SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True))
            served.reqs[req.rid] = req
            served.core.submit(req)
        while served.core.has_work():
            step(runner, served)
    return served


def step(runner: ModelRunner, served: Served) -> None:
    core = served.core
    batch = core.next_batch()
    assert batch is not None, "a synchronous drive always has a step to send"
    if not batch.rows:  # copies only
        runner.run(batch)
        core.complete(ForwardResult(step=batch.step, forward_ms=0, next_token_ids=[]))
        return
    rids = [item.req.rid for item in core.last_step.items]
    logits = runner.logits(batch)
    for i, rid in enumerate(rids):
        served.rows.setdefault((rid, batch.prefix_lens[i] + batch.extend_lens[i]), logits[i].clone())
    core.complete(ForwardResult(step=batch.step, forward_ms=0, next_token_ids=logits.argmax(-1).tolist()))
    for _, delta in core.take_deltas():
        served.tokens.setdefault(delta.rid, []).extend(delta.token_ids)


def differing(a: Served, b: Served) -> list[tuple[str, int]]:
    """(request, position) of every picking logit row that differs in any bit."""
    assert a.tokens.keys() == b.tokens.keys()
    out = []
    for rid in a.tokens:
        pa, pb = a.picks(rid), b.picks(rid)
        out += [(rid, j) for j, (x, y) in enumerate(zip(pa, pb)) if not torch.equal(x, y)]
        if len(pa) != len(pb):
            out.append((rid, min(len(pa), len(pb))))
    return out


def check(deterministic: bool, undisturbed: Served, disturbed: Served) -> None:
    diff = differing(undisturbed, disturbed)
    if deterministic:
        assert diff == [] and disturbed.tokens == undisturbed.tokens
    else:
        assert diff, "bf16 without the mode gave the same bits: this comparison proves nothing"


def test_host_tier_load_back_gives_the_undisturbed_bits(mode, tokenizer):
    """Three documents one after another through a device pool that holds two, then the first
    again: it comes back from the host tier. Against the same prompts with the cache off
    (each a cold prefill).

    NOTE: 180-token documents prefilled whole (chunks of 512): at 64 rows or fewer the default
    bf16 linears happen to give every row the same bits here, and the check without the mode
    would prove nothing."""
    deterministic, r = mode
    docs = [tokenizer(f"A short note about {t}. " * 20)["input_ids"] for t in TOPICS]
    question = " Question {}: what does the note above say about it, and why?"
    waves = [[docs[i % 3] + tokenizer(question.format(i))["input_ids"]] for i in range(4)]
    undisturbed = serve(r, waves, kv_slots=2048, chunk=512, enable_cache=False)
    two = 2 * (len(waves[0][0]) + 8) + 40  # two requests and their outputs, not three
    tiered = serve(r, waves, kv_slots=two, chunk=512, host=True)
    back = tiered.reqs["r3"].cached_host_tokens
    assert tiered.core.host.demoted > 0 and back >= len(docs[0]) // 16 * 16, \
        f"the first document was not loaded back from the host tier ({back} tokens were)"
    check(deterministic, undisturbed, tiered)


def test_retraction_gives_the_undisturbed_bits(mode, tokenizer):
    """Four requests admitted optimistically into a pool too small for their outputs: the
    planner retracts running ones and they resume (their prompt and tokens so far cached or
    prefilled again); against the same prompts in an ample pool."""
    deterministic, r = mode
    waves = [[tokenizer(p)["input_ids"] for p in SHORT]]
    optimistic = dict(init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    ample = serve(r, waves, kv_slots=2048, new=24, **optimistic)
    short = serve(r, waves, kv_slots=96, new=24, **optimistic)
    assert ample.core.stats().retractions == 0
    assert short.core.stats().retractions > 0, "the pool never ran short"
    check(deterministic, ample, short)
