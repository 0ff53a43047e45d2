"""--deterministic on the default model in bf16: a token's logits are the same bits whatever
step computes them. Each test runs one request two ways the scheduler can run it and compares
every logit row that picks a greedy token, bit for bit: a cache hit against a cold prefill,
chunked against whole, alone against in a mixed batch (the C++ layer loop and the Python one),
a prefill that resumes a request (a dead worker's, a retracted one) against the decode steps
that produced its tokens, and a prompt prefilled on one runner, its KV exported and imported
into another (PD) against one runner. Without the mode every one of them differs in bf16.
Host-tier load-back and retraction as the scheduler decides them: test_deterministic_tiers.py.

NOTE: --dtype bfloat16 explicitly, so the tests mean the same on every CPU: on AVX512-BF16 the
mode runs the bf16 tile kernel, on AVX2 the fp32 one over widened rows (gemm.linear_fixed)."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import gemm
from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow
from libs.transfer.codec import export_slots, import_slots
from services.gpu_worker import ModelRunner, RunnerConfig

pytestmark = pytest.mark.skipif(not gemm.f32_available(), reason="--deterministic runs on the C++ "
                                "linear kernels (AVX2 and FMA at least), which this CPU lacks")

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
TEXT = ("The history of the city begins in the second century, when a small fishing village grew around the "
        "harbour. Over the next thousand years it became a centre of trade, and merchants came to sell")
OTHERS = ["def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea, there lived",
          "The three primary colors are", "SELECT name FROM users WHERE", "1, 2, 3, 5, 8, 13,"]
NEW = 12


def deterministic_runner() -> ModelRunner:
    return ModelRunner(RunnerConfig(model=str(resolve_model()), kv_slots=4096, max_requests=16, dtype="bfloat16",
                                    deterministic=True, threads=2))


@pytest.fixture(scope="module")
def det():
    return deterministic_runner()


@pytest.fixture(scope="module")
def ids(det):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(det.path)
    return tok(TEXT)["input_ids"], [tok(p)["input_ids"] for p in OTHERS]


class Run:
    """Rows of one runner driven greedily the way the scheduler drives them: each step feeds a
    row its next chunk of prompt (or its last token); ``picks[r]``: the logits row that chose
    each of row r's tokens."""

    def __init__(self, runner: ModelRunner, first_slot: int) -> None:
        self.runner, self.next_slot, self.step = runner, first_slot, 0
        self.slots: dict[int, list[int]] = {}
        self.picks: dict[int, list[torch.Tensor]] = {}

    def take(self, n: int) -> list[int]:
        self.next_slot += n
        return list(range(self.next_slot - n, self.next_slot))

    def generate(self, prompts: dict[int, list[int]], n: int, chunk: int = 1 << 20,
                 cached: dict[int, list[int]] | None = None) -> dict[int, list[int]]:
        """``n`` greedy tokens for every row's prompt, all rows in one batch; ``cached[r]``: slots
        already holding the KV of row r's first tokens."""
        cached = cached or {}
        fed = {r: len(cached.get(r, [])) for r in prompts}
        outs: dict[int, list[int]] = {r: [] for r in prompts}
        new = {r: NewRow(row=r, prefix_slots=list(cached.get(r, [])), **GREEDY) for r in prompts}
        for r in prompts:
            self.slots[r], self.picks[r] = list(cached.get(r, [])), []
        while active := [r for r in prompts if len(outs[r]) < n]:
            feeds = [prompts[r][fed[r]: fed[r] + chunk] if fed[r] < len(prompts[r]) else outs[r][-1:] for r in active]
            out_slots = self.take(sum(map(len, feeds)))
            batch = ForwardBatch(step=self.step, new_rows=[new.pop(r) for r in active if r in new], rows=active,
                                 prefix_lens=[len(self.slots[r]) for r in active], extend_lens=list(map(len, feeds)),
                                 input_ids=[t for f in feeds for t in f], out_slots=out_slots)
            logits = self.runner.logits(batch)
            self.step += 1
            start = 0
            for i, (r, f) in enumerate(zip(active, feeds)):
                self.slots[r] += out_slots[start: start + len(f)]
                start += len(f)
                fed[r] += len(f)
                if fed[r] >= len(prompts[r]):  # NOTE: a chunk short of the prompt's end picks nothing
                    self.picks[r].append(logits[i].clone())
                    outs[r].append(int(logits[i].argmax()))
        return outs


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[int]:
    """The positions whose logits differ in any bit."""
    assert len(a) == len(b)
    return [i for i, (x, y) in enumerate(zip(a, b)) if not torch.equal(x, y)]


