"""Pieces the model families share beyond libs.kernels' elementwise ops: the rotary tables of
every rope type a family may declare, and the per-head RMSNorm of q and k (Qwen3, Gemma 3).

HF's ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` is the reference for each rope
type's inverse frequencies and attention factor (tests/gpu_worker/models/test_rope.py)."""

from __future__ import annotations

import math

import torch

from libs.kernels.ops import Rotary, rope_inv_freq

from .config import ModelConfig

ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn")


def rotary(cfg: ModelConfig, max_positions: int, device="cpu") -> Rotary:
    """cos/sin tables for positions [0, max_positions) (the served context, not the config's
    maximum: a 131k-context model on a small pool keeps small tables)."""
    inv_freq, factor = rope_frequencies(cfg)
    return Rotary(inv_freq, max_positions, device, attention_factor=factor)


def rope_frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] float32, the factor cos/sin are scaled by)."""
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", "linear", "llama3"):
        return rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), 1.0
    if kind == "dynamic":
        # NOTE: dynamic NTK only rescales past max_position_embeddings (HF grows the base with
        # the longest sequence seen); a served context never goes there, so it is the default
        return rope_inv_freq(cfg.head_dim, cfg.rope_theta), 1.0
    if kind == "yarn":
        return _yarn(cfg, scaling)
    raise ValueError(f"rope_type {kind!r} is not supported ({', '.join(ROPE_TYPES)})")


def _yarn(cfg: ModelConfig, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies, keep the high ones, a linear ramp between (by
    rotations over the original context), and scale cos/sin by ``attention_factor``."""
    dim, base = cfg.head_dim, cfg.rope_theta
    original = s.get("original_max_position_embeddings") or cfg.max_position_embeddings
    factor = s.get("factor") or cfg.max_position_embeddings / original
    attention = s.get("attention_factor")
    if attention is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = _mscale(factor, mscale) / _mscale(factor, mscale_all) if mscale and mscale_all else _mscale(factor)
    fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high  # NOTE: HF's guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    keep = 1 - ramp  # share of the extrapolated (unscaled) frequency
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, float(attention)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def head_rmsnorm(x: torch.Tensor, weight: torch.Tensor, head_dim: int, eps: float, ops) -> torch.Tensor:
    """RMSNorm of each head of ``x`` ([T, heads * head_dim], maybe a strided view): [T * heads, head_dim]."""
    return ops.rmsnorm(x.reshape(-1, head_dim), weight, eps)
