"""Gather / scatter whole tokens of a KVPool in token-major order, one vectorised op per layer."""

from __future__ import annotations

import torch

from libs.kernels import KVPool


def gather_tokens(pool: KVPool, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """K/V of ``slots`` ([T] int64 on the pool's device) as a contiguous tensor
    [T, 2, layers, kv_heads, head_dim]: a new one on the pool's device, or ``out`` (contiguous,
    of that shape and the pool's dtype; written in place on the pool's device, else copied into)."""
    n, width = len(slots), pool.num_kv_heads * pool.head_dim
    if out is not None and out.device != pool.k[0].device:
        out.copy_(gather_tokens(pool, slots))
        return out
    out = out.view(n, 2, pool.num_layers, width) if out is not None else \
        torch.empty((n, 2, pool.num_layers, width), dtype=pool.dtype, device=pool.device)
    # NOTE: 2-D [slots, heads * dim] views: torch's row-copy fast path (~20x the 3-D one on CPU)
    for layer in range(pool.num_layers):
        torch.index_select(pool.k[layer].view(-1, width), 0, slots, out=out[:, 0, layer])
        torch.index_select(pool.v[layer].view(-1, width), 0, slots, out=out[:, 1, layer])
    return out.view(n, 2, pool.num_layers, pool.num_kv_heads, pool.head_dim)


def scatter_tokens(pool: KVPool, slots: torch.Tensor, data: torch.Tensor) -> None:
    """Write ``data`` ([T, 2, layers, kv_heads, head_dim], on the pool's device) at ``slots``."""
    for layer in range(pool.num_layers):
        pool.k[layer].index_copy_(0, slots, data[:, 0, layer])
        pool.v[layer].index_copy_(0, slots, data[:, 1, layer])

