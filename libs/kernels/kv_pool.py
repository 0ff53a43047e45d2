"""The paged KV layout: per layer one K and one V pool addressed by slot (page size 1)."""

from __future__ import annotations

import torch


class KVPool:
    """Preallocated K/V tensors: ``k[layer]`` and ``v[layer]`` are [num_slots, kv_heads, head_dim].

    NOTE: pools start zeroed so every slot always holds finite values; attention
    pads short rows with real slots and masks them, and a NaN there would leak
    through ``0 * NaN``.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K/V ([T, kv_heads, head_dim]) at ``slots`` ([T] int64), rounded
        to the pool's dtype where the model computes in another."""
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))

    def nbytes(self) -> int:
        return 2 * self.num_layers * self.k[0].numel() * self.k[0].element_size()
