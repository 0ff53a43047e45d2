"""FlashInfer's paged wrappers over our pool: each slot is a page of size 1.

The pool [slots, kv_heads, D] is FlashInfer's NHD paged cache
[num_pages, page_size=1, kv_heads, D] without a copy; the CSR layout of
:mod:`libs.kernels.ragged` gives ``kv_indptr`` / ``kv_indices`` and every last
page holds one token. A step of decode rows only goes through
``BatchDecodeWithPagedKVCacheWrapper``; a step with any extend row goes through
``BatchPrefillWithPagedKVCacheWrapper`` (causal; FlashInfer aligns the queries
to the end of each request's keys, which is exactly prefix + new tokens).

Sliding windows (``set_windows``): FlashInfer takes a window at ``plan`` (``window_left``:
the keys before the query's own it sees, so HF's window - 1; -1: all), so each distinct
window has its own wrapper, planned once a step and run by that window's layers (they share
the float workspace: layers run one after another).

NOTE: ``plan`` needs the query head count, which the pool does not know, so a
step is planned on its first ``forward`` (per window) and reused by every later layer.
"""

from __future__ import annotations

import numpy as np
import torch

import flashinfer  # NOTE: an ImportError here becomes BackendNotAvailable in the registry

from .base import AttentionBackend, AttentionMetadata
from .errors import BackendNotAvailable
from .flashinfer_plan import plan_args
from .ragged import RaggedLayout, ragged_layout

WORKSPACE_BYTES = 128 * 1024 * 1024
HALF_DTYPES = (torch.float16, torch.bfloat16)


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    sliding_window = True

    def __init__(self, kv, scale=None, dtype=None) -> None:
        super().__init__(kv, scale, dtype)
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=kv.device)
        self._prefill: dict = {}  # window -> BatchPrefillWithPagedKVCacheWrapper
        self._decoders: dict = {}  # (tensor cores, window) -> BatchDecodeWithPagedKVCacheWrapper
        self._lay: RaggedLayout | None = None
        self._slots: torch.Tensor | None = None
        self._decode_only = False
        self._planned: dict = {}  # window -> the wrapper planned for this step

    @classmethod
    def check_available(cls, device: torch.device, dtype: torch.dtype | None = None) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise BackendNotAvailable(f"flashinfer needs a CUDA device (got {device})")
        if dtype is not None and dtype not in HALF_DTYPES:
            raise BackendNotAvailable(f"flashinfer needs a float16/bfloat16 KV cache (got {dtype}); use triton")

    @property
    def ops(self):
        try:
            from . import triton_ops
        except ImportError:
            from . import ops as torch_ops

            return torch_ops
        return triton_ops

    def prepare(self, meta: AttentionMetadata) -> None:
        self._lay = ragged_layout(meta, np.arange(len(meta.extend_lens)))
        self._slots = meta.out_slots
        self._decode_only = bool((meta.extend_lens == 1).all())
        self._planned = {}

    def _plan(self, heads: int, q_dtype: torch.dtype, window: int | None):
        kv = self.kv
        args, kwargs = plan_args(self._lay, self._decode_only, heads, kv.num_kv_heads, kv.head_dim, q_dtype, kv.dtype,
                                 self.scale, window)
        if self._decode_only:
            wrapper = self._decoder(heads // kv.num_kv_heads >= 4, window)
        else:
            if window not in self._prefill:
                self._prefill[window] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            wrapper = self._prefill[window]
        wrapper.plan(*args, **kwargs)
        return wrapper

    def _decoder(self, tensor_cores: bool, window: int | None):
        if (tensor_cores, window) not in self._decoders:
            self._decoders[tensor_cores, window] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_tensor_cores=tensor_cores
            )
        return self._decoders[tensor_cores, window]

    def forward(self, layer, q, k, v, out=None):
        assert self._lay is not None, "prepare() must run before forward()"
        self.kv.store(layer, self._slots, k, v)
        window = self.window(layer)
        if window not in self._planned:
            self._planned[window] = self._plan(q.shape[1], q.dtype, window)
        planned, kv = self._planned[window], self.kv
        paged = (
            kv.k[layer].view(kv.num_slots, 1, kv.num_kv_heads, kv.head_dim),
            kv.v[layer].view(kv.num_slots, 1, kv.num_kv_heads, kv.head_dim),
        )
        if out is not None and out.is_contiguous():
            return planned.run(q.contiguous(), paged, out=out)
        result = planned.run(q.contiguous(), paged)
        return result if out is None else out.copy_(result)
