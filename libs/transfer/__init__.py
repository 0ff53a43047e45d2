"""Moving KV: export a pool's slots to a checksummed buffer and import it back, a
token-major host pool with device <-> host copies, and the worker's staging buffers.

One way to move pages, for every later path (memory tiers, prefill/decode workers):
``gather_tokens`` / ``scatter_tokens`` (one index_select / index_copy per layer) under
``export_slots`` / ``import_slots`` and ``HostKVPool.save`` / ``load``.
"""

from __future__ import annotations

from .buffer import HEADER_BYTES, KVBuffer
from .codec import export_slots, import_slots, tokens_of
from .errors import ChecksumMismatch, LayoutMismatch, SizeMismatch, SlotError, TransferError
from .host_pool import HostKVPool
from .layout import DTYPES, KVLayout
from .staging import StagingBuffers
from .tokens import gather_tokens, scatter_tokens

__all__ = [
    "DTYPES", "HEADER_BYTES", "ChecksumMismatch", "HostKVPool", "KVBuffer", "KVLayout", "LayoutMismatch",
    "SizeMismatch", "SlotError", "StagingBuffers", "TransferError", "export_slots", "gather_tokens",
    "import_slots", "scatter_tokens", "tokens_of",
]
