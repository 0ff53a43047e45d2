"""Elementwise kernels for the ``cpu`` backend: RMSNorm and SiLU-and-multiply in C++
(``csrc/ops.cpp``) for bf16 / fp16 rows, with the torch versions' rounding points
(results identical to :mod:`.ops` on the rows tested); fp32, other shapes and code
being compiled by torch.compile take :mod:`.ops` itself. Same names and signatures.
"""

from __future__ import annotations

import torch

from . import cpu_ext
from . import ops as torch_ops
from .ops import Rotary, apply_rope, rope_inv_freq  # noqa: F401 - the module's full set of names

_HALF = (torch.bfloat16, torch.float16)


def _native(x: torch.Tensor) -> bool:
    return x.dtype in _HALF and x.dim() == 2 and x.is_contiguous() and not torch.compiler.is_compiling()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _native(x) and weight.dtype == x.dtype and weight.is_contiguous():
        return cpu_ext.load().rmsnorm(x, weight, eps)
    return torch_ops.rmsnorm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if _native(gate_up):
        return cpu_ext.load().silu_mul(gate_up)
    return torch_ops.silu_mul(gate_up)
