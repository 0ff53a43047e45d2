"""Backends by name."""

from __future__ import annotations

import pytest

from libs.kernels import BackendNotAvailable, KVPool, available_backends, get_backend
from libs.kernels.torch_backend import TorchAttentionBackend


def test_torch_backend_by_name():
    pool = KVPool(1, 8, 2, 16)
    backend = get_backend("torch", pool)
    assert isinstance(backend, TorchAttentionBackend) and backend.scale == 16**-0.5
    assert get_backend("torch", pool, scale=0.5).scale == 0.5
    assert available_backends() == ["torch"]


@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_reserved_names_say_not_available_yet(name):
    with pytest.raises(BackendNotAvailable, match="not available yet"):
        get_backend(name, KVPool(1, 8, 2, 16))


def test_unknown_name():
    with pytest.raises(BackendNotAvailable, match="unknown attention backend 'cuda'"):
        get_backend("cuda", KVPool(1, 8, 2, 16))
