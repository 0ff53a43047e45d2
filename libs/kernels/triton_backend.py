"""Attention with the Triton kernels of :mod:`libs.kernels.triton_attention` (CUDA, or the interpreter on CPU).

``prepare`` splits the step into decode rows (one new token: split-K decode
kernel) and extend rows (several: extend kernel) and builds each side's CSR
layout once; ``forward`` stores K/V and launches at most three kernels. Sliding windows
(``set_windows``): the kernels take the layer's window and read only the keys in it.

Deterministic mode (``set_deterministic``): every token of a step is a decode query over its
own keys, cut into splits of a fixed ``split_keys`` keys (:mod:`.triton_invariant`): a token's
output is the same bits in a prefill chunk, an extend over a cached prefix or a decode step,
in any batch. Tested in the Triton interpreter only, not yet on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton  # NOTE: an ImportError here becomes BackendNotAvailable in the registry

from . import triton_attention as kernels
from . import triton_invariant, triton_ops
from .base import AttentionBackend, AttentionMetadata
from .errors import BackendNotAvailable
from .ragged import RaggedLayout, ragged_layout


class TritonAttentionBackend(AttentionBackend):
    """Split-K decode and ragged causal extend over slot indices.

    ``max_splits`` bounds the decode split count; a split covers at least
    ``min_split_len`` keys (on a GPU also no more splits than fill twice its
    SMs). ``block_m`` / ``block_n`` are the query / key tile sizes (defaults
    64 / 64; 32 / 32 for float32 with D > 64; block_m 32 in the interpreter).
    ``split_keys``: the deterministic mode's split, in keys (a multiple of ``block_n``).
    """

    name = "triton"
    ops = triton_ops
    sliding_window = True
    batch_invariant = True  # set_deterministic: every token a decode query, fixed splits

    def __init__(
        self, kv, scale=None, dtype=None, *, max_splits: int = 16, min_split_len: int = 256,
        block_m: int | None = None, block_n: int | None = None, split_keys: int = 256,
    ) -> None:
        super().__init__(kv, scale, dtype)
        fp32_big = kv.dtype == torch.float32 and kv.head_dim > 64
        self.block_m = block_m or (32 if kernels.INTERPRETED or fp32_big else 64)
        self.block_n = block_n or (32 if fp32_big else 64)
        self.max_splits, self.min_split_len = max_splits, min_split_len
        self.split_keys = split_keys
        on_gpu = kv.device.type == "cuda"
        self._sms = torch.cuda.get_device_properties(kv.device).multi_processor_count if on_gpu else 0
        self._mid: tuple[torch.Tensor, torch.Tensor] | None = None
        self._step: _Step | None = None
        self._flat: torch.Tensor | None = None  # the deterministic mode's scratch

    def set_deterministic(self, on: bool) -> None:
        if on and (self.split_keys <= 0 or self.split_keys % self.block_n):
            raise ValueError(f"split_keys ({self.split_keys}) must be a positive multiple of block_n ({self.block_n})")
        super().set_deterministic(on)

    @classmethod
    def check_available(cls, device: torch.device, dtype: torch.dtype | None = None) -> None:
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise BackendNotAvailable("triton: CUDA is not available in this process")
            if kernels.INTERPRETED:
                raise BackendNotAvailable("triton: TRITON_INTERPRET=1 is set, unset it to run on CUDA")
            return
        if device.type != "cpu":
            raise BackendNotAvailable(f"triton: device {device} is not supported (cuda, or cpu in the interpreter)")
        if not kernels.INTERPRETED:
            set_now = os.environ.get("TRITON_INTERPRET") == "1"
            raise BackendNotAvailable(
                "triton on CPU runs only in the interpreter (slow; for tests): "
                + ("TRITON_INTERPRET=1 was set after the kernels were imported" if set_now
                   else "set TRITON_INTERPRET=1 before starting")
            )

    # -- per step -----------------------------------------------------------

    def prepare(self, meta: AttentionMetadata) -> None:
        if self.deterministic:
            return self._prepare_invariant(meta)
        ext = meta.extend_lens
        decode_rows, extend_rows = np.flatnonzero(ext == 1), np.flatnonzero(ext > 1)
        decode = ragged_layout(meta, decode_rows) if len(decode_rows) else None
        splits = {w: self._num_splits(decode, w) if decode else 1 for w in {None, *self.windows}}
        extend = ragged_layout(meta, extend_rows) if len(extend_rows) else None
        self._step = _Step(meta.out_slots, decode, extend, splits)

    def _prepare_invariant(self, meta: AttentionMetadata) -> None:
        """Every token one decode query (the module's note): token j of request i attends to
        the first prefix_lens[i] + j + 1 keys of its row."""
        ext = meta.extend_lens
        if not meta.num_tokens:
            self._step = _Step(meta.out_slots, None, None, {})
            return
        lay = ragged_layout(meta, np.arange(len(ext)))  # NOTE: over every request, token t is step token t
        owner = np.repeat(np.arange(len(ext)), ext)
        within = np.arange(len(owner)) - np.repeat(np.cumsum(ext) - ext, ext)
        lens = meta.prefix_lens[owner] + within + 1
        device = meta.slot_table.device
        queries = _Queries(lay, torch.from_numpy(owner).to(device, torch.int32),
                           torch.from_numpy(lens).to(device, torch.int32))
        splits = {w: triton_invariant.splits_for(min(lay.max_seq, w or lay.max_seq), self.split_keys)
                  for w in {None, *self.windows}}
        self._step = _Step(meta.out_slots, None, None, splits, queries)

    def _num_splits(self, lay: RaggedLayout, window: int | None = None) -> int:
        by_len = triton.cdiv(min(lay.max_seq, window or lay.max_seq), self.min_split_len)
        if self._sms:  # NOTE: enough programs to fill the GPU, no more
            by_len = min(by_len, max(1, triton.cdiv(2 * self._sms, lay.batch * self.kv.num_kv_heads)))
        return max(1, min(self.max_splits, by_len))

    def _scratch(self, batch: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Grow-only float32 scratch for the split partials, so steady decoding allocates nothing."""
        have = self._mid[0].shape if self._mid is not None else None
        if have is None or have[0] < batch or have[1] != heads:
            rows = max(batch, (have[0] * 5) // 4 if have else 0)
            shape = (rows, heads, self.max_splits)
            dev, dim = self.kv.device, self.kv.head_dim
            self._mid = (
                torch.empty(*shape, dim, dtype=torch.float32, device=dev),
                torch.empty(shape, dtype=torch.float32, device=dev),
            )
        return self._mid

    def _invariant_scratch(self, tokens: int, heads: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Grow-only float32 scratch for the deterministic mode's split partials, viewed as
        [n, heads, splits, D] / [n, heads, splits] (n: the queries of one launch)."""
        dim = self.kv.head_dim
        n = min(tokens, triton_invariant.queries_per_launch(heads, splits, dim))
        need = n * heads * splits * (dim + 1)
        if self._flat is None or self._flat.numel() < need:
            self._flat = torch.empty(need, dtype=torch.float32, device=self.kv.device)
        cut = n * heads * splits * dim
        return self._flat[:cut].view(n, heads, splits, dim), self._flat[cut:need].view(n, heads, splits)

    # -- per layer ----------------------------------------------------------

    def forward(self, layer, q, k, v, out=None):
        step = self._step
        assert step is not None, "prepare() must run before forward()"
        self.kv.store(layer, step.out_slots, k, v)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        k_pool, v_pool = self.kv.k[layer], self.kv.v[layer]
        window = self.window(layer)
        if (inv := step.invariant) is not None:
            splits = step.splits[window]
            mid = self._invariant_scratch(inv.lens.shape[0], q.shape[1], splits)
            triton_invariant.invariant_attention(q, k_pool, v_pool, out, inv.lay, inv.owner, inv.lens, self.scale,
                                                 self.split_keys, splits, mid, self.block_n, window or 0)
        if step.decode is not None:
            mid = self._scratch(step.decode.batch, q.shape[1])
            kernels.decode_attention(q, k_pool, v_pool, out, step.decode, self.scale, step.splits[window], mid,
                                     self.block_n, window or 0)
        if step.extend is not None:
            kernels.extend_attention(q, k_pool, v_pool, out, step.extend, self.scale, self.block_m, self.block_n,
                                     window or 0)
        return out


@dataclass(frozen=True)
class _Step:
    out_slots: torch.Tensor
    decode: RaggedLayout | None  # rows with one new token
    extend: RaggedLayout | None  # rows with several
    splits: dict  # window (None: none) -> decode splits
    invariant: _Queries | None = None  # the deterministic mode: every token a query


@dataclass(frozen=True)
class _Queries:
    """The deterministic mode's queries: step token t attends to the first ``lens[t]`` keys of
    request ``owner[t]`` of ``lay`` (every request of the step)."""

    lay: RaggedLayout
    owner: torch.Tensor  # [T] int32, device
    lens: torch.Tensor  # [T] int32, device
