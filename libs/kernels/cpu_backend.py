"""The CPU backend: the torch backend with decode read in place from the pool.

Decode rows go to the C++ kernel in ``csrc/paged_decode.cpp`` (built on first
use, see :mod:`.cpu_ext`), which reads each request's K/V rows straight from
the pool by slot, so no gathered copy is written and read back (the torch
backend's gather makes paged decode ~2.5x attention over contiguous caches).
Extend rows and K/V stores are the torch backend's.
"""

from __future__ import annotations

import numpy as np
import torch

from . import cpu_ext
from .base import AttentionMetadata
from .errors import BackendNotAvailable
from .torch_backend import TorchAttentionBackend


class _Decode:
    """One step's decode rows, as the kernel takes them."""

    def __init__(self, meta: AttentionMetadata, idx: np.ndarray, starts: np.ndarray, every: bool) -> None:
        self.tokens = None if every else torch.from_numpy(starts[idx])
        self.rows = (meta.rows if every else meta.rows[torch.from_numpy(idx)]).contiguous()
        self.lens = torch.from_numpy(np.ascontiguousarray(meta.seq_lens[idx], dtype=np.int64))
        self.table = meta.slot_table.contiguous()


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"

    def __init__(self, kv, scale=None) -> None:
        super().__init__(kv, scale)
        self._kernel = cpu_ext.load()
        self._cpu_decode: _Decode | None = None

    @classmethod
    def check_available(cls, device: torch.device, dtype: torch.dtype | None = None) -> None:
        if torch.device(device).type != "cpu":
            raise BackendNotAvailable("the cpu attention backend runs on the CPU only")
        if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise BackendNotAvailable(f"the cpu attention backend does not support {dtype}")
        cpu_ext.load()

    def prepare(self, meta: AttentionMetadata) -> None:
        ext = meta.extend_lens
        decode_rows = np.flatnonzero(ext == 1)
        if len(decode_rows) == 0:
            self._cpu_decode = None
            return super().prepare(meta)
        starts = np.cumsum(ext) - ext
        self._cpu_decode = _Decode(meta, decode_rows, starts, len(decode_rows) == len(ext))
        self._check_slots(self._cpu_decode)
        self._slots = meta.out_slots
        self._decode = None  # the gather plan is not needed
        self._extends = [
            self._plan_extend(meta, int(i), int(starts[i]), int(ext[i]), int(meta.seq_lens[i]))
            for i in np.flatnonzero(ext > 1)  # NOTE: a loop over prefill requests only
        ]

    def _check_slots(self, dec: _Decode) -> None:
        """The kernel reads slots unchecked: make sure, once per step, that each is in the pool."""
        width = int(dec.lens.max())
        used = dec.table[dec.rows, :width]
        valid = torch.arange(width) < dec.lens[:, None]
        bad = valid & ((used < 0) | (used >= self.kv.num_slots))
        if bool(bad.any()):
            raise ValueError("slot table holds slots outside the KV pool")

    def forward(self, layer, q, k, v, out=None):
        dec = self._cpu_decode
        if dec is None:
            return super().forward(layer, q, k, v, out)
        self.kv.store(layer, self._slots, k, v)
        if dec.tokens is None and not self._extends:
            result = self._attend(layer, q, dec)
            if out is None:
                return result
            out.copy_(result)
            return out
        if out is None:
            out = torch.empty_like(q)
        if dec.tokens is None:
            out.copy_(self._attend(layer, q, dec))
        else:
            out.index_copy_(0, dec.tokens, self._attend(layer, q.index_select(0, dec.tokens), dec))
        for ext in self._extends:
            out[ext.start : ext.start + ext.length] = self._attend_extend(layer, q, k, v, ext)
        return out

    def _attend(self, layer: int, q: torch.Tensor, dec: _Decode) -> torch.Tensor:
        result = self._kernel.paged_decode(q.contiguous(), self.kv.k[layer], self.kv.v[layer],
                                           dec.table, dec.rows, dec.lens, self.scale)
        return result if q.dtype == torch.float32 else result.to(q.dtype)
