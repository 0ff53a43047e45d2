"""Tiny random HF checkpoints of every served architecture, written offline in the test (no download).

Weights are HF's seeded init; norms and biases are moved off their 1/0 defaults so that a
model ignoring one of them answers differently."""

from __future__ import annotations

import json

import torch

SMALL = dict(
    vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
)

# short name -> (HF config class, HF model class, its own defaults to override)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 16, "sliding_window": None}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
                                                           "moe_intermediate_size": 48, "norm_topk_prob": True}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                                       "intermediate_size": 64, "sliding_window": None}),
}


def hf_config(arch: str, **overrides):
    import transformers

    config_cls, _, own = ARCHS[arch]
    return getattr(transformers, config_cls)(**{**SMALL, **own, **overrides})


def write(arch: str, path, seed: int = 0, **overrides):
    """Save a random ``arch`` model (config ``overrides``) into ``path``; returns the HF model (eval, fp32)."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, ARCHS[arch][1])(hf_config(arch, **overrides))
    return save_random(model, path, seed)


def save_random(model, path, seed: int = 0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in name else 0.0))
    model.eval().save_pretrained(path)
    return model


def edit_config(path, fn) -> None:
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def write_config(arch: str, path, **overrides) -> None:
    """config.json alone (enough for what is refused before any weight is read)."""
    path.mkdir(parents=True, exist_ok=True)
    hf_config(arch, **overrides).save_pretrained(path)
    edit_config(path, lambda cfg: cfg.update(architectures=[ARCHS[arch][1]]))
