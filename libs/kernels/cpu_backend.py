"""The CPU backend: decode and extend attention in C++, read in place from the paged pool.

Both kernels (``csrc/decode.cpp``, ``csrc/extend.cpp``; built once, see
:mod:`.cpu_ext`) read each request's K/V rows straight from the pool by slot and
write their rows of the output, so a step copies no K/V beyond the store of its
new tokens. Decode: blocked online softmax, every query head of a kv head per K/V
row (GQA), fp32 accumulation. Extend: query tiles x key blocks, bf16 products on
oneDNN's brgemm (AMX), else on AVX512-BF16's dot instruction; fp32 queries on AVX2 on
register-blocked products (``csrc/extend_avx2.h``: 1.4-1.8x torch's SDPA on 2 Zen 3 cores,
290-1,024-token prompts). NOTE: elsewhere (fp32 on AVX-512, a CPU with neither) extend rows
go to torch's SDPA (the torch backend's path), which beat the C++ fp32 loops
(``cpp_extend = True`` with ``native_bf16 = False`` runs those). ``cpu_v1`` (the first kernel, torch for extend)
stays as the benchmarks' baseline. ``ops``: the elementwise kernels in C++
(:mod:`.cpu_ops`). Sliding windows (``set_windows``): both kernels take the layer's window
and start each query's keys at its window's first, so a window saves the keys it hides
(SDPA's extend rows likewise, :mod:`.torch_backend`).

Deterministic mode (``set_deterministic``): every token of a step, prefill and extend tokens
too, is a query of the decode kernel over its own keys (its prefix and the step's tokens up
to it, stored first): a query's arithmetic is then one function of its keys, the same bits
in a prefill chunk, an extend over a cached prefix or a decode step, in any batch (the
kernel walks a query's keys in order, in blocks of 64, on one thread; nothing it reduces
depends on the other queries).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import cpu_ext, cpu_ops
from .base import AttentionMetadata, DecodeStep
from .torch_backend import TorchAttentionBackend

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass(frozen=True)
class _Rows:
    """One kind of row (decode or extend) of a step, as its kernel takes them."""

    rows: torch.Tensor  # [B] rows of the slot table
    prefix: torch.Tensor  # [B] cached tokens
    extend: torch.Tensor  # [B] new tokens
    starts: torch.Tensor  # [B] first token in the step's token axis

    @classmethod
    def select(cls, meta: AttentionMetadata, idx: np.ndarray, starts: np.ndarray) -> _Rows | None:
        if not len(idx):
            return None
        every = len(idx) == len(meta.extend_lens)
        rows = meta.rows if every else meta.rows[torch.from_numpy(idx)]
        host = lambda a: torch.from_numpy(np.ascontiguousarray(a[idx], dtype=np.int64))  # noqa: E731
        return cls(rows.contiguous(), host(meta.prefix_lens), host(meta.extend_lens), host(starts))


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"
    ops = cpu_ops
    sliding_window = True
    batch_invariant = True  # set_deterministic: every token through the decode kernel

    def __init__(self, kv, scale=None, dtype=None) -> None:
        super().__init__(kv, scale, dtype)
        self._kernel = cpu_ext.load()
        self._table = _EMPTY
        self._dec: _Rows | None = None
        self._ext: _Rows | None = None
        self._decode_tokens = _EMPTY  # empty: request b's token is token b
        self._decode_lens = _EMPTY
        # extend in C++ where its products run well: bf16 natively (AMX, AVX512-BF16), fp32 queries
        # register-blocked on AVX2 (over an fp32 or a bf16 pool); else torch's SDPA (the NOTE above)
        native = kv.dtype == self.dtype == torch.bfloat16 and bool(self._kernel.bf16_extend())
        self.cpp_extend = native or (self.dtype == torch.float32 and bool(self._kernel.fp32_extend()))
        self.native_bf16 = True  # False: the C++ extend's fp32 loops even where bf16 products would run

    @classmethod
    def check_available(cls, device: torch.device, dtype: torch.dtype | None = None) -> None:
        cpu_ext.check_available(cls.name, device, dtype)

    def prepare(self, meta: AttentionMetadata) -> None:
        if self.deterministic:
            return self._prepare_invariant(meta)
        ext, seq = meta.extend_lens, meta.seq_lens
        starts = np.cumsum(ext) - ext
        self._slots = meta.out_slots
        self._table = meta.slot_table.contiguous()
        self._dec = _Rows.select(meta, np.flatnonzero(ext == 1), starts)
        extend_rows = np.flatnonzero(ext > 1)
        self._ext = _Rows.select(meta, extend_rows, starts) if self.cpp_extend else None
        self._extends = [] if self.cpp_extend else [
            self._plan_extend(meta, int(i), int(starts[i]), int(ext[i]), int(seq[i])) for i in extend_rows
        ]  # NOTE: a loop over prefill requests only
        every = self._dec is not None and len(self._dec.rows) == len(ext)
        self._decode_tokens = _EMPTY if every or self._dec is None else self._dec.starts
        self._decode_lens = _EMPTY if self._dec is None else self._dec.prefix + 1
        self._check_slots(meta)

    def _prepare_invariant(self, meta: AttentionMetadata) -> None:
        """Every token one decode query (the module's note): token j of request i attends to
        the first prefix_lens[i] + j + 1 keys of its row."""
        ext = meta.extend_lens
        owner = np.repeat(np.arange(len(ext)), ext)
        within = np.arange(len(owner)) - np.repeat(np.cumsum(ext) - ext, ext)
        lens = meta.prefix_lens[owner] + within + 1
        self._slots = meta.out_slots
        self._table = meta.slot_table.contiguous()
        rows = meta.rows.index_select(0, torch.from_numpy(owner).to(meta.rows.device)) if len(owner) else _EMPTY
        self._dec = _Rows(rows.contiguous(), _EMPTY, _EMPTY, _EMPTY) if len(owner) else None
        self._decode_lens = torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int64))
        self._decode_tokens = _EMPTY  # NOTE: query b is token b
        self._ext, self._extends = None, []
        self._check_slots(meta)

    def _check_slots(self, meta: AttentionMetadata) -> None:
        """The kernels read slots unchecked: make sure, once per step, that each is in the pool."""
        seq = torch.from_numpy(np.ascontiguousarray(meta.seq_lens, dtype=np.int64))
        if not len(seq):
            return
        width = int(seq.max())
        if width > self._table.shape[1]:
            raise ValueError("a request is longer than the slot table")
        used = self._table[meta.rows, :width]
        valid = torch.arange(width) < seq[:, None]
        if bool((valid & ((used < 0) | (used >= self.kv.num_slots))).any()):
            raise ValueError("slot table holds slots outside the KV pool")

    def decode_step(self) -> DecodeStep | None:
        # NOTE: the C++ layer loop attends to every key: windowed layers keep the Python loop
        if self._dec is None or self._ext is not None or self._extends or any(self.windows):
            return None
        d = self._dec
        return DecodeStep(self._slots, self._table, d.rows, self._decode_lens, self._decode_tokens, self.scale)

    def forward(self, layer, q, k, v, out=None):
        assert self._slots is not None, "prepare() must run before forward()"
        kp, vp = self.kv.k[layer], self.kv.v[layer]
        self._kernel.store_kv_(kp, vp, self._slots, k, v)  # NOTE: the pool's store in one call, not four torch ops
        q = q.contiguous()
        target = out if out is not None and out.is_contiguous() else torch.empty_like(q)
        window = self.window(layer) or 0  # NOTE: the kernels' 0 is no window
        if (d := self._dec) is not None:
            self._kernel.paged_decode(q, kp, vp, self._table, d.rows, self._decode_lens, self._decode_tokens,
                                      self.scale, target, window)
        if (e := self._ext) is not None:
            self._kernel.paged_extend(q, kp, vp, self._table, e.rows, e.prefix, e.extend, e.starts, self.scale, target,
                                      self.native_bf16, window)
        for plan in self._extends:
            target[plan.start : plan.start + plan.length] = self._attend_extend(layer, q, k, v, plan)
        if out is not None and target is not out:
            out.copy_(target)
            return out
        return target
