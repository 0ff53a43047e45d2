"""A step's requests in CSR form (the layout Triton and FlashInfer kernels read), built once per step.

For a subset ``sel`` of the step's requests (e.g. only the decode rows)::

    tokens      [n_tok]  positions of the subset's query tokens in the step's token axis
    qo_indptr   [B + 1]  request i's queries are tokens[qo_indptr[i] : qo_indptr[i + 1]]
    kv_indptr   [B + 1]  request i's keys are kv_indices[kv_indptr[i] : kv_indptr[i + 1]]
    kv_indices  [n_kv]   slots of positions 0 .. seq_len - 1 (prefix, then the new tokens)

With page size P a slot is ``page * P + offset``; the slot table already
spells every page out, so one layout serves every page size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import AttentionMetadata


@dataclass(frozen=True)
class RaggedLayout:
    tokens: torch.Tensor  # [n_tok] int64, device
    qo_indptr: torch.Tensor  # [B + 1] int32, device
    kv_indptr: torch.Tensor  # [B + 1] int32, device
    kv_indices: torch.Tensor  # [n_kv] int64, device
    prefix_lens: torch.Tensor  # [B] int32, device
    qo_indptr_host: np.ndarray  # [B + 1] int64
    kv_indptr_host: np.ndarray  # [B + 1] int64
    max_extend: int
    max_seq: int

    @property
    def batch(self) -> int:
        return len(self.qo_indptr_host) - 1


def ragged_layout(meta: AttentionMetadata, sel: np.ndarray) -> RaggedLayout:
    """The CSR layout of requests ``sel`` (indices into the step's batch); no device -> host sync."""
    device = meta.slot_table.device
    ext, seq = meta.extend_lens[sel], meta.seq_lens[sel]
    starts = (np.cumsum(meta.extend_lens) - meta.extend_lens)[sel]
    qo_host, kv_host = _indptr(ext), _indptr(seq)
    # NOTE: token t of request i sits at starts[i] + t in the step's token axis
    tokens = np.repeat(starts - qo_host[:-1], ext) + np.arange(qo_host[-1])
    rows = meta.rows[torch.from_numpy(sel).to(device)]
    n_kv = int(kv_host[-1])
    owner = torch.repeat_interleave(
        torch.arange(len(sel), device=device), torch.from_numpy(seq).to(device), output_size=n_kv
    )
    kv_dev = torch.from_numpy(kv_host).to(device)
    pos = torch.arange(n_kv, device=device) - kv_dev[owner]
    return RaggedLayout(
        tokens=torch.from_numpy(tokens).to(device),
        qo_indptr=torch.from_numpy(qo_host).to(device, torch.int32),
        kv_indptr=kv_dev.to(torch.int32),
        kv_indices=meta.slot_table[rows[owner], pos],
        prefix_lens=torch.from_numpy(meta.prefix_lens[sel]).to(device, torch.int32),
        qo_indptr_host=qo_host,
        kv_indptr_host=kv_host,
        max_extend=int(ext.max(initial=0)),
        max_seq=int(seq.max(initial=0)),
    )


def _indptr(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out
