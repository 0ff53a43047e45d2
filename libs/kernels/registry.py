"""Attention backends by name, imported lazily so optional dependencies stay optional."""

from __future__ import annotations

import importlib

import torch

from .base import AttentionBackend
from .errors import BackendNotAvailable
from .kv_pool import KVPool

# name -> "module:class"; each module raises BackendNotAvailable when its runtime is missing
_BACKENDS: dict[str, str] = {
    "torch": "libs.kernels.torch_backend:TorchAttentionBackend",
    "cpu": "libs.kernels.cpu_backend:CpuAttentionBackend",
    "triton": "libs.kernels.triton_backend:TritonAttentionBackend",
    "flashinfer": "libs.kernels.flashinfer_backend:FlashInferAttentionBackend",
    "cpu_v1": "libs.kernels.cpu_v1_backend:CpuV1AttentionBackend",  # the benchmarks' baseline
}


def known_backends() -> list[str]:
    return list(_BACKENDS)


def available_backends(device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> list[str]:
    """Backends that can run on ``device`` (and with a KV pool of ``dtype``) in this process."""
    return [name for name in _BACKENDS if _unavailable_reason(name, torch.device(device), dtype) is None]


def default_backend(device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """The backend to use when none is named: cpu -> cpu (the C++ kernel, when it builds),
    else torch; cuda -> flashinfer, else triton, else torch."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu" if _unavailable_reason("cpu", device, dtype) is None else "torch"
    if device.type != "cuda":
        return "torch"
    for name in ("flashinfer", "triton"):
        if _unavailable_reason(name, device, dtype) is None:
            return name
    return "torch"


def get_backend(name: str, kv: KVPool, scale: float | None = None,
                dtype: torch.dtype | None = None) -> AttentionBackend:
    """Instantiate the backend called ``name`` over ``kv`` (softmax ``scale`` default 1/sqrt(D))
    for queries of ``dtype`` (None: the pool's).

    Raises BackendNotAvailable with the reason when the name is unknown or its
    runtime (package, device, dtype) is missing.
    """
    if name not in _BACKENDS:
        raise BackendNotAvailable(f"unknown attention backend {name!r}; known: {', '.join(_BACKENDS)}")
    return _backend_class(name)(kv, scale, dtype)


def _backend_class(name: str) -> type[AttentionBackend]:
    module, cls = _BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:  # an optional package is missing
        raise BackendNotAvailable(f"attention backend {name!r} is not available: {exc}") from None


def _unavailable_reason(name: str, device: torch.device, dtype: torch.dtype | None) -> str | None:
    try:
        _backend_class(name).check_available(device, dtype)
    except BackendNotAvailable as exc:
        return str(exc)
    return None
