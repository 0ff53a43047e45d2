"""The C++ layer loop (layer_loop.py, csrc/layer_loop.cpp) against the Python loop it replaces:
the same kernels in the same order, so logits and the KV it stores are equal bit for bit, on
every linear form (tiles, oneDNN's packed weights, plain ones, tiles+onednn by rows), for every
model that opts into the loop (``FAST_DECODE_LOOP``); the others never take it."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import gemm
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.models.registry import model_class
from services.gpu_worker.models.weights import HYBRID_ROWS

from .checkpoints import ARCHS, SMALL, write

pytestmark = pytest.mark.skipif(not gemm.f32_available(), reason="the fp32 tile kernels need AVX2 + FMA")


OPTED_IN = [a for a, (_, hf, _) in ARCHS.items() if model_class(hf).FAST_DECODE_LOOP]
OPTED_OUT = [a for a in ARCHS if a not in OPTED_IN]


def _checkpoint(path, arch: str):
    write(arch, path)
    return path


def _runner(path, loop: bool, kernel="tiles", kv_dtype="auto", max_requests=4, pack=True,
            dtype="float32") -> ModelRunner:
    runner = ModelRunner(RunnerConfig(model=str(path), kv_slots=512, max_requests=max_requests, dtype=dtype,
                                      linear_kernel=kernel, kv_dtype=kv_dtype, threads=0, pack_weights=pack))
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


@pytest.mark.parametrize("arch", OPTED_IN)
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_decode_steps_equal_the_python_loop(tmp_path, arch, kv_dtype):
    path = _checkpoint(tmp_path, arch)
    fused, plain = _runner(path, True, kv_dtype=kv_dtype), _runner(path, False, kv_dtype=kv_dtype)
    _same_steps(fused, plain, _steps())
    assert fused.model._loop.forms() == [False] and plain.model._loop is None  # the loop ran, and only in one


@pytest.mark.parametrize("arch", OPTED_OUT)
def test_models_that_opt_out_decode_in_python(tmp_path, arch):
    runner = _runner(_checkpoint(tmp_path, arch), True)
    list(map(runner.logits, _steps()))
    assert runner.model._loop is None and not runner.model.fast_decode_loop



def _same_steps(fused: ModelRunner, plain: ModelRunner, steps) -> None:
    for batch in steps:
        got, want = fused.logits(batch), plain.logits(batch)
        assert torch.equal(got, want), f"step {batch.step}: max diff {float((got - want).abs().max())}"
    for layer in range(SMALL["num_hidden_layers"]):
        assert torch.equal(fused.kv.k[layer], plain.kv.k[layer]) and torch.equal(fused.kv.v[layer], plain.kv.v[layer])


@pytest.mark.parametrize("form", ["onednn", "plain", "plain-bf16"])
def test_other_linear_forms_equal_the_python_loop(tmp_path, form):
    """oneDNN's packed fp32 weights (--dtype float32's form) and unpacked ones, fp32 or bf16
    activations, run in the loop too."""
    path = _checkpoint(tmp_path, "qwen2")
    kw = {"onednn": dict(kernel="onednn"), "plain": dict(pack=False),
          "plain-bf16": dict(pack=False, dtype="bfloat16")}[form]
    fused, plain = _runner(path, True, **kw), _runner(path, False, **kw)
    _same_steps(fused, plain, _steps())
    assert fused.model._loop.forms() == [False]


def test_tiles_and_onednn_by_rows_as_the_python_loop(tmp_path):
    """tiles+onednn: the tiles below HYBRID_ROWS rows, oneDNN's matmul from there, in the loop as in weights.linear."""
    path = _checkpoint(tmp_path, "llama")
    fused, plain = (_runner(path, loop, kernel="tiles+onednn", max_requests=HYBRID_ROWS) for loop in (True, False))
    prompt = ForwardBatch(step=0, new_rows=[NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=0)
                                            for r in range(HYBRID_ROWS)],
                          rows=list(range(HYBRID_ROWS)), prefix_lens=[0] * HYBRID_ROWS, extend_lens=[2] * HYBRID_ROWS,
                          input_ids=[(7 * i) % 300 for i in range(2 * HYBRID_ROWS)],
                          out_slots=list(range(2 * HYBRID_ROWS)))
    wide = ForwardBatch(step=1, new_rows=[], rows=list(range(HYBRID_ROWS)), prefix_lens=[2] * HYBRID_ROWS,
                        extend_lens=[1] * HYBRID_ROWS, input_ids=[(3 * i) % 300 for i in range(HYBRID_ROWS)],
                        out_slots=list(range(300, 300 + HYBRID_ROWS)))
    narrow = ForwardBatch(step=2, new_rows=[], rows=[0, 1], prefix_lens=[3, 3], extend_lens=[1, 1],
                          input_ids=[4, 5], out_slots=[400, 401])
    _same_steps(fused, plain, [prompt, wide, narrow])
    assert fused.model._loop.forms() == [False, True]  # both forms built, each for its steps


def test_prefill_steps_keep_the_python_loop(tmp_path):
    runner = _runner(_checkpoint(tmp_path, "llama"), True)
    first, decode, _ = _steps()
    runner.logits(first)
    assert runner.model._loop is None  # a prefill step: nothing built
    runner.logits(decode)
    assert runner.model._loop is not None


def test_bad_arguments_are_refused(tmp_path):
    from libs.kernels import cpu_ext

    runner = _runner(_checkpoint(tmp_path, "llama"), True)
    list(map(runner.logits, list(_steps())[:2]))
    loop, module = runner.model._loop, cpu_ext.load()
    with pytest.raises(RuntimeError, match="per layer 6 weights"):
        module.DecodeLayers([], [], [], runner.kv.k, runner.kv.v, 6, 2, 16, 1e-5)
    layer = runner.model.weights.layers[0]
    weights = [layer.input_norm, layer.qkv.tiles, layer.o_proj.tiles, layer.post_norm, layer.gate_up.tiles,
               layer.down.tiles.float()]  # NOTE: not tiles, not a plain [out, in] weight
    with pytest.raises(RuntimeError, match="must be libs.kernels.gemm tiles"):
        module.DecodeLayers(weights, [None] * 4, [layer.qkv.shape[0], 96, 320, 96], runner.kv.k[:1], runner.kv.v[:1],
                            6, 2, 16, 1e-5)
    step = runner.attn.decode_step()
    rope = runner.attn.ops.rope_cache(runner.model.rotary, torch.tensor([3, 6]), torch.float32)
    with pytest.raises(RuntimeError, match="activation dtype"):
        loop.run(torch.zeros(2, SMALL["hidden_size"], dtype=torch.bfloat16), rope, step)
