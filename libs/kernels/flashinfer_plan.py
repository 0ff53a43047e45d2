"""The arguments of FlashInfer's ``plan`` for a step (pure: no flashinfer import, so they are
tested where FlashInfer cannot run). Each slot is a page of one token (see flashinfer_backend)."""

from __future__ import annotations

import numpy as np
import torch

from .ragged import RaggedLayout


def window_left(window: int | None) -> int:
    """FlashInfer's ``window_left`` for HF's window (a query sees its ``window`` latest keys, its
    own included): the keys left of its own, inclusive; -1: every key."""
    return window - 1 if window else -1


def plan_args(lay: RaggedLayout, decode_only: bool, heads: int, kv_heads: int, head_dim: int, q_dtype: torch.dtype,
              kv_dtype: torch.dtype, scale: float, window: int | None) -> tuple[tuple, dict]:
    """The (positional, keyword) arguments of the decode wrapper's ``plan`` (``decode_only``) or the
    prefill wrapper's, for a step laid out as ``lay`` (every slot a page of one token)."""
    host = lambda a: torch.from_numpy(a.astype(np.int32))  # noqa: E731  (plan copies indptrs to the host anyway)
    indices = lay.kv_indices.to(torch.int32)
    last = torch.ones(lay.batch, dtype=torch.int32)
    common = dict(q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=scale, window_left=window_left(window))
    if decode_only:
        return (host(lay.kv_indptr_host), indices, last, heads, kv_heads, head_dim, 1), common
    return ((host(lay.qo_indptr_host), host(lay.kv_indptr_host), indices, last, heads, kv_heads, head_dim, 1),
            dict(causal=True, **common))
