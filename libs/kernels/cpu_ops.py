"""Elementwise kernels for the ``cpu`` backend in C++ (``csrc/ops.cpp``, ``csrc/rope.cpp``;
AVX-512 or AVX2 where the CPU has it): RMSNorm, the residual add fused with the next RMSNorm
(in place), SiLU-and-multiply, RoPE of q and k in one pass (in place, cos/sin looked up
per token inside the kernel). Same names and signatures as :mod:`.ops`, with the torch
versions' rounding points: RoPE and the residual add are torch's bit for bit, RMSNorm and
SiLU within a last-bit difference now and then (sums in another order, another exp).
Other shapes, and code being compiled by torch.compile, take :mod:`.ops` itself (compiled
graphs reach the C++ kernels as custom ops: :mod:`.cpu_library`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cpu_ext
from . import ops as torch_ops
from .ops import Rotary, apply_rope, rope_inv_freq  # noqa: F401 - the module's full set of names

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _native(x: torch.Tensor) -> bool:
    return x.dtype in _DTYPES and x.dim() == 2 and x.is_contiguous() and not torch.compiler.is_compiling()


def _native_weight(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return _native(x) and weight.dtype == x.dtype and weight.is_contiguous()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _native_weight(x, weight):
        return cpu_ext.load().rmsnorm(x, weight, eps)
    return torch_ops.rmsnorm(x, weight, eps)


def add_rmsnorm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x <- x + h``, ``h <- rmsnorm(x)``, in place (one pass over each row); returns ``(x, h)``."""
    if _native_weight(x, weight) and _native(h) and h.shape == x.shape and h.dtype == x.dtype:
        cpu_ext.load().add_rmsnorm_(x, h, weight, eps)
        return x, h
    return torch_ops.add_rmsnorm(x, h, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if _native(gate_up):
        return cpu_ext.load().silu_mul(gate_up)
    return torch_ops.silu_mul(gate_up)


@dataclass(frozen=True)
class RopeStep:
    """A step's positions and the model's fp32 tables: the kernel looks each token's row up."""

    positions: torch.Tensor  # [T] int64, contiguous
    rotary: Rotary
    dtype: torch.dtype

    def tables(self):
        """torch's form (cos/sin per token), for rows the kernel does not take."""
        return torch_ops.rope_cache(self.rotary, self.positions, self.dtype)


def rope_cache(rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype):
    if dtype not in _DTYPES or torch.compiler.is_compiling() or rotary.cos.device.type != "cpu":
        return torch_ops.rope_cache(rotary, positions, dtype)
    return RopeStep(positions.to(torch.int64).contiguous(), rotary, dtype)


def rope_qk(qkv: torch.Tensor, heads: int, head_dim: int, rope) -> torch.Tensor:
    """Rotates q and k in place in ``qkv`` and returns them as its view [T, heads, head_dim]."""
    if not isinstance(rope, RopeStep):
        return torch_ops.rope_qk(qkv, heads, head_dim, rope)
    if not (_native(qkv) and qkv.dtype == rope.dtype):
        return torch_ops.rope_qk(qkv, heads, head_dim, rope.tables())
    cpu_ext.load().rope_qk_(qkv, rope.positions, rope.rotary.cos, rope.rotary.sin, heads, head_dim)
    return qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim)
