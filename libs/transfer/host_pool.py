"""A second KV pool in host memory, token-major (page-first), and copies between it and a device pool."""

from __future__ import annotations

import math

import torch

from libs.kernels import KVPool

from .buffer import KVBuffer
from .codec import tokens_of
from .errors import SlotError
from .layout import KVLayout
from .tokens import gather_tokens, scatter_tokens


class HostKVPool:
    """``data[slot]`` is one token's K/V of every layer, contiguous: [num_slots, 2, layers,
    kv_heads, head_dim]. Pinned when the device pool is on CUDA, so copies are DMA."""

    def __init__(self, layout: KVLayout, num_slots: int, pin: bool = False) -> None:
        self.layout = layout
        self.num_slots = num_slots
        self.width = math.prod(layout.token_shape)  # elements of one token
        self.data = torch.zeros((num_slots, *layout.token_shape), dtype=layout.torch_dtype, pin_memory=pin)

    @classmethod
    def for_pool(cls, pool: KVPool, num_slots: int) -> "HostKVPool":
        return cls(KVLayout.of_pool(pool), num_slots, pin=pool.device.type == "cuda")

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def save(self, pool: KVPool, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Device -> host: copy the K/V of ``device_slots`` into ``host_slots`` (equal lengths)."""
        self.layout.require(KVLayout.of_pool(pool))
        src, dst = self._pair(pool, device_slots, host_slots)
        rows = gather_tokens(pool, src.to(pool.device))
        if rows.device.type != "cpu":
            rows = self._staging(len(rows)).copy_(rows)
        self._rows().index_copy_(0, dst, rows.view(len(rows), self.width))

    def load(self, pool: KVPool, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Host -> device: copy ``host_slots`` into the device pool at ``device_slots``."""
        self.layout.require(KVLayout.of_pool(pool))
        src, dst = self._pair(pool, host_slots, device_slots, host_first=True)
        rows = self._staging(len(src))
        torch.index_select(self._rows(), 0, src, out=rows.view(len(src), self.width))
        scatter_tokens(pool, dst.to(pool.device), rows.to(pool.device, non_blocking=True))

    def read(self, host_slots: torch.Tensor) -> torch.Tensor:
        """A copy of ``host_slots``' K/V, token-major [T, 2, layers, kv_heads, head_dim]
        (unpinned: it outlives later writes into those slots)."""
        src = _cpu_index(host_slots)
        _bounds(src, self.num_slots, "host")
        out = torch.empty((len(src), *self.layout.token_shape), dtype=self.data.dtype)
        torch.index_select(self._rows(), 0, src, out=out.view(len(src), self.width))
        return out

    def write(self, host_slots: torch.Tensor, buffer: KVBuffer) -> None:
        """Write ``buffer`` at ``host_slots``; raises a TransferError (layout, size, checksum,
        slots) before writing anything."""
        dst = _cpu_index(host_slots)
        _bounds(dst, self.num_slots, "host")
        if len(torch.unique(dst)) != len(dst):
            raise SlotError("destination slots repeat")
        buffer.verify(self.layout, len(dst))
        self._rows().index_copy_(0, dst, tokens_of(buffer).view(len(dst), self.width))

    def _rows(self) -> torch.Tensor:
        """``data`` as [num_slots, token elements]: 2-D, so index ops take torch's row-copy path."""
        return self.data.view(self.num_slots, self.width)

    def _staging(self, num_tokens: int) -> torch.Tensor:
        """Room for ``num_tokens`` tokens, pinned like the pool (from torch's caching host
        allocator: cheap to take, and kept alive until an asynchronous copy from it ends)."""
        return torch.empty((num_tokens, *self.layout.token_shape), dtype=self.data.dtype,
                           pin_memory=self.data.is_pinned())

    def _pair(self, pool: KVPool, a: torch.Tensor, b: torch.Tensor,
              host_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = _cpu_index(a), _cpu_index(b)
        host, dev = (a, b) if host_first else (b, a)
        if len(a) != len(b):
            raise SlotError(f"{len(a)} source slots for {len(b)} destination slots")
        _bounds(host, self.num_slots, "host")
        _bounds(dev, pool.num_slots, "device")
        if len(torch.unique(b)) != len(b):
            raise SlotError("destination slots repeat")
        return a, b


def _cpu_index(slots: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(slots, dtype=torch.int64).reshape(-1).cpu()


def _bounds(slots: torch.Tensor, size: int, name: str) -> None:
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= size):
        raise SlotError(f"{name} slots out of range [0, {size})")
