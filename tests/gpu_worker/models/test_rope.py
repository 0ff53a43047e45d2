"""Every rope type a model may declare against HF's ROPE_INIT_FUNCTIONS: inverse frequencies and
the attention factor cos/sin are scaled by (logits through the model: test_architectures.py)."""

from __future__ import annotations

import pytest
import torch

from services.gpu_worker.models.config import ModelConfig
from services.gpu_worker.models.layers import ROPE_TYPES, rope_frequencies

from .checkpoints import edit_config, longrope, write_config

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
    # NOTE: served contexts (256) past the original one: the long factors (HF's for sequences past it)
    "longrope": longrope(16, 4),
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
    else:  # NOTE: the served context, max_position_embeddings (what longrope picks its factors by)
        ref, ref_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, "cpu", seq_len=256)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12)


def _legacy_layout(cfg: dict) -> None:
    """Phi-3-mini-128k's config.json layout: ``rope_scaling`` (type ``longrope``), the original
    context, rope_theta and partial_rotary_factor at the top level."""
    rope = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rope.pop("rope_theta"), partial_rotary_factor=rope.pop("partial_rotary_factor"),
               original_max_position_embeddings=rope.pop("original_max_position_embeddings"),
               rope_scaling={"type": rope.pop("rope_type"), **rope})


@pytest.mark.parametrize("layout", ["rope_parameters", "legacy"])
@pytest.mark.parametrize("partial", [1.0, 0.75])
@pytest.mark.parametrize("context", [64, 65, 256])
def test_longrope_picks_its_factors_by_the_served_context(tmp_path, context, partial, layout):
    """Short factors for a served context within original_max_position_embeddings (64; HF's for
    every sequence that short), long ones past it (HF's for a sequence past it); partial rotary:
    frequencies of the rotated width only; attention factor from max_position_embeddings / 64."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    dim = int(16 * partial)
    write_config("phi3", tmp_path, partial_rotary_factor=partial, original_max_position_embeddings=64,
                 rope_parameters=longrope(dim, 64))
    if layout == "legacy":
        edit_config(tmp_path, _legacy_layout)
    ours, factor = rope_frequencies(ModelConfig.from_dir(tmp_path), context)
    ref, ref_factor = ROPE_INIT_FUNCTIONS["longrope"](AutoConfig.from_pretrained(tmp_path), "cpu", seq_len=context)
    assert ours.shape == (dim // 2,)
    torch.testing.assert_close(ours, ref.float(), rtol=0, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12) and factor > 1
