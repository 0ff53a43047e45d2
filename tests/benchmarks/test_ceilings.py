"""The linears' roofline the step benchmark divides by: weights read once per step, 2 FLOP
per weight element and token."""

from __future__ import annotations

import pytest
import torch

from radixmesh.benchmarks import ceilings
from services.gpu_worker.models.config import ModelConfig

from ..gpu_worker.models.test_llama_model import SMALL


def _config(tmp_path) -> ModelConfig:
    from transformers import LlamaConfig

    LlamaConfig(**SMALL, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    return ModelConfig.from_dir(tmp_path)


def test_linear_params_count_every_projection_and_the_lm_head(tmp_path):
    c = _config(tmp_path)
    body, head = ceilings.linear_params(c)
    q_o = 2 * c.num_heads * c.head_dim * c.hidden_size
    k_v = 2 * c.num_kv_heads * c.head_dim * c.hidden_size
    mlp = 3 * c.intermediate_size * c.hidden_size
    assert body == c.num_layers * (q_o + k_v + mlp) and head == c.vocab_size * c.hidden_size
    assert ceilings.weight_bytes(c, torch.bfloat16) == 2 * (body + head)


def test_small_steps_are_bound_by_reading_the_weights_and_large_ones_by_the_matmuls(tmp_path):
    c = _config(tmp_path)
    body, head = ceilings.linear_params(c)
    read_s = ceilings.weight_bytes(c, torch.bfloat16) / (10 / 2 * 1e9)  # at a 10 GB/s copy rate
    # one token: the read takes longer than its matmul work at 1 TFLOP/s
    assert ceilings.step_bound(1, 1, c, torch.bfloat16, 1000.0, 10.0) == pytest.approx(1 / read_s)
    # a huge chunk at 1 GFLOP/s: the matmuls; a prefill chunk's LM head runs once
    flop = 2 * (4096 * body + head)
    assert ceilings.step_bound(4096, 1, c, torch.bfloat16, 1.0, 10.0) == pytest.approx(4096 / (flop / 1e9))
    decode = ceilings.step_bound(4096, 4096, c, torch.bfloat16, 1.0, 10.0)
    assert decode == pytest.approx(4096 / (2 * 4096 * (body + head) / 1e9)) and decode < 4096 / (flop / 1e9)
