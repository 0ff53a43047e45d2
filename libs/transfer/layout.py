"""The shape of KV one pool holds, and how a token's K/V across all layers is laid out.

Token-major ("page-first") order, used by exported buffers and by the host pool::

    [tokens, 2 (K, V), layers, kv_heads, head_dim]

so one token's (one page's, at page size 1) K and V of every layer are contiguous:
a prefix of a buffer's bytes is a prefix of its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from libs.kernels import KVPool

from .errors import LayoutMismatch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # a key of DTYPES

    @classmethod
    def of_pool(cls, pool: KVPool) -> "KVLayout":
        if pool.dtype not in DTYPE_NAMES:
            raise LayoutMismatch(f"KV dtype {pool.dtype} cannot be transferred ({', '.join(DTYPES)})")
        return cls(pool.num_layers, pool.num_kv_heads, pool.head_dim, DTYPE_NAMES[pool.dtype])

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def token_shape(self) -> tuple[int, int, int, int]:
        """One token's K/V: (2, layers, kv_heads, head_dim)."""
        return (2, self.num_layers, self.num_kv_heads, self.head_dim)

    @property
    def token_bytes(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.torch_dtype.itemsize

    def describe(self) -> str:
        return f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} dims, {self.dtype}"

    def require(self, other: "KVLayout") -> None:
        """Raise LayoutMismatch unless ``other`` is this layout."""
        if other != self:
            raise LayoutMismatch(f"KV layout mismatch: buffer holds {other.describe()}, pool holds {self.describe()}")
