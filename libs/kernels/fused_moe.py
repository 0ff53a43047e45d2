"""A mixture-of-experts layer's experts as Triton grouped GEMMs (the GPU's path; SGLang's and
vLLM's ``fused_moe``): each (token, choice) pair is sorted by its expert, every expert's run of
pairs padded to a whole block of BLOCK_M rows, and one program computes a BLOCK_M x BLOCK_N tile
of one expert's matmul over the rows of one block, reading the rows in place (no gather copy)::

    sorted pairs | e0 e0 e0 -- | e1 -- -- -- | e3 e3 e3 e3 | e3 -- -- -- | (-- : padding, skipped)
    blocks       |  expert 0   |  expert 1   |  expert 3   |  expert 3   |

Two calls per layer: gate_up (rows: the tokens) then, after SiLU-and-multiply, down (rows: the
pairs), which scales each row by its routing weight in float32 before rounding; the pairs of a
token are then summed. Weights are packed per expert: gate_up [E, 2I, H] (gate rows first), down
[E, H, I]. The sort runs in torch with no host sync: the grid covers the most blocks any routing
can need and programs past the padded total return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import INTERPRETED, cast, dot, dot_precision

BLOCK_M = 16  # NOTE: tl.dot's smallest tile; a decode step gives each active expert one or two rows


@triton.jit
def _expert_gemm_kernel(
    A, B, C, Weights, Pairs, BlockExpert, Total,
    n, k, valid, stride_am, stride_be, stride_bn, stride_bk, stride_cm,
    ROWS_PER_A: tl.constexpr, SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, INTERP: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(Total):
        return
    pair = tl.load(Pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # NOTE: offsets past 2^31
    real = pair < valid  # NOTE: padding holds ``valid`` itself
    expert = tl.load(BlockExpert + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptr = A + (pair // ROWS_PER_A)[:, None] * stride_am + offs_k[None, :]
    b_ptr = B + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(k, BLOCK_K)):
        left = k - step * BLOCK_K
        a = tl.load(a_ptr, mask=real[:, None] & (offs_k[None, :] < left), other=0.0)
        b = tl.load(b_ptr, mask=(offs_k[:, None] < left) & (offs_n[None, :] < n), other=0.0)
        acc += dot(a, b, INTERP, PRECISION)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K * stride_bk
    if SCALE:
        acc = acc * tl.load(Weights + pair, mask=real, other=0.0).to(tl.float32)[:, None]
    c_ptr = C + pair[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptr, cast(acc, C.dtype.element_ty, INTERP), mask=real[:, None] & (offs_n[None, :] < n))


def align(ids: torch.Tensor, experts: int, block: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs of ``ids`` ([T, K] expert of each token's choice) sorted by expert, each
    expert's run padded to a multiple of ``block`` with ``T * K``: (pairs [P], each block's
    expert [P / block], the padded total [1]), P the most any routing needs."""
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block - 1) // block * block
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)
    chosen = flat[order]
    rank = torch.arange(flat.numel(), device=ids.device) - (counts.cumsum(0) - counts)[chosen]
    size = flat.numel() + experts * (block - 1)
    size = (size + block - 1) // block * block
    pairs = torch.full((size,), flat.numel(), dtype=torch.int32, device=ids.device)
    pairs[(ends - padded)[chosen] + rank] = order.to(torch.int32)
    starts = torch.arange(0, size, block, device=ids.device)
    block_expert = torch.searchsorted(ends, starts, right=True).clamp_(max=experts - 1).to(torch.int32)
    return pairs, block_expert, ends[-1:].to(torch.int32)


def _gemm(a, w, out, weights, routing, rows_per_a: int, scale: bool) -> None:
    pairs, block_expert, total = routing
    n, k = w.shape[1], w.shape[2]
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    block_k = min(64, max(16, triton.next_power_of_2(k)))
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    _expert_gemm_kernel[grid](
        a, w, out, weights, pairs, block_expert, total, n, k, out.shape[0],
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        ROWS_PER_A=rows_per_a, SCALE=scale, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
        INTERP=INTERPRETED, PRECISION=dot_precision(a.dtype),
    )


def fused_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor, silu_mul) -> torch.Tensor:
    """``sum_k weights[t, k] * down[e] @ silu_mul(gate_up[e] @ x[t])`` with ``e = ids[t, k]``:
    ``x`` [T, H], ``gate_up`` [E, 2I, H], ``down`` [E, H, I], ``weights`` / ``ids`` [T, K];
    ``silu_mul`` the backend's SiLU-and-multiply. [T, H] in ``x``'s dtype."""
    assert x.stride(-1) == 1 and gate_up.stride(-1) == 1 and down.stride(-1) == 1
    t, top = ids.shape
    routing = align(ids, gate_up.shape[0])
    weights = weights.reshape(-1).contiguous()
    hidden = torch.empty(t * top, gate_up.shape[1], dtype=x.dtype, device=x.device)
    _gemm(x, gate_up, hidden, weights, routing, top, scale=False)
    act = silu_mul(hidden)
    out = torch.empty(t * top, down.shape[1], dtype=x.dtype, device=x.device)
    _gemm(act, down, out, weights, routing, 1, scale=True)
    return out.view(t, top, -1).sum(1)
