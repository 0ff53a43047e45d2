"""A batch-invariant matmul for the linears under --deterministic on CUDA (the interpreter on a CPU).

``linear(x, w, bias)`` is ``F.linear`` with one fixed tile configuration whatever the row
count M: programs (block of BLOCK_M rows, block of BLOCK_N columns) each walk the whole K
axis in BLOCK_K steps from k = 0, accumulating in float32 (no split-K, no autotuning, no
tile choice that follows M). A row's reduction is then the same arithmetic in a batch of 1
or of 500, wherever in its block it sits; cuBLAS is not (its kernel, and its split-K, change
with M). Bias is added to the float32 sum, and the row rounds once to the output dtype.

NOTE: import this module only after TRITON_INTERPRET is settled (see triton_attention.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import INTERPRETED, cast, dot, dot_precision

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64
NUM_WARPS, NUM_STAGES = 4, 3


@triton.jit
def _linear_kernel(
    X, W, Bias, Out, M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERP: tl.constexpr, PRECISION: tl.constexpr,
):
    pm, pn = tl.program_id(0), tl.program_id(1)
    offs_m = (pm * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # NOTE: the one K loop of every row, always from 0 in BLOCK_K steps
        ks = k0 + offs_k
        mask_k = ks < K
        x = tl.load(X + offs_m[:, None] * stride_xm + ks[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(W + offs_n[None, :] * stride_wn + ks[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc += dot(x, w, INTERP, PRECISION)
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], cast(acc, Out.dtype.element_ty, INTERP),
             mask=mask_m[:, None] & mask_n[None, :])


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
           block_k: int = BLOCK_K) -> torch.Tensor:
    """``x @ w.T + bias`` for ``x`` [..., K] and ``w`` [N, K] of one dtype; ``block_k`` is for
    the tests only (showing that another K tiling changes the bits)."""
    if x.dtype != w.dtype:
        raise ValueError(f"the invariant linear takes one dtype, not {x.dtype} rows over {w.dtype} weights")
    lead, k = x.shape[:-1], x.shape[-1]
    n = w.shape[0]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    assert w.stride(-1) == 1 and w.shape[1] == k
    out = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        grid = (triton.cdiv(rows.shape[0], BLOCK_M), triton.cdiv(n, BLOCK_N))
        _linear_kernel[grid](
            rows, w, bias if bias is not None else w, out, rows.shape[0], n, k,
            rows.stride(0), w.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=block_k,
            INTERP=INTERPRETED, PRECISION=dot_precision(x.dtype), num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )
    return out.view(*lead, n)
