"""Attention backends by name, imported lazily so optional dependencies stay optional."""

from __future__ import annotations

import importlib

from .base import AttentionBackend
from .kv_pool import KVPool

_BACKENDS: dict[str, str | None] = {
    "torch": "libs.kernels.torch_backend:TorchAttentionBackend",
    "triton": None,
    "flashinfer": None,
}


class BackendNotAvailable(ValueError):
    """The named backend is unknown or not implemented yet."""


def available_backends() -> list[str]:
    return [name for name, target in _BACKENDS.items() if target is not None]


def get_backend(name: str, kv: KVPool, scale: float | None = None) -> AttentionBackend:
    """Instantiate the backend called ``name`` over ``kv`` (softmax ``scale`` default 1/sqrt(D))."""
    if name not in _BACKENDS:
        raise BackendNotAvailable(
            f"unknown attention backend {name!r}; known: {', '.join(_BACKENDS)}"
        )
    target = _BACKENDS[name]
    if target is None:
        raise BackendNotAvailable(
            f"attention backend {name!r} is not available yet; available: "
            f"{', '.join(available_backends())}"
        )
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(kv, scale)
