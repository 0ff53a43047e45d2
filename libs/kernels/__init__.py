"""Attention over the paged KV layout and the small elementwise kernels of the model.

Backends are chosen by name (:func:`get_backend`); ``torch`` is the portable
reference, ``triton`` and ``flashinfer`` are reserved names.
"""

from .base import AttentionBackend, AttentionMetadata
from .kv_pool import KVPool
from .registry import BackendNotAvailable, available_backends, get_backend

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "BackendNotAvailable",
    "KVPool",
    "available_backends",
    "get_backend",
]
