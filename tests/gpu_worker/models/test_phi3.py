"""Phi-3's longrope on a server: one factor set for every sequence, picked by the served context
(max_model_len): the short factors within original_max_position_embeddings, token-identical to
HF there (HF's choice for sequences that short); the long ones past it (test_architectures.py's
phi3 cases, on prompts all past a 4-token original context). Rope types HF's Phi-3 does not
take are refused by name."""

from __future__ import annotations

import pytest
import torch

from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.models.features import UnsupportedModel
from services.gpu_worker.models.registry import load_model

from .checkpoints import edit_config, longrope, write, write_config
from .greedy import Slots, generate, hf_greedy
from .test_architectures import N, _prompts

ORIGINAL = 64  # the tiny model's original context; max_position_embeddings 256
SHORT = dict(original_max_position_embeddings=ORIGINAL, rope_parameters=longrope(12, ORIGINAL))


def _runner(path, max_model_len: int, backend: str = "cpu") -> ModelRunner:
    return ModelRunner(RunnerConfig(model=str(path), kv_slots=1024, max_requests=4, dtype="float32",
                                    attention_backend=backend, max_model_len=max_model_len))


@pytest.fixture(scope="module")
def phi4_mini(tmp_path_factory):
    """A Phi-4-mini-like checkpoint (partial rotary 0.75, longrope over a 64-token original
    context) and HF's greedy outputs of _prompts() (all within 64 tokens), from the first seed
    without near-ties."""
    path = tmp_path_factory.mktemp("phi4-mini")
    for seed in range(5):
        hf = write("phi4-mini", path, seed=seed, **SHORT)
        refs = [hf_greedy(hf, p, N) for p in _prompts()]
        if min(gap for _, gap in refs) > 1e-4:
            assert max(len(p) for p in _prompts()) + N <= ORIGINAL
            return path, hf, [tokens for tokens, _ in refs]
    raise AssertionError("every seed has a near-tie")


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_within_the_original_context_greedy_matches_hf(phi4_mini, backend):
    path, _, refs = phi4_mini
    runner, slots, prompts = _runner(path, ORIGINAL, backend), Slots(1024), _prompts()
    cold, held = generate(runner, prompts, N, slots)
    assert cold == refs
    assert generate(runner, prompts, N, slots, chunk=8)[0] == refs
    cached = [h[: len(p) - 3] for h, p in zip(held, prompts)]
    assert generate(runner, prompts, N, slots, cached=cached)[0] == refs


@pytest.mark.parametrize("max_model_len", [ORIGINAL, ORIGINAL + 1, 256])
def test_the_served_context_picks_the_factors_hf_uses_for_a_sequence_that_long(phi4_mini, max_model_len):
    """The rope tables of every position equal HF's for a sequence of max_model_len tokens."""
    path, hf, _ = phi4_mini
    rotary = _runner(path, max_model_len).model.rotary
    positions = torch.arange(max_model_len)[None]
    cos, sin = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
    half = rotary.cos.shape[1]
    assert half == 6  # 0.75 of head_dim 16, halved
    assert torch.equal(rotary.cos, cos[0, :, :half]) and torch.equal(rotary.sin, sin[0, :, :half])


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 2.0}, {"type": "su"}])
def test_rope_types_hf_phi3_does_not_take_are_refused(tmp_path, rope):
    """HF's Phi-3 reads "su" and "yarn" as longrope and refuses the rest: served as neither."""
    write_config("phi4", tmp_path)
    edit_config(tmp_path, lambda c: c.update(rope_parameters={**rope, "rope_theta": 1e4}))
    with pytest.raises(UnsupportedModel, match="refused rather than served wrong") as err:
        load_model(tmp_path)
    assert f"rope_parameters.rope_type={next(iter(rope.values()))!r}" in str(err.value)


def test_a_llama_checkpoint_relabelled_phi3_is_refused(tmp_path):
    """Phi-3 reads the fused qkv_proj / gate_up_proj: split q/k/v weights are not its checkpoint."""
    write("llama", tmp_path)
    edit_config(tmp_path, lambda c: c.update(architectures=["Phi3ForCausalLM"]))
    with pytest.raises(UnsupportedModel, match=r"does not use.*self_attn\.k_proj"):
        load_model(tmp_path)
