"""Triton attention kernels that read K/V through slot indices (the paged layout, any page size).

Decode (one query per request) is split-K: programs (request, kv head, split)
each attend the query heads of one GQA group over one slice of the context
and write a partial output plus its log-sum-exp; a second kernel merges the
splits. Extend (several new tokens per request) runs programs (request, head,
block of new tokens) over the cached prefix and the new tokens, causally.

``window`` > 0 (a sliding window): a query sees only its ``window`` latest keys, its own
included (HF's mask); decode splits only those keys, an extend block starts at its first
query's first key. 0: every key.

NOTE: import this module only after TRITON_INTERPRET is settled: ``triton.jit``
reads it when the kernels are defined. Float32 dots use IEEE precision, not TF32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ragged import RaggedLayout
from .triton_utils import INTERPRETED, cast, dot, dot_precision


@triton.jit
def _attend_keys(
    Q, K, V, KvIndices, q_row, kv_start, lo, hi, kh, scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INTERP: tl.constexpr, PRECISION: tl.constexpr,
):
    """One GQA group's query heads (row ``q_row`` of Q, kv head ``kh``) over keys lo..hi-1 of
    a request whose slots start at ``kv_start``, in blocks of BLOCK_N keys: the normalised
    partial output and its log-sum-exp (-inf for an empty split: it weighs nothing in a merge)."""
    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g, mask_d = offs_g < GROUP, offs_d < HEAD_DIM
    heads = kh * GROUP + offs_g
    q = tl.load(
        Q + q_row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_g[:, None] & mask_d[None, :], other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(KvIndices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), INTERP, PRECISION) * scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slots[:, None] * stride_vs + kh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(cast(p, v.dtype, INTERP), v, INTERP, PRECISION)
        m_i = m_new
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.log(l_safe), float("-inf"))
    return acc / l_safe[:, None], lse


@triton.jit
def _store_split(
    MidO, MidLse, o, lse, row, sp, kh, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Write one split's partial output and log-sum-exp (``_attend_keys``) at ``row``."""
    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g, mask_d = offs_g < GROUP, offs_d < HEAD_DIM
    heads = kh * GROUP + offs_g
    base = row * stride_mb + heads * stride_mh + sp * stride_ms
    tl.store(MidO + base[:, None] + offs_d[None, :], o, mask=mask_g[:, None] & mask_d[None, :])
    tl.store(MidLse + row * stride_lb + heads * stride_lh + sp, lse, mask=mask_g)


@triton.jit
def _decode_split_kernel(
    Q, K, V, Tok, KvIndptr, KvIndices, MidO, MidLse,
    scale, num_splits, window,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INTERP: tl.constexpr, PRECISION: tl.constexpr,
):
    b, kh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_start = tl.load(KvIndptr + b)
    seq = tl.load(KvIndptr + b + 1) - kv_start
    first = tl.where(window > 0, tl.maximum(seq - window, 0), 0)  # the window's first key
    split_len = tl.cdiv(seq - first, num_splits)
    lo = first + sp * split_len
    hi = tl.minimum(lo + split_len, seq)

    tok = tl.load(Tok + b)
    o, lse = _attend_keys(
        Q, K, V, KvIndices, tok, kv_start, lo, hi, kh, scale,
        stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
        GROUP, HEAD_DIM, BLOCK_H, BLOCK_N, BLOCK_D, INTERP, PRECISION,
    )
    _store_split(MidO, MidLse, o, lse, b, sp, kh, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                 GROUP, HEAD_DIM, BLOCK_H, BLOCK_D)


@triton.jit
def _decode_merge_kernel(
    MidO, MidLse, Out, Tok, num_splits,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, INTERP: tl.constexpr,
):
    b, h = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s, mask_d = offs_s < num_splits, offs_d < HEAD_DIM
    row = b * stride_mb + h * stride_mh
    lse = tl.load(MidLse + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))
    o = tl.load(
        MidO + row + offs_s[:, None] * stride_ms + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0
    )
    res = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tok = tl.load(Tok + b)
    tl.store(Out + tok * stride_ot + h * stride_oh + offs_d, cast(res, Out.dtype.element_ty, INTERP), mask=mask_d)


