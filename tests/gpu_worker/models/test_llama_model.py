"""Our Llama-family model against HF on tiny random checkpoints (Qwen2 bias, llama3 RoPE, legacy keys)."""

from __future__ import annotations

import json

import pytest
import torch

from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.models.config import ModelConfig

from .checkpoints import SMALL
from .checkpoints import edit_config as _edit_config
from .checkpoints import save_random as _save_random


def _compare(path, hf):
    runner = ModelRunner(RunnerConfig(model=str(path), kv_slots=256, max_requests=4, dtype="float32"))
    prompts = [[5, 17, 250, 3, 9, 44, 101], [7], [299, 0, 12, 12, 80]]
    batch = ForwardBatch(
        step=0, new_rows=[NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=0) for r in range(3)],
        rows=[2, 0, 1], prefix_lens=[0, 0, 0], extend_lens=[len(p) for p in prompts],
        input_ids=[t for p in prompts for t in p], out_slots=list(range(100, 113)),
    )
    ours = runner.logits(batch)
    with torch.no_grad():
        for got, ids in zip(ours, prompts):
            ref = hf(torch.tensor([ids])).logits[0, -1]
            assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
    return runner


def test_qwen2_with_qkv_bias(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf = _save_random(Qwen2ForCausalLM(Qwen2Config(**SMALL)), tmp_path)
    runner = _compare(tmp_path, hf)
    assert runner.model.weights.layers[0].qkv_bias is not None
    assert runner.model.weights.lm_head is not runner.model.weights.embed


def test_llama3_rope_and_legacy_config_keys(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    hf = _save_random(LlamaForCausalLM(LlamaConfig(**SMALL, rope_parameters=rope)), tmp_path)

    def legacy(cfg):  # pre-v5 layout: top-level rope_theta, rope_scaling, no head_dim
        params = cfg.pop("rope_parameters")
        cfg["rope_theta"] = params.pop("rope_theta")
        cfg["rope_scaling"] = params
        cfg.pop("head_dim", None)
        cfg["eos_token_id"] = [2, 7]

    _edit_config(tmp_path, legacy)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    cfg = ModelConfig.from_dir(tmp_path)
    assert (cfg.rope_theta, cfg.head_dim, cfg.eos_token_ids) == (50000.0, 16, (2, 7, 9))
    runner = _compare(tmp_path, hf)
    assert runner.eos_token_ids == [2, 7, 9] and runner.max_model_len == 256


def test_unsupported_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_dir(tmp_path)


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_the_cpp_elementwise_ops_give_the_torch_ops_logits(tmp_path, dtype, tolerance):
    """The cpu backend's C++ ops (RMSNorm fused with the residual add and run in place, RoPE in
    place) against torch's, same weights, a prefill then a decode step: fp32 within the C++
    RMSNorm / SiLU's last-bit differences (measured: 2e-7); bf16 within a few of its rounding
    steps of 2^-8 (measured: identical, as RoPE and the add round as torch does)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from libs.kernels import cpu_ops
    from libs.kernels import ops as torch_ops

    _save_random(Qwen2ForCausalLM(Qwen2Config(**SMALL)), tmp_path)
    make = lambda: ModelRunner(RunnerConfig(model=str(tmp_path), kv_slots=64, max_requests=4, dtype=dtype,  # noqa: E731
                                            attention_backend="cpu"))
    cpp, ref = make(), make()
    ref.attn.ops = torch_ops
    assert cpp.attn.ops is cpu_ops
    new = [NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=0) for r in (0, 1)]
    steps = [
        ForwardBatch(step=0, new_rows=new, rows=[0, 1], prefix_lens=[0, 0], extend_lens=[5, 3],
                     input_ids=[5, 17, 250, 3, 9, 44, 101, 7], out_slots=list(range(8))),
        ForwardBatch(step=1, new_rows=[], rows=[0, 1], prefix_lens=[5, 3], extend_lens=[1, 1],
                     input_ids=[12, 80], out_slots=[8, 9]),
    ]
    for batch in steps:
        got, want = cpp.logits(batch), ref.logits(batch)
        assert float((got - want).abs().max() / want.abs().max()) < tolerance


def test_the_last_layer_runs_on_the_rows_read_only(tmp_path):
    """``hidden(rows=...)``: the last layer's o_proj and MLP run on those tokens alone (what the
    LM head reads); they come out as in the pass over every token, whose K/V are all stored."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from libs.kernels.synthetic import synthetic_step

    _save_random(LlamaForCausalLM(LlamaConfig(**SMALL)), tmp_path)
    runner = ModelRunner(RunnerConfig(model=str(tmp_path), kv_slots=256, max_requests=4, dtype="float32"))
    gen = torch.Generator().manual_seed(3)
    step = synthetic_step([0, 0], [7, 5], num_slots=256, generator=gen)
    ids, positions = torch.randint(0, 300, (12,), generator=gen), torch.tensor([*range(7), *range(5)])
    runner.attn.prepare(step.meta)
    full = runner.model.hidden(ids, positions, runner.attn)
    runner.kv.k[-1].zero_()
    rows = torch.tensor([6, 11, 3])
    runner.attn.prepare(step.meta)
    some = runner.model.hidden(ids, positions, runner.attn, rows=rows)
    assert some.shape == (3, SMALL["hidden_size"])
    torch.testing.assert_close(some, full[rows], rtol=1e-5, atol=1e-5)
    assert bool(runner.kv.k[-1][step.meta.out_slots].any(-1).all())  # every token's last-layer K stored again
