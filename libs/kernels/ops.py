"""Elementwise kernels of Llama-family models in torch: RMSNorm (alone and after the residual add),
RoPE, SiLU-and-multiply."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)``, computed in float32 and cast back (as HF does)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rmsnorm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``x + h`` and its RMSNorm. Callers treat ``x`` and ``h`` as consumed:
    the C++ version (:mod:`.cpu_ops`) returns them, overwritten in place."""
    x = x + h
    return x, rmsnorm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for the fused [..., 2 * inter] gate/up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies (float32) for ``rope_type`` default, linear or llama3."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv, scaling)
    raise ValueError(f"rope_type {kind!r} is not supported (default, linear, llama3)")


def _llama3_inv_freq(inv: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary:
    """cos/sin tables for every position up to ``max_positions``, built once."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, device="cpu", attention_factor: float = 1.0):
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        self.cos = (freqs.cos() * attention_factor).to(device)
        self.sin = (freqs.sin() * attention_factor).to(device)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ([T, 1, R/2]; R the rotated width: D, or less under partial rotary) of each
        token's position, once per step for all layers."""
        return self.cos[positions][:, None, :].to(dtype), self.sin[positions][:, None, :].to(dtype)


def rope_cache(rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype):
    """What :func:`rope_qk` takes for a step's ``positions``: built once, used by every layer."""
    return rotary.lookup(positions, dtype)


def rope_qk(qkv: torch.Tensor, heads: int, head_dim: int, rope) -> torch.Tensor:
    """The first ``heads`` heads of the fused QKV rows ([T, W]: the q heads, then the k heads),
    rotated: [T, heads, head_dim]. ``rope`` is :func:`rope_cache`'s (tables narrower than
    head_dim / 2: partial rotary, see :func:`apply_rope`)."""
    return apply_rope(qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim), *rope)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split (NeoX/HF) rotation: ``cos``/``sin`` are [..., R/2] and broadcast over heads.
    Partial rotary (R < D, the tables' width says it): the first R of each head rotate, the
    rest pass through (HF's Phi-3 ``apply_rotary_pos_emb``)."""
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
