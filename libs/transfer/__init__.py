"""Moving KV: export a pool's slots to a checksummed buffer and import it back, a
token-major host pool with device <-> host copies, the worker's staging buffers, and the
shared page store (``store.py``; its backends, imported where used: JetStream KV in
``jetstream_store.py`` (nats-py), Mooncake Store in ``mooncake_store.py`` (the mooncake extra)).

One way to move pages, for every later path (memory tiers, prefill/decode workers):
``gather_tokens`` / ``scatter_tokens`` (one index_select / index_copy per layer) under
``export_slots`` / ``import_slots`` and ``HostKVPool.save`` / ``load``.
"""

from __future__ import annotations

from .buffer import HEADER_BYTES, KVBuffer
from .codec import export_slots, import_slots, tokens_of
from .errors import (
    ChecksumMismatch, LayoutMismatch, PageTooLarge, SizeMismatch, SlotError, StoreError, StoreNotInstalled,
    StoreUnavailable, TransferError,
)
from .host_pool import HostKVPool
from .layout import DTYPES, KVLayout
from .staging import StagingBuffers
from .store import DEFAULT_PAGE_TOKENS, PageSpec, PageStore, StoreStats, page_key, page_keys, page_values, valid_key
from .tokens import gather_tokens, scatter_tokens

__all__ = [
    "DEFAULT_PAGE_TOKENS", "DTYPES", "HEADER_BYTES", "ChecksumMismatch", "HostKVPool", "KVBuffer", "KVLayout",
    "LayoutMismatch", "PageSpec", "PageStore", "PageTooLarge", "SizeMismatch", "SlotError", "StagingBuffers",
    "StoreError", "StoreNotInstalled", "StoreStats", "StoreUnavailable", "TransferError", "export_slots", "gather_tokens",
    "import_slots", "page_key", "page_keys", "page_values", "scatter_tokens", "tokens_of", "valid_key",
]
