"""ModelRunner against HF transformers on the default model (fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libs.protocol import ServiceError
from libs.protocol.messages import ForwardBatch, NewRow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
]
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)


class _Slots:
    """The test's own slot allocator: hands out fresh slot numbers in a scrambled order."""

    def __init__(self, total: int) -> None:
        self._free = torch.randperm(total, generator=torch.Generator().manual_seed(0)).tolist()

    def take(self, n: int) -> list[int]:
        out, self._free = self._free[:n], self._free[n:]
        return out


def _hf_last_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0, -1].float()


def _assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 1e-4, f"relative error {err:.2e}"


def _hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False, max_new_tokens=n, pad_token_id=2,
        )
    return out[0, len(ids):].tolist()


def _generate(runner, prompts, rows, slots: _Slots, n: int, prefix_lens=None,
              ahead: bool = False) -> list[list[int]]:
    """Prefill every prompt in one batch (after ``prefix_lens`` cached tokens), then decode
    together (``ahead``: each decode's input is -1, the row's last sampled token)."""
    prefix_lens = prefix_lens or [0] * len(prompts)
    lens = [p + len(ids) for p, ids in zip(prefix_lens, prompts)]
    batch = ForwardBatch(
        step=0, new_rows=[NewRow(row=r, **GREEDY) for r in rows], rows=rows,
        prefix_lens=prefix_lens, extend_lens=[len(p) for p in prompts],
        input_ids=[t for p in prompts for t in p], out_slots=slots.take(sum(len(p) for p in prompts)),
    )
    outs = [[t] for t in runner.execute(batch)]
    for step in range(1, n):
        batch = ForwardBatch(
            step=step, new_rows=[], rows=rows, prefix_lens=lens, extend_lens=[1] * len(rows),
            input_ids=[-1 if ahead else o[-1] for o in outs], out_slots=slots.take(len(rows)),
        )
        for o, t in zip(outs, runner.execute(batch)):
            o.append(t)
        lens = [x + 1 for x in lens]
    return outs


