"""FlashInfer's paged wrappers over our pool: each slot is a page of size 1.

The pool [slots, kv_heads, D] is FlashInfer's NHD paged cache
[num_pages, page_size=1, kv_heads, D] without a copy; the CSR layout of
:mod:`libs.kernels.ragged` gives ``kv_indptr`` / ``kv_indices`` and every last
page holds one token. A step of decode rows only goes through
``BatchDecodeWithPagedKVCacheWrapper``; a step with any extend row goes through
``BatchPrefillWithPagedKVCacheWrapper`` (causal; FlashInfer aligns the queries
to the end of each request's keys, which is exactly prefix + new tokens).

NOTE: ``plan`` needs the query head count, which the pool does not know, so a
step is planned on its first ``forward`` and reused by every later layer.
"""

from __future__ import annotations

import numpy as np
import torch

import flashinfer  # NOTE: an ImportError here becomes BackendNotAvailable in the registry

from .base import AttentionBackend, AttentionMetadata
from .errors import BackendNotAvailable
from .ragged import RaggedLayout, ragged_layout

WORKSPACE_BYTES = 128 * 1024 * 1024
HALF_DTYPES = (torch.float16, torch.bfloat16)


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, kv, scale=None, dtype=None) -> None:
        super().__init__(kv, scale, dtype)
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=kv.device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._decoders: dict[bool, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self._lay: RaggedLayout | None = None
        self._slots: torch.Tensor | None = None
        self._decode_only = False
        self._planned: tuple | None = None  # the wrapper .run of this step, once planned

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
        self._planned = None

    def _plan(self, heads: int, q_dtype: torch.dtype):
        lay, kv = self._lay, self.kv
        host = lambda a: torch.from_numpy(a.astype(np.int32))  # noqa: E731  (plan copies indptrs to the host anyway)
        indices = lay.kv_indices.to(torch.int32)
        last = torch.ones(lay.batch, dtype=torch.int32)
        common = dict(q_data_type=q_dtype, kv_data_type=kv.dtype, sm_scale=self.scale)
        if self._decode_only:
            wrapper = self._decoder(tensor_cores=heads // kv.num_kv_heads >= 4)
            wrapper.plan(host(lay.kv_indptr_host), indices, last, heads, kv.num_kv_heads, kv.head_dim, 1, **common)
        else:
            wrapper = self._prefill
            wrapper.plan(
                host(lay.qo_indptr_host), host(lay.kv_indptr_host), indices, last,
                heads, kv.num_kv_heads, kv.head_dim, 1, causal=True, **common,
            )
        return wrapper

    def _decoder(self, tensor_cores: bool):
        if tensor_cores not in self._decoders:
            self._decoders[tensor_cores] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_tensor_cores=tensor_cores
            )
        return self._decoders[tensor_cores]

    def forward(self, layer, q, k, v, out=None):
        assert self._lay is not None, "prepare() must run before forward()"
        self.kv.store(layer, self._slots, k, v)
        if self._planned is None:
            self._planned = self._plan(q.shape[1], q.dtype)
        kv = self.kv
        paged = (
            kv.k[layer].view(kv.num_slots, 1, kv.num_kv_heads, kv.head_dim),
            kv.v[layer].view(kv.num_slots, 1, kv.num_kv_heads, kv.head_dim),
        )
        if out is not None and out.is_contiguous():
            return self._planned.run(q.contiguous(), paged, out=out)
        result = self._planned.run(q.contiguous(), paged)
        return result if out is None else out.copy_(result)
