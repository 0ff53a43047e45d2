"""Portable attention in plain torch: the reference backend (CPU or any device).

Decode rows (one new token) are handled together: their slot rows are gathered
once per step into a head-major index, so each layer does one ``index_select``
per pool and two batched matmuls. Extend rows (several new tokens) go through
``scaled_dot_product_attention`` one request at a time. Sliding windows (``set_windows``) are
one more mask per distinct window, built per step like the causal one; an extend row's keys
then start at its first query's window (the keys no query sees are not read).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata


@dataclass
class _DecodePlan:
    tokens: torch.Tensor | None  # [Bd] positions in the token axis; None: every token
    gather_idx: torch.Tensor  # [Bd * kv_heads * L] rows of the pool viewed as [S * kv_heads, D]
    masks: dict  # window (None: none) -> [Bd, 1, 1, L] additive, float32
    k_buf: torch.Tensor  # [Bd * kv_heads * L, D] reused by every layer
    v_buf: torch.Tensor
    batch: int
    max_len: int


@dataclass
class _Keys:
    """The keys an extend row's queries attend under one window: positions ``first`` .. seq_len - 1."""

    slots: torch.Tensor | None  # [seq_len - first] when a cached prefix exists; None: the new tokens' own K/V
    mask: torch.Tensor | None  # [length, seq_len - first] bool, or None: plain causal


