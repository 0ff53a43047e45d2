"""Helpers shared by the Triton kernels, with the interpreter's gaps filled.

Under ``TRITON_INTERPRET=1`` (the CPU path of the tests) two things differ from
a GPU: ``tl.dot`` cannot take bfloat16 (triton-lang/triton#11584), and a cast
to bfloat16 truncates instead of rounding to nearest even. ``dot`` and
``cast`` take an ``INTERP`` flag and compensate, so the interpreter computes
what the GPU computes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs

INTERPRETED = bool(knobs.runtime.interpret)


@triton.jit
def dot(a, b, INTERP: tl.constexpr, PRECISION: tl.constexpr):
    """``tl.dot`` with float32 accumulation; IEEE float32 (no TF32) when PRECISION is "ieee"."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def cast(x, dtype: tl.constexpr, INTERP: tl.constexpr):
    """``x.to(dtype)``, rounding to nearest even when narrowing float32 to bfloat16 in the interpreter too."""
    if INTERP and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


def dot_precision(dtype: torch.dtype) -> str | None:
    return "ieee" if dtype == torch.float32 else None