def test_prefill_and_decode_logits_match_hf(runner, hf_model, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    slots = _Slots(runner.config.kv_slots)
    batch = ForwardBatch(
        step=0, new_rows=[NewRow(row=r, **GREEDY) for r in (3, 5)], rows=[3, 5], prefix_lens=[0, 0],
        extend_lens=[len(p) for p in prompts], input_ids=prompts[0] + prompts[1],
        out_slots=slots.take(len(prompts[0]) + len(prompts[1])),
    )
    logits = runner.logits(batch)
    for ours, ids in zip(logits, prompts):
        _assert_logits_close(ours, _hf_last_logits(hf_model, ids))
    # one decode step for both, through the cached KV
    nxt = [int(x.argmax()) for x in logits]
    decode = ForwardBatch(
        step=1, new_rows=[], rows=[3, 5], prefix_lens=[len(p) for p in prompts], extend_lens=[1, 1],
        input_ids=nxt, out_slots=slots.take(2),
    )
    for ours, ids, t in zip(runner.logits(decode), prompts, nxt):
        _assert_logits_close(ours, _hf_last_logits(hf_model, ids + [t]))


def test_batched_greedy_generation_matches_hf(runner, hf_model, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    ours = _generate(runner, prompts, rows=[7, 0, 4], slots=_Slots(runner.config.kv_slots), n=20)
    for got, ids in zip(ours, prompts):
        ref = _hf_greedy(hf_model, ids, 20)
        assert got[: len(ref)] == ref


def test_prefix_reuse_matches_hf(runner, hf_model, tokenizer):
    """A second request starts from the first one's cached KV (same row, prefix_lens > 0)."""
    shared = tokenizer(PROMPTS[2])["input_ids"]
    slots = _Slots(runner.config.kv_slots)
    _generate(runner, [shared], rows=[9], slots=slots, n=3)  # row 9 now holds the shared prefix
    suffix = tokenizer(" a dragon who")["input_ids"]
    [got] = _generate(runner, [suffix], rows=[9], slots=slots, n=12, prefix_lens=[len(shared)])
    assert got == _hf_greedy(hf_model, shared + suffix, 12)


def test_invalid_batches_are_typed_400(runner):
    ok = dict(step=0, new_rows=[], rows=[0], prefix_lens=[0], extend_lens=[2], input_ids=[1, 2], out_slots=[0, 1])
    bad = [
        dict(ok, out_slots=[0, runner.config.kv_slots]),
        dict(ok, rows=[runner.config.max_requests]),
        dict(ok, extend_lens=[3]),
        dict(ok, input_ids=[1, runner.vocab_size]),
        dict(ok, prefix_lens=[runner.max_model_len]),
        dict(ok, rows=[0, 0], prefix_lens=[0, 0], extend_lens=[1, 1]),
        dict(ok, out_slots=[1, 1]),
        dict(ok, rows=[], prefix_lens=[], extend_lens=[], input_ids=[], out_slots=[]),
        dict(ok, new_rows=[NewRow(row=0, temperature=-1.0, top_p=1.0, top_k=-1, seed=0)]),
        dict(ok, new_rows=[NewRow(row=0, temperature=1.0, top_p=0.0, top_k=-1, seed=0)]),
        dict(ok, new_rows=[NewRow(row=99, temperature=1.0, top_p=1.0, top_k=-1, seed=0)]),
        dict(ok, input_ids=[1, 1 << 70]),
    ]
    for fields in bad:
        with pytest.raises(ServiceError) as err:
            runner.execute(ForwardBatch(**fields))
        assert (err.value.code, err.value.status) == ("invalid_request_error", 400), fields
    assert len(runner.execute(ForwardBatch(**ok))) == 1


def test_steps_sent_ahead_read_the_rows_last_sampled_tokens(runner, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    slots = _Slots(runner.config.kv_slots)
    explicit = _generate(runner, prompts, rows=[3, 1, 5], slots=slots, n=10)
    assert _generate(runner, prompts, rows=[3, 1, 5], slots=slots, n=10, ahead=True) == explicit
    # continue row 3 (it sampled in step 9): -1 must follow that step, in a one-token run
    follow = dict(new_rows=[], rows=[3], prefix_lens=[len(prompts[0]) + 9], extend_lens=[1],
                  input_ids=[-1], out_slots=slots.take(1))
    for fields in (dict(follow, step=11), dict(follow, rows=[6]),
                   dict(follow, new_rows=[NewRow(row=3, **GREEDY)]),
                   dict(follow, extend_lens=[2], input_ids=[-1, 5], out_slots=slots.take(2)),
                   dict(follow, input_ids=[-2])):
        with pytest.raises(ServiceError) as err:
            runner.execute(ForwardBatch(**dict(dict(step=10), **fields)))
        assert err.value.status == 400, fields
    assert runner.execute(ForwardBatch(step=10, **follow)) == [
        _generate(runner, prompts[:1], rows=[3], slots=slots, n=11)[0][-1]]


def test_seeded_sampling_reproducible_across_batches(runner, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    slots = _Slots(runner.config.kv_slots)
    params = dict(temperature=1.0, top_p=0.9, top_k=-1, seed=1234)

    def first_token(rows, others):
        prompts = [ids] + others
        batch = ForwardBatch(
            step=0, new_rows=[NewRow(row=r, **params) for r in rows], rows=rows, prefix_lens=[0] * len(rows),
            extend_lens=[len(p) for p in prompts], input_ids=[t for p in prompts for t in p],
            out_slots=slots.take(sum(len(p) for p in prompts)),
        )
        return runner.execute(batch)[0]

    alone = first_token([1], [])
    assert first_token([2, 6], [tokenizer(PROMPTS[1])["input_ids"]]) == alone


def test_new_row_starts_from_shared_prefix_slots(runner, hf_model, tokenizer):
    """A request in another row reuses the first request's prefix through ``prefix_slots``."""
    shared = tokenizer(PROMPTS[2])["input_ids"]
    slots = _Slots(runner.config.kv_slots)
    prefill = ForwardBatch(
        step=0, new_rows=[NewRow(row=10, **GREEDY)], rows=[10], prefix_lens=[0],
        extend_lens=[len(shared)], input_ids=shared, out_slots=slots.take(len(shared)),
    )
    runner.execute(prefill)
    suffix = tokenizer(" a wizard and")["input_ids"]
    batch = ForwardBatch(
        step=1, new_rows=[NewRow(row=11, prefix_slots=prefill.out_slots, **GREEDY)],
        rows=[11], prefix_lens=[len(shared)], extend_lens=[len(suffix)], input_ids=suffix,
        out_slots=slots.take(len(suffix)),
    )
    _assert_logits_close(runner.logits(batch)[0], _hf_last_logits(hf_model, shared + suffix))


def test_bfloat16_runner_close_to_float32(runner, tokenizer):
    from services.gpu_worker import ModelRunner, RunnerConfig

    bf16 = ModelRunner(RunnerConfig(model=str(runner.path), kv_slots=256, max_requests=2, dtype="bfloat16"))
    assert bf16.kv.k[0].dtype == torch.bfloat16
    ids = tokenizer(PROMPTS[0])["input_ids"]
    batch = ForwardBatch(
        step=0, new_rows=[NewRow(row=1, **GREEDY)], rows=[1], prefix_lens=[0], extend_lens=[len(ids)],
        input_ids=ids, out_slots=list(range(len(ids))),
    )
    ours, ref = bf16.logits(batch)[0], runner.logits(batch)[0]
    assert ours.dtype == torch.float32
    assert float((ours - ref).abs().max() / ref.abs().max()) < 5e-2
    assert int(ours.argmax()) == int(ref.argmax())


def test_each_step_runs_on_the_thread_count_it_chose(runner, hf_model, tokenizer):
    """threads=2: steps run on one or two threads (threads.py), both timed, same tokens as HF."""
    from services.gpu_worker import ModelRunner, RunnerConfig
    from services.gpu_worker.threads import ThreadChooser

    two = ModelRunner(RunnerConfig(model=str(runner.path), kv_slots=1024, max_requests=4, dtype="float32", threads=2))
    try:
        prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
        ours = _generate(two, prompts, rows=[0, 1], slots=_Slots(1024), n=8)
        for got, ids in zip(ours, prompts):
            assert got == _hf_greedy(hf_model, ids, 8)
        decode = two.thread_chooser.table()[ThreadChooser.size_of(2)]
        assert set(decode) == {1, 2} and all(ms > 0 for ms in decode.values())
        assert torch.get_num_threads() in (1, 2)
    finally:
        torch.set_num_threads(1)  # NOTE: the session's runner fixture runs on one
    assert runner.thread_chooser is None  # threads=0: torch's setting is left alone


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_step_arrays_reach_the_device_unchanged(device):
    """to_device: the CPU takes the array as is (no copy); CUDA copies it through pinned memory
    without blocking, and a later edit of the host array does not reach the copy."""
    from services.gpu_worker.model_runner import to_device

    host = np.arange(10, dtype=np.int64)
    moved = to_device(host, torch.device(device))
    if device == "cpu":
        assert moved.data_ptr() == torch.from_numpy(host).data_ptr()
    host[0] = 99
    assert moved.tolist()[1:] == list(range(1, 10))
    assert moved.tolist()[0] == (99 if device == "cpu" else 0)
