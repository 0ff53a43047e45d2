"""The C++ layer loop (layer_loop.py, csrc/layer_loop.cpp) against the Python loop it replaces:
the same kernels in the same order, so logits and the KV it stores are equal bit for bit."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import gemm
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.weights import HYBRID_ROWS

from .test_llama_model import SMALL, _save_random

pytestmark = pytest.mark.skipif(not gemm.f32_available(), reason="the fp32 tile kernels need AVX2 + FMA")


def _checkpoint(path, qwen: bool):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(**SMALL)) if qwen else LlamaForCausalLM(LlamaConfig(**SMALL))
    _save_random(model, path)
    return path


def _runner(path, loop: bool, kernel="tiles", kv_dtype="auto", max_requests=4) -> ModelRunner:
    runner = ModelRunner(RunnerConfig(model=str(path), kv_slots=512, max_requests=max_requests, dtype="float32",
                                      linear_kernel=kernel, kv_dtype=kv_dtype, threads=0))
    runner.model.layer_loop = loop
    return runner


def _steps():
    """A prefill of three requests (the Python loop in both), then two decode steps."""
    prompts = [[5, 17, 250, 3, 9, 44, 101], [7, 8], [299, 0, 12, 12, 80]]
    yield ForwardBatch(
        step=0, new_rows=[NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=0) for r in range(3)],
        rows=[2, 0, 1], prefix_lens=[0, 0, 0], extend_lens=[len(p) for p in prompts],
        input_ids=[t for p in prompts for t in p], out_slots=list(range(100, 114)),
    )
    yield ForwardBatch(step=1, new_rows=[], rows=[2, 0, 1], prefix_lens=[7, 2, 5], extend_lens=[1, 1, 1],
                       input_ids=[11, 12, 13], out_slots=[200, 201, 202])
    yield ForwardBatch(step=2, new_rows=[], rows=[0, 1], prefix_lens=[3, 6], extend_lens=[1, 1],
                       input_ids=[14, 15], out_slots=[203, 204])


@pytest.mark.parametrize("qwen", [False, True], ids=["llama", "qwen2-bias"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_decode_steps_equal_the_python_loop(tmp_path, qwen, kv_dtype):
    path = _checkpoint(tmp_path, qwen)
    fused, plain = _runner(path, True, kv_dtype=kv_dtype), _runner(path, False, kv_dtype=kv_dtype)
    for batch in _steps():
        got, want = fused.logits(batch), plain.logits(batch)
        assert torch.equal(got, want), f"step {batch.step}: max diff {float((got - want).abs().max())}"
    assert fused.model._loop is not None and plain.model._loop is None  # the loop ran, and only in one
    for layer in range(SMALL["num_hidden_layers"]):
        assert torch.equal(fused.kv.k[layer], plain.kv.k[layer]) and torch.equal(fused.kv.v[layer], plain.kv.v[layer])


def test_only_decode_steps_on_tiles_take_the_loop(tmp_path):
    path = _checkpoint(tmp_path, False)
    runner = _runner(path, True, kernel="tiles+onednn", max_requests=HYBRID_ROWS + 1)
    model, attn = runner.model, runner.attn
    first, decode, _ = _steps()
    runner.logits(first)
    assert model._loop is None  # a prefill step: the Python loop
    runner.logits(decode)
    assert model._loop is not None
    rope = attn.ops.rope_cache(model.rotary, torch.zeros(HYBRID_ROWS, dtype=torch.int64), model.dtype)
    assert model._layer_loop_step(attn, rope, HYBRID_ROWS - 1) is not None
    assert model._layer_loop_step(attn, rope, HYBRID_ROWS) is None  # oneDNN's linears from there
    onednn = _runner(path, True, kernel="onednn")
    onednn.logits(first), onednn.logits(decode)
    assert onednn.model._loop is None and not onednn.model.layer_loop  # no tile form: never built


def test_bad_arguments_are_refused(tmp_path):
    from libs.kernels import cpu_ext

    runner = _runner(_checkpoint(tmp_path, False), True)
    list(map(runner.logits, list(_steps())[:2]))
    loop, module = runner.model._loop, cpu_ext.load()
    with pytest.raises(RuntimeError, match="per layer 6 weights"):
        module.DecodeLayers([], [], [], runner.kv.k, runner.kv.v, 6, 2, 16, 1e-5)
    step = runner.attn.decode_step()
    rope = runner.attn.ops.rope_cache(runner.model.rotary, torch.tensor([3, 6]), torch.float32)
    with pytest.raises(RuntimeError, match="activation dtype"):
        loop.run(torch.zeros(2, SMALL["hidden_size"], dtype=torch.bfloat16), rope, step)
