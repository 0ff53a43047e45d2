"""RMSNorm, RoPE and SiLU-and-multiply as Triton kernels, with the signatures of :mod:`libs.kernels.ops`.

One program per token row; the math runs in float32 and rounds once, like the
torch versions (RMSNorm rounds the normalised row before the weight, as HF does).

NOTE: batch-invariant as they are (the deterministic mode needs nothing more of them): RMSNorm
reduces each row in its own program over a block sized by the row's width, never by the
number of rows; RoPE and SiLU-and-multiply reduce nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ops import rope_cache  # noqa: F401 - cos/sin looked up once per step, as in torch
from .triton_utils import INTERPRETED, cast


@triton.jit
def _rmsnorm_kernel(X, W, Out, stride_x, stride_o, n, eps, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    xn = x * tl.rsqrt(tl.sum(x * x, 0) / n + eps)
    w = tl.load(W + offs, mask=mask, other=0.0)
    y = cast(xn, Out.dtype.element_ty, INTERP).to(tl.float32) * w.to(tl.float32)
    tl.store(Out + row * stride_o + offs, cast(y, Out.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _silu_mul_kernel(GU, Out, stride_g, stride_o, inter, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    row, col = tl.program_id(0), tl.program_id(1)
    offs = col * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    g = tl.load(GU + row * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_g + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(Out + row * stride_o + offs, cast(y, Out.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _rope_kernel(
    X, Cos, Sin, Out, heads,
    stride_xt, stride_xh, stride_ct, stride_st, stride_ot, stride_oh,
    HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
    INTERP: tl.constexpr,
):
    t = tl.program_id(0)
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK)
    mask = (offs_h[:, None] < heads) & (offs[None, :] < HALF)
    cos = tl.load(Cos + t * stride_ct + offs, mask=offs < HALF, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(Sin + t * stride_st + offs, mask=offs < HALF, other=0.0).to(tl.float32)[None, :]
    x_ptr = X + t * stride_xt + offs_h[:, None] * stride_xh + offs[None, :]
    x1 = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    o_ptr = Out + t * stride_ot + offs_h[:, None] * stride_oh + offs[None, :]
    tl.store(o_ptr, cast(x1 * cos - x2 * sin, Out.dtype.element_ty, INTERP), mask=mask)
    tl.store(o_ptr + HALF, cast(x2 * cos + x1 * sin, Out.dtype.element_ty, INTERP), mask=mask)
    if PASS > 0:  # NOTE: partial rotary: each head's last PASS columns are copied as they are
        offs_p = tl.arange(0, BLOCK_P)
        mask_p = (offs_h[:, None] < heads) & (offs_p[None, :] < PASS)
        x_pass = X + t * stride_xt + offs_h[:, None] * stride_xh + 2 * HALF + offs_p[None, :]
        o_pass = Out + t * stride_ot + offs_h[:, None] * stride_oh + 2 * HALF + offs_p[None, :]
        tl.store(o_pass, tl.load(x_pass, mask=mask_p, other=0.0), mask=mask_p)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)`` over the last dim of a [T, n] tensor (rows may be strided)."""
    assert x.dim() == 2 and x.stride(-1) == 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    _rmsnorm_kernel[(x.shape[0],)](
        x, weight, out, x.stride(0), out.stride(0), n, eps, BLOCK=triton.next_power_of_2(n), INTERP=INTERPRETED,
    )
    return out


def add_rmsnorm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``x + h`` and its RMSNorm (see :func:`libs.kernels.ops.add_rmsnorm`)."""
    x = x + h
    return x, rmsnorm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for a [T, 2 * inter] gate/up projection."""
    assert gate_up.dim() == 2 and gate_up.stride(-1) == 1
    t, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(t, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(t, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block, INTERP=INTERPRETED,
    )
    return out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation of ``x`` [T, heads, D] by ``cos``/``sin`` ([T, 1, R/2] or [T, R/2]; R < D:
    partial rotary, the rest of each head passes through, as :func:`libs.kernels.ops.apply_rope`)."""
    assert x.dim() == 3 and x.stride(-1) == 1
    t, heads, dim = x.shape
    half = cos.shape[-1]
    assert 2 * half <= dim
    cos, sin = cos.reshape(t, half), sin.reshape(t, half)
    assert cos.stride(-1) == 1 and sin.stride(-1) == 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rope_kernel[(t,)](
        x, cos, sin, out, heads,
        x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        HALF=half, PASS=dim - 2 * half, BLOCK_H=triton.next_power_of_2(heads), BLOCK=triton.next_power_of_2(half),
        BLOCK_P=triton.next_power_of_2(max(dim - 2 * half, 1)), INTERP=INTERPRETED,
    )
    return out


def rope_qk(qkv: torch.Tensor, heads: int, head_dim: int, rope) -> torch.Tensor:
    """The first ``heads`` heads of the fused QKV rows, rotated (see :func:`libs.kernels.ops.rope_qk`)."""
    return apply_rope(qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim), *rope)
