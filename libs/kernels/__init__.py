"""Attention over the paged KV layout and the small elementwise kernels of the model.

Backends are chosen by name (:func:`get_backend`): ``torch`` (portable, the CPU
default and the reference), ``triton`` (CUDA; the interpreter on a CPU for
tests) and ``flashinfer`` (CUDA, half precision). :func:`default_backend`
picks one per device.

Imports are lazy (PEP 562): the regex modules (``regex_fsm``, numpy only) load
without torch, so the scheduler can check patterns cheaply.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "AttentionBackend": ".base",
    "AttentionMetadata": ".base",
    "BackendNotAvailable": ".errors",
    "KVPool": ".kv_pool",
    "available_backends": ".registry",
    "default_backend": ".registry",
    "get_backend": ".registry",
    "known_backends": ".registry",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
