"""Pieces the model families share beyond libs.kernels' elementwise ops: the rotary tables of
every rope type a family may declare (over the rotated part of each head: all of it, or its
first ``partial_rotary_factor`` share), and the per-head RMSNorm of q and k (Qwen3, Gemma 3).

HF's ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` is the reference for each rope
type's inverse frequencies and attention factor (tests/gpu_worker/models/test_rope.py)."""

from __future__ import annotations

import math

import torch

from libs.kernels.ops import Rotary, rope_inv_freq

from .config import ModelConfig
from .features import UnsupportedModel, partial_rotary_factor

ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")


def rotary(cfg: ModelConfig, max_positions: int, device="cpu") -> Rotary:
    """cos/sin tables for positions [0, max_positions) (the served context, not the config's
    maximum: a 131k-context model on a small pool keeps small tables; longrope picks its
    factors by it)."""
    inv_freq, factor = rope_frequencies(cfg, max_positions)
    return Rotary(inv_freq, max_positions, device, attention_factor=factor)


def rotary_dim(cfg: ModelConfig) -> int:
    """The rotated width of each head: head_dim, or its first ``partial_rotary_factor`` share
    (HF's ``int(head_dim * factor)``)."""
    dim = int(cfg.head_dim * partial_rotary_factor(cfg.raw))
    if dim <= 0 or dim % 2:
        raise UnsupportedModel(f"partial_rotary_factor={partial_rotary_factor(cfg.raw)!r}: rotates {dim} of "
                               f"head_dim {cfg.head_dim}, not an even width > 0")
    return dim


def rope_frequencies(cfg: ModelConfig, context: int | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] float32, the factor cos/sin are scaled by) for a
    served context of ``context`` positions (default: max_position_embeddings)."""
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    dim = rotary_dim(cfg)
    if kind in ("default", "linear", "llama3"):
        return rope_inv_freq(dim, cfg.rope_theta, cfg.rope_scaling), 1.0
    if kind == "dynamic":
        # NOTE: dynamic NTK only rescales past max_position_embeddings (HF grows the base with
        # the longest sequence seen); a served context never goes there, so it is the default
        return rope_inv_freq(dim, cfg.rope_theta), 1.0
    if kind == "yarn":
        return _yarn(cfg, scaling, dim)
    if kind == "longrope":
        return _longrope(cfg, scaling, dim, context or cfg.max_position_embeddings)
    raise ValueError(f"rope_type {kind!r} is not supported ({', '.join(ROPE_TYPES)})")


def _longrope(cfg: ModelConfig, s: dict, dim: int, context: int) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3, Phi-4-mini): each frequency divided by its own factor, ``short_factor``
    for a served context within ``original_max_position_embeddings``, ``long_factor`` past it;
    cos/sin scaled by ``attention_factor`` (default sqrt(1 + ln(factor) / ln(original)), factor
    max_position_embeddings / original) in both.

    NOTE: HF switches every position to the long factors once a sequence passes the original
    context, which would make cached K (rotated with the short ones) wrong for it. A server with
    a prefix cache keeps one set for all sequences, picked by the served context (as vLLM picks
    by max_model_len): the long factors only where sequences can pass the original context
    (docs/models.md)."""
    original = (s.get("original_max_position_embeddings") or cfg.raw.get("original_max_position_embeddings")
                or cfg.max_position_embeddings)
    factor = s.get("factor") or cfg.max_position_embeddings / original
    attention = s.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    name = "long_factor" if context > original else "short_factor"
    ext = s.get(name)
    if not isinstance(ext, list) or len(ext) != dim // 2:
        raise UnsupportedModel(f"rope_parameters.{name}: {dim // 2} factors expected (rotary dim {dim}), got {ext!r}")
    pos_freqs = cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * pos_freqs), float(attention)


def _yarn(cfg: ModelConfig, s: dict, dim: int) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies, keep the high ones, a linear ramp between (by
    rotations over the original context), and scale cos/sin by ``attention_factor``."""
    base = cfg.rope_theta
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
