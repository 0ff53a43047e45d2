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


def longrope(rot_dim: int, original: int) -> dict:
    """Phi-3's ``longrope`` rope parameters for a rotated width ``rot_dim`` (short and long factors
    far apart, so serving one set for the other shows)."""
    return {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": original,
            "short_factor": [1.0 + 0.05 * i for i in range(rot_dim // 2)],
            "long_factor": [1.0 + 0.7 * i for i in range(rot_dim // 2)]}


# Phi-3 (and Phi-4's) own defaults: token ids inside the tiny vocabulary; a 4-token original
# context, so HF's longrope uses its long factors on every prompt, as a server whose context
# passes the original one does (tests/gpu_worker/models/test_phi3.py: the short factors)
PHI = {"eos_token_id": 2, "pad_token_id": None, "original_max_position_embeddings": 4}

# short name -> (HF config class, HF model class, its own defaults to override)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 16, "sliding_window": None}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    # Phi-3-mini-128k: full rotary, longrope; Phi-4-mini: 0.75 of each head rotates; Phi-4 (14B): neither
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**PHI, "rope_parameters": longrope(16, 4)}),
    "phi4-mini": ("Phi3Config", "Phi3ForCausalLM", {**PHI, "partial_rotary_factor": 0.75,
                                                     "rope_parameters": longrope(12, 4)}),
    "phi4": ("Phi3Config", "Phi3ForCausalLM", {**PHI, "rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": 2.5e5}}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
                                                           "moe_intermediate_size": 48, "norm_topk_prob": True}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                                       "intermediate_size": 64, "sliding_window": None}),
    # NOTE: a softmax scale of its own (query_pre_attn_scalar != head_dim), both layer kinds, tied;
    # no eos (HF's generate would stop at Gemma's 1, our runs do not)
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "head_dim": 16, "query_pre_attn_scalar": 24, "layer_types": ["sliding_attention", "full_attention"],
        "tie_word_embeddings": True, "eos_token_id": None}),
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


def write_gemma3_wrapper(path, seed: int = 0, **overrides):
    """A random ``Gemma3ForConditionalGeneration`` (a tiny vision tower beside the gemma3 text model)."""
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=hf_config("gemma3", **overrides).to_dict(), vision_config=vision,
                                       mm_tokens_per_image=4)
    torch.manual_seed(seed)
    return save_random(transformers.Gemma3ForConditionalGeneration(config), path, seed)


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