def alone(runner, prompt: list[int], chunk: int = 1 << 20) -> Run:
    run = Run(runner, 0)
    run.generate({0: prompt}, NEW, chunk)
    return run


def test_a_cache_hit_gives_the_cold_prefills_bits(det, ids):
    prompt, _ = ids
    cold = alone(det, prompt)
    warm = Run(det, 1000)
    warm.generate({1: prompt[:29]}, 1)  # another request that shares the first 29 tokens
    warm.generate({2: prompt}, NEW, cached={2: warm.slots[1][:29]})
    assert same_bits(cold.picks[0], warm.picks[2]) == []


def test_chunked_prefill_gives_the_whole_prefills_bits(det, ids):
    prompt, _ = ids
    assert same_bits(alone(det, prompt).picks[0], alone(det, prompt, chunk=7).picks[0]) == []


@pytest.mark.parametrize("layer_loop", [True, False], ids=["c++ loop", "python loop"])
def test_a_mixed_batch_gives_the_lone_requests_bits(det, ids, layer_loop):
    prompt, others = ids
    lone = alone(det, prompt)
    det.model.layer_loop = layer_loop  # NOTE: decode-only steps in C++ or in Python: the same kernels
    try:
        mixed = Run(det, 1000)
        # its neighbours prefill in chunks of 5 beside its decode steps (mixed steps)
        mixed.generate({r + 1: p for r, p in enumerate(others)} | {0: prompt}, NEW, chunk=5)
    finally:
        det.model.layer_loop = True
    assert same_bits(lone.picks[0], mixed.picks[0]) == []


def test_a_resumed_request_prefills_the_bits_its_decode_steps_made(det, ids):
    """What a worker's death or a retraction does: the prompt plus the tokens so far prefilled
    again, in one step, where decode steps made them."""
    prompt, _ = ids
    first = alone(det, prompt)
    tokens = [int(p.argmax()) for p in first.picks[0]]
    for done in (1, 5, NEW - 1):
        again = Run(det, 2000)
        again.generate({3: prompt + tokens[:done]}, NEW - done)
        assert same_bits(first.picks[0][done:], again.picks[3]) == [], f"resumed after {done} tokens"
        # and the KV it stored is the decode steps' too, bit for bit
        n = len(prompt) + done
        a, b = torch.tensor(first.slots[0][:n]), torch.tensor(again.slots[3][:n])
        assert all(torch.equal(pool[a], pool[b]) for pool in det.kv.k + det.kv.v)


@pytest.fixture(scope="module")
def decode_side(det):
    return deterministic_runner()


def test_a_pd_transfer_gives_the_colocated_bits(det, decode_side, ids):
    """Prefill on one runner in chunks beside other prompts, the KV exported and imported into
    another runner's pool (libs.transfer.codec, what a PD transfer moves), decode there beside
    other requests (prefilling in chunks, then decoding); against one runner doing both alone."""
    prompt, others = ids
    colocated = alone(det, prompt)
    prefill = Run(det, 1000)
    first = prefill.generate({r + 1: p for r, p in enumerate(others)} | {0: prompt}, 1, chunk=16)[0]
    moved = export_slots(det.kv, torch.tensor(prefill.slots[0]))
    decode = Run(decode_side, 3000)
    into = decode.take(len(prompt))
    import_slots(decode_side.kv, torch.tensor(into), moved)
    decode.generate({0: prompt + first} | {r + 1: p for r, p in enumerate(others)}, NEW - 1, chunk=5,
                    cached={0: into})
    assert same_bits(colocated.picks[0][:1], prefill.picks[0]) == []
    assert same_bits(colocated.picks[0][1:], decode.picks[0]) == []