@dataclass
class _ExtendPlan:
    start: int
    length: int
    keys: dict  # window (None: none) -> _Keys


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    mixed_kv = True  # a bf16 pool's rows are widened where they are gathered
    sliding_window = True

    def __init__(self, kv, scale=None, dtype=None) -> None:
        super().__init__(kv, scale, dtype)
        self._slots: torch.Tensor | None = None
        self._decode: _DecodePlan | None = None
        self._extends: list[_ExtendPlan] = []
        self._bufs: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- per step -----------------------------------------------------------

    def prepare(self, meta: AttentionMetadata) -> None:
        ext, seq = meta.extend_lens, meta.seq_lens
        starts = np.cumsum(ext) - ext
        decode_rows = np.flatnonzero(ext == 1)
        self._slots = meta.out_slots
        self._decode = self._plan_decode(meta, decode_rows, starts) if len(decode_rows) else None
        self._extends = [
            self._plan_extend(meta, int(i), int(starts[i]), int(ext[i]), int(seq[i]))
            for i in np.flatnonzero(ext > 1)  # NOTE: a loop over prefill requests only
        ]

    def _plan_decode(self, meta: AttentionMetadata, idx: np.ndarray, starts: np.ndarray) -> _DecodePlan:
        device, heads = self.kv.device, self.kv.num_kv_heads
        every = len(idx) == len(meta.extend_lens)
        tokens = None if every else torch.from_numpy(starts[idx]).to(device)
        rows = meta.rows if every else meta.rows[torch.from_numpy(idx).to(device)]
        lens_host = meta.seq_lens[idx]
        max_len = int(lens_host.max())
        lens = torch.from_numpy(lens_host).to(device)
        table = meta.slot_table[rows, :max_len]
        valid = torch.arange(max_len, device=device) < lens[:, None]
        # NOTE: padding points at the row's own first slot (always written), then is masked
        slots = torch.where(valid, table, table[:, :1])
        head = torch.arange(heads, device=device)
        gather_idx = (slots[:, None, :] * heads + head[None, :, None]).reshape(-1)
        masks = {}
        for w in {None, *self.windows}:
            # NOTE: the query sits at position len - 1 and sees keys past len - 1 - window
            seen = valid if w is None else valid & (torch.arange(max_len, device=device) >= lens[:, None] - w)
            masks[w] = torch.zeros(len(idx), 1, 1, max_len, device=device)
            masks[w].masked_fill_(~seen[:, None, None, :], float("-inf"))
        k_buf, v_buf = self._gather_buffers(gather_idx.numel())
        return _DecodePlan(tokens, gather_idx, masks, k_buf, v_buf, len(idx), max_len)

    def _gather_buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of grow-only buffers, so steady decoding allocates nothing per step."""
        if self._bufs is None or self._bufs[0].shape[0] < rows:
            old = self._bufs[0].shape[0] if self._bufs else 0
            shape = (max(rows, old + old // 4), self.kv.head_dim)
            make = lambda: torch.empty(shape, dtype=self.kv.dtype, device=self.kv.device)  # noqa: E731
            self._bufs = (make(), make())
        return self._bufs[0][:rows], self._bufs[1][:rows]

    def _plan_extend(self, meta: AttentionMetadata, i: int, start: int, n: int, seq: int) -> _ExtendPlan:
        prefix, device = seq - n, self.kv.device
        q_pos = torch.arange(prefix, seq, device=device)[:, None]
        keys = {}
        for w in {None, *self.windows}:
            # query j sits at absolute position prefix + j and sees keys 0 .. prefix + j (the last
            # ``w`` of them under a window): the row's keys start at its first query's first key
            first = max(0, prefix + 1 - w) if w else 0
            slots = meta.slot_table[meta.rows[i], first:seq] if prefix else None
            k_pos = torch.arange(first, seq, device=device)[None, :]
            plain = not prefix and (w is None or w >= n)  # NOTE: then causal alone is the mask
            mask = None if plain else (k_pos <= q_pos) & (k_pos > q_pos - (w or seq + 1))
            keys[w] = _Keys(slots, mask)
        return _ExtendPlan(start, n, keys)

    # -- per layer ----------------------------------------------------------

    def forward(self, layer, q, k, v, out=None):
        assert self._slots is not None, "prepare() must run before forward()"
        self.kv.store(layer, self._slots, k, v)
        plan = self._decode
        if plan is not None and plan.tokens is None and out is None:
            return self._attend_decode(layer, q, plan)
        if out is None:
            out = torch.empty_like(q)
        if plan is not None:
            if plan.tokens is None:
                out.copy_(self._attend_decode(layer, q, plan))
            else:
                out.index_copy_(0, plan.tokens, self._attend_decode(layer, q.index_select(0, plan.tokens), plan))
        for ext in self._extends:
            out[ext.start : ext.start + ext.length] = self._attend_extend(layer, q, k, v, ext)
        return out

    def _attend_decode(self, layer: int, q: torch.Tensor, plan: _DecodePlan) -> torch.Tensor:
        heads, dim = self.kv.num_kv_heads, self.kv.head_dim
        b, n = plan.batch, plan.max_len
        torch.index_select(self.kv.k[layer].view(-1, dim), 0, plan.gather_idx, out=plan.k_buf)
        torch.index_select(self.kv.v[layer].view(-1, dim), 0, plan.gather_idx, out=plan.v_buf)
        keys = plan.k_buf.view(b, heads, n, dim)
        values = plan.v_buf.view(b, heads, n, dim)
        # GQA: query head h uses kv head h // group, so fold the group into the query axis
        qg = q.reshape(b, heads, -1, dim)
        if keys.dtype != torch.float32:  # NOTE: logits and sums in float32, as the fused kernels do
            qg, keys, values = qg.float(), keys.float(), values.float()
        scores = torch.matmul(qg, keys.transpose(-1, -2))
        scores.mul_(self.scale).add_(plan.masks[self.window(layer)])
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, values).reshape(b, -1, dim).to(q.dtype)

    def _attend_extend(self, layer, q, k, v, ext: _ExtendPlan) -> torch.Tensor:
        span = slice(ext.start, ext.start + ext.length)
        qi = q[span].transpose(0, 1)[None]
        keys = ext.keys[self.window(layer)]
        if keys.slots is None:  # NOTE: as the pool holds them, so a cached prefix reads the same values
            ki, vi = (x[span] if x.dtype == self.kv.dtype else x[span].to(self.kv.dtype).to(x.dtype) for x in (k, v))
        else:
            ki = self.kv.k[layer].index_select(0, keys.slots).to(q.dtype)
            vi = self.kv.v[layer].index_select(0, keys.slots).to(q.dtype)
        o = F.scaled_dot_product_attention(
            qi, ki.transpose(0, 1)[None], vi.transpose(0, 1)[None],
            attn_mask=keys.mask, is_causal=keys.mask is None, scale=self.scale, enable_gqa=True,
        )
        return o[0].transpose(0, 1)
