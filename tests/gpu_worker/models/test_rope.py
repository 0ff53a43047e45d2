"""Every rope type a model may declare against HF's ROPE_INIT_FUNCTIONS: inverse frequencies and
the attention factor cos/sin are scaled by (logits through the model: test_architectures.py)."""

from __future__ import annotations

import pytest
import torch

from services.gpu_worker.models.config import ModelConfig
from services.gpu_worker.models.layers import ROPE_TYPES, rope_frequencies

from .checkpoints import write_config

ROPES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "mscale": 0.707,
                    "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2},
    "yarn-no-truncate": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "truncate": False, "attention_factor": 1.3},
}


def test_every_rope_type_is_covered():
    assert {r["rope_type"] for r in ROPES.values()} == set(ROPE_TYPES)


@pytest.mark.parametrize("name", ROPES)
def test_frequencies_and_attention_factor_match_hf(tmp_path, name):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {**ROPES[name], "rope_theta": 50000.0}
    write_config("llama", tmp_path, rope_parameters=rope)
    ours, factor = rope_frequencies(ModelConfig.from_dir(tmp_path))
    hf_config = AutoConfig.from_pretrained(tmp_path)
    if rope["rope_type"] == "default":
        ref, ref_factor = 1.0 / (50000.0 ** (torch.arange(0, 16, 2).float() / 16)), 1.0
    else:
        ref, ref_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, "cpu")
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12)
