"""Batch-invariant attention for the Triton backend's deterministic mode (``set_deterministic``).

Every token of a step, prefill and extend tokens too, is a decode query over its own keys:
its request's first ``lens[t]`` keys (its prefix and the step's tokens up to it, stored
first), the latest ``window`` of them under a sliding window. A query's keys are cut into
splits of a FIXED number of keys (``split``: a constant, not a count that follows the batch
or its longest sequence) counted from its window's first key; programs (query, kv head,
split) each attend one split in blocks of ``BLOCK_N`` keys and write a partial output and its
log-sum-exp, and a second kernel merges a query's own splits one after the other in split
order. Every tile shape is a constant, and nothing a program reduces depends on another
query: a token's output is one function of its keys, the same bits in a prefill chunk, an
extend over a cached prefix or a decode step, alone or in any batch.

NOTE: import this module only after TRITON_INTERPRET is settled (see triton_attention.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ragged import RaggedLayout
from .triton_attention import _attend_keys, _store_split
from .triton_utils import INTERPRETED, cast, dot_precision

# bytes of float32 split partials one launch may use: a long step runs in several launches
SCRATCH_BYTES = 128 << 20


@triton.jit
def _split_kernel(
    Q, K, V, Owner, Lens, KvIndptr, KvIndices, MidO, MidLse,
    scale, window, first_query,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INTERP: tl.constexpr, PRECISION: tl.constexpr,
):
    i, kh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = first_query + i  # the query's token in the step
    b = tl.load(Owner + t)
    seq = tl.load(Lens + t)
    kv_start = tl.load(KvIndptr + b)
    first = tl.where(window > 0, tl.maximum(seq - window, 0), 0)  # the window's first key
    lo = first + sp * SPLIT
    hi = tl.minimum(lo + SPLIT, seq)  # NOTE: lo >= seq: a split past this query's keys, never merged

    o, lse = _attend_keys(
        Q, K, V, KvIndices, t, kv_start, lo, hi, kh, scale,
        stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
        GROUP, HEAD_DIM, BLOCK_H, BLOCK_N, BLOCK_D, INTERP, PRECISION,
    )
    _store_split(MidO, MidLse, o, lse, i, sp, kh, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                 GROUP, HEAD_DIM, BLOCK_H, BLOCK_D)


@triton.jit
def _merge_kernel(
    MidO, MidLse, Out, Lens, window, first_query,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, BLOCK_D: tl.constexpr, INTERP: tl.constexpr,
):
    i, h = tl.program_id(0), tl.program_id(1)
    t = first_query + i
    seq = tl.load(Lens + t)
    first = tl.where(window > 0, tl.maximum(seq - window, 0), 0)
    own = tl.cdiv(seq - first, SPLIT)  # this query's splits, each holding at least one key
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    # NOTE: one split after the other, in split order: the merge's arithmetic is fixed by the
    # query's key count alone (a tree over a padded block of splits would follow the grid's)
    for sp in range(0, own):
        lse = tl.load(MidLse + i * stride_lb + h * stride_lh + sp + tl.arange(0, 1))
        o = tl.load(MidO + i * stride_mb + h * stride_mh + sp * stride_ms + offs_d, mask=mask_d, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        acc = acc * alpha + w * o
        l = l * alpha + w
        m = m_new
    tl.store(Out + t * stride_ot + h * stride_oh + offs_d, cast(acc / l, Out.dtype.element_ty, INTERP), mask=mask_d)


def splits_for(keys: int, split: int) -> int:
    """Splits of ``split`` keys that cover ``keys`` (at least one)."""
    return max(1, triton.cdiv(keys, split))


def queries_per_launch(heads: int, splits: int, dim: int) -> int:
    """Queries whose split partials fit SCRATCH_BYTES."""
    return max(1, SCRATCH_BYTES // (4 * heads * splits * (dim + 1)))


def invariant_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, out: torch.Tensor,
    lay: RaggedLayout, owner: torch.Tensor, lens: torch.Tensor, scale: float, split: int, splits: int,
    mid: tuple[torch.Tensor, torch.Tensor], block_n: int, window: int = 0,
) -> None:
    """Attention of every token ``t`` of the step (``q`` row t) over the first ``lens[t]`` keys
    of request ``owner[t]`` of ``lay`` (the latest ``window`` of them where ``window`` > 0), into
    ``out`` row t. ``splits``: the most any query has (splits_for its keys); ``mid``: float32
    scratch [n, heads, >= splits, D] and [n, heads, >= splits]; queries go in launches of n."""
    assert q.stride(-1) == 1 and out.stride(-1) == 1
    tokens, (heads, dim) = lens.shape[0], q.shape[1:]  # NOTE: rows of q past the step's (padding) untouched
    kv_heads = k_pool.shape[1]
    group = heads // kv_heads
    mid_o, mid_lse = mid
    block_d = triton.next_power_of_2(dim)
    strides = (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    for first in range(0, tokens, mid_o.shape[0]):
        n = min(mid_o.shape[0], tokens - first)
        _split_kernel[(n, kv_heads, splits)](
            q, k_pool, v_pool, owner, lens, lay.kv_indptr, lay.kv_indices, mid_o, mid_lse,
            scale, window, first,
            q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            *strides,
            GROUP=group, HEAD_DIM=dim, SPLIT=split, BLOCK_H=max(16, triton.next_power_of_2(group)),
            BLOCK_N=block_n, BLOCK_D=block_d, INTERP=INTERPRETED, PRECISION=dot_precision(k_pool.dtype),
        )
        _merge_kernel[(n, heads)](
            mid_o, mid_lse, out, lens, window, first, *strides, out.stride(0), out.stride(1),
            HEAD_DIM=dim, SPLIT=split, BLOCK_D=block_d, INTERP=INTERPRETED,
        )
