"""Backends by name, availability and the per-device default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from libs.kernels import BackendNotAvailable, KVPool, available_backends, default_backend, get_backend, registry
from libs.kernels.torch_backend import TorchAttentionBackend


def test_torch_backend_by_name():
    pool = KVPool(1, 8, 2, 16)
    backend = get_backend("torch", pool)
    assert isinstance(backend, TorchAttentionBackend) and backend.scale == 16**-0.5
    assert get_backend("torch", pool, scale=0.5).scale == 0.5
    assert "torch" in available_backends("cpu")


def test_unknown_name():
    with pytest.raises(BackendNotAvailable, match="unknown attention backend 'cuda'; known: torch, cpu, triton, flashinfer, cpu_v1"):
        get_backend("cuda", KVPool(1, 8, 2, 16))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_flashinfer_needs_cuda():
    with pytest.raises(BackendNotAvailable, match="flashinfer"):
        get_backend("flashinfer", KVPool(1, 8, 2, 16))
    assert "flashinfer" not in available_backends("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_triton_on_cpu_only_in_the_interpreter():
    pytest.importorskip("triton")
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest before any kernel import
    assert "triton" in available_backends("cpu")
    code = "from libs.kernels import KVPool, get_backend; get_backend('triton', KVPool(1, 8, 2, 16))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "BackendNotAvailable" in proc.stderr and "TRITON_INTERPRET=1" in proc.stderr


def test_default_backend_per_device(monkeypatch):
    assert default_backend("cpu") == "cpu"  # the C++ kernel builds wherever g++ is (CI too)
    monkeypatch.setenv("RADIXMESH_NO_CPU_EXT", "1")
    assert default_backend("cpu") == "torch"
    monkeypatch.delenv("RADIXMESH_NO_CPU_EXT")
    missing: set[str] = set()
    monkeypatch.setattr(registry, "_unavailable_reason", lambda name, device, dtype: "no" if name in missing else None)
    assert default_backend("cuda") == "flashinfer"
    missing.add("flashinfer")
    assert default_backend("cuda:0") == "triton"
    missing.add("triton")
    assert default_backend("cuda") == "torch"
    missing.add("cpu")
    assert default_backend("cpu") == "torch"


def test_flashinfer_wants_half_precision():
    from libs.kernels.registry import _backend_class

    try:
        cls = _backend_class("flashinfer")
    except BackendNotAvailable:
        pytest.skip("flashinfer is not installed")
    with pytest.raises(BackendNotAvailable, match="float16/bfloat16"):
        cls.check_available(torch.device("cuda"), torch.float32)
