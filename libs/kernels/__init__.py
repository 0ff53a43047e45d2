"""Attention over the paged KV layout and the small elementwise kernels of the model.

Backends are chosen by name (:func:`get_backend`): ``torch`` (portable, the
reference), ``cpu`` (torch + a C++ decode kernel), ``triton`` (CUDA; the
interpreter on a CPU for tests) and ``flashinfer`` (CUDA, half precision); each is
imported only when asked for. :func:`default_backend` picks one per device.
"""

from .base import AttentionBackend, AttentionMetadata
from .errors import BackendNotAvailable
from .kv_pool import KVPool
from .registry import available_backends, default_backend, get_backend, known_backends

__all__ = [
    "AttentionBackend", "AttentionMetadata", "BackendNotAvailable", "KVPool", "available_backends",
    "default_backend", "get_backend", "known_backends",
]
