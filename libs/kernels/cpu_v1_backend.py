"""The first CPU backend (``cpu_v1``), kept as the baseline the benchmarks compare
the ``cpu`` backend against: the torch backend with decode read in place from the pool.

Decode rows go to the C++ kernel in ``csrc/decode_v1.cpp`` (built on first
use, see :mod:`.cpu_ext`), which reads each request's K/V rows straight from
the pool by slot, so no gathered copy is written and read back (the torch
backend's gather makes paged decode ~2.5x attention over contiguous caches).
Extend rows, K/V stores and the per-layer routing are the torch backend's: this
class only plans and runs the decode rows differently.
"""

from __future__ import annotations

import numpy as np
import torch

from . import cpu_ext
from .base import AttentionMetadata
from .torch_backend import TorchAttentionBackend


class _Decode:
    """One step's decode rows, as the kernel takes them."""

    def __init__(self, meta: AttentionMetadata, idx: np.ndarray, starts: np.ndarray) -> None:
        every = len(idx) == len(meta.extend_lens)
        self.tokens = None if every else torch.from_numpy(starts[idx])  # as the torch plan's
        self.rows = (meta.rows if every else meta.rows[torch.from_numpy(idx)]).contiguous()
        self.lens = torch.from_numpy(np.ascontiguousarray(meta.seq_lens[idx], dtype=np.int64))
        self.table = meta.slot_table.contiguous()


class CpuV1AttentionBackend(TorchAttentionBackend):
    name = "cpu_v1"
    mixed_kv = False
    sliding_window = False  # NOTE: the C++ kernels attend to every key: the torch backend has windows

    def __init__(self, kv, scale=None, dtype=None) -> None:
        super().__init__(kv, scale, dtype)
        self._kernel = cpu_ext.load()

    @classmethod
    def check_available(cls, device: torch.device, dtype: torch.dtype | None = None) -> None:
        cpu_ext.check_available(cls.name, device, dtype)

    def _plan_decode(self, meta: AttentionMetadata, idx: np.ndarray, starts: np.ndarray) -> _Decode:
        dec = _Decode(meta, idx, starts)
        self._check_slots(dec)
        return dec

    def _check_slots(self, dec: _Decode) -> None:
        """The kernel reads slots unchecked: make sure, once per step, that each is in the pool."""
        width = int(dec.lens.max())
        used = dec.table[dec.rows, :width]
        valid = torch.arange(width) < dec.lens[:, None]
        bad = valid & ((used < 0) | (used >= self.kv.num_slots))
        if bool(bad.any()):
            raise ValueError("slot table holds slots outside the KV pool")

    def _attend_decode(self, layer: int, q: torch.Tensor, plan: _Decode) -> torch.Tensor:
        result = self._kernel.paged_decode_v1(q.contiguous(), self.kv.k[layer], self.kv.v[layer],
                                           plan.table, plan.rows, plan.lens, self.scale)
        return result if q.dtype == torch.float32 else result.to(q.dtype)