@triton.jit
def _extend_kernel(
    Q, K, V, Out, Tok, QoIndptr, KvIndptr, KvIndices, PrefixLens,
    scale, window,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INTERP: tl.constexpr, PRECISION: tl.constexpr,
):
    b, h, mb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    qo_start = tl.load(QoIndptr + b)
    n_new = tl.load(QoIndptr + b + 1) - qo_start
    kv_start = tl.load(KvIndptr + b)
    prefix = tl.load(PrefixLens + b)
    kh = h // GROUP

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m, mask_d = offs_m < n_new, offs_d < HEAD_DIM
    toks = tl.load(Tok + qo_start + offs_m, mask=mask_m, other=0)
    q = tl.load(
        Q + toks[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :], other=0.0
    )
    q_pos = prefix + offs_m  # absolute position of each query
    q_first = tl.where(window > 0, q_pos + 1 - window, 0)  # and its first key

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # keys 0 .. last query of this block; the block's rows past n_new see a subset and are not stored
    hi = tl.minimum(prefix + n_new, prefix + (mb + 1) * BLOCK_M)
    hi = tl.where(mb * BLOCK_M < n_new, hi, 0)  # a block past this request's tokens does nothing
    lo = tl.where(window > 0, tl.maximum(prefix + mb * BLOCK_M + 1 - window, 0), 0)  # the block's first query's
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(KvIndices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(K + slots[:, None] * stride_ks + kh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), INTERP, PRECISION) * scale
        seen = (offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] >= q_first[:, None])
        s = tl.where(mask_n[None, :] & seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # NOTE: under a window a row may see no key of a block yet (m_new -inf): subtract 0 then
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slots[:, None] * stride_vs + kh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(cast(p, v.dtype, INTERP), v, INTERP, PRECISION)
        m_i = m_new
    # NOTE: a query's own key is visible to it, so l_i > 0 on every stored row
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        Out + toks[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        cast(out, Out.dtype.element_ty, INTERP), mask=mask_m[:, None] & mask_d[None, :],
    )


def _dot_args(dtype: torch.dtype) -> dict:
    return {"INTERP": INTERPRETED, "PRECISION": dot_precision(dtype)}


def decode_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, out: torch.Tensor,
    lay: RaggedLayout, scale: float, num_splits: int, mid: tuple[torch.Tensor, torch.Tensor],
    block_n: int, window: int = 0,
) -> None:
    """Split-K decode of requests ``lay`` (one query each) into ``out`` rows ``lay.tokens``
    (``window`` > 0: over each request's ``window`` latest keys only).

    ``mid`` holds float32 scratch: [B, heads, max_splits, D] and [B, heads, max_splits]
    (``max_splits >= num_splits``).
    """
    assert q.stride(-1) == 1 and out.stride(-1) == 1
    batch, heads, dim = lay.batch, q.shape[1], q.shape[2]
    kv_heads = k_pool.shape[1]
    group = heads // kv_heads
    mid_o, mid_lse = mid
    block_d = triton.next_power_of_2(dim)
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_pool, v_pool, lay.tokens, lay.kv_indptr, lay.kv_indices, mid_o, mid_lse,
        scale, num_splits, window,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, HEAD_DIM=dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, BLOCK_D=block_d, **_dot_args(k_pool.dtype),
    )
    _decode_merge_kernel[(batch, heads)](
        mid_o, mid_lse, out, lay.tokens, num_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=dim, BLOCK_S=triton.next_power_of_2(mid_o.shape[2]), BLOCK_D=block_d, INTERP=INTERPRETED,
    )


def extend_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, out: torch.Tensor,
    lay: RaggedLayout, scale: float, block_m: int, block_n: int, window: int = 0,
) -> None:
    """Causal attention of the new tokens of requests ``lay`` over prefix + themselves, into ``out``
    (``window`` > 0: each over its ``window`` latest keys only)."""
    assert q.stride(-1) == 1 and out.stride(-1) == 1
    heads, dim = q.shape[1], q.shape[2]
    group = heads // k_pool.shape[1]
    grid = (lay.batch, heads, triton.cdiv(lay.max_extend, block_m))
    _extend_kernel[grid](
        q, k_pool, v_pool, out, lay.tokens, lay.qo_indptr, lay.kv_indptr, lay.kv_indices, lay.prefix_lens,
        scale, window,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(dim),
        **_dot_args(k_pool.dtype),
    )
