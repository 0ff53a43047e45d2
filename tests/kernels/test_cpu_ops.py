"""The cpu backend's C++ RMSNorm and SiLU-mul: the torch versions' results in bf16/fp16, torch's own path elsewhere."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool, cpu_ops, get_backend, ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_same_values_as_the_torch_ops(gen, dtype, rows):
    x = (torch.randn(rows, 576, generator=gen) * 3).to(dtype)
    w = torch.randn(576, generator=gen).to(dtype)
    gate_up = (torch.randn(rows, 2 * 1536, generator=gen) * 4).to(dtype)
    ulp = torch.finfo(dtype).eps  # NOTE: sums in another order: a last-bit difference now and then
    for got, want in ((cpu_ops.rmsnorm(x, w, 1e-5), ops.rmsnorm(x, w, 1e-5)),
                      (cpu_ops.silu_mul(gate_up), ops.silu_mul(gate_up))):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=2 * ulp, atol=2 * ulp)
        assert (got == want).float().mean() > 0.99


def test_the_cpp_path_is_the_one_taken(monkeypatch):
    calls = []
    real = cpu_ops.cpu_ext.load()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    monkeypatch.setattr(cpu_ops.cpu_ext, "load", lambda: Spy())
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(64).bfloat16()
    cpu_ops.rmsnorm(x, w, 1e-5)
    cpu_ops.silu_mul(torch.randn(4, 32).bfloat16())
    assert calls == ["rmsnorm", "silu_mul"]
    cpu_ops.rmsnorm(x.float(), w.float(), 1e-5)  # fp32: torch's
    cpu_ops.silu_mul(torch.randn(2, 4, 32).bfloat16())  # not [T, H]: torch's
    assert calls == ["rmsnorm", "silu_mul"]


def test_fp32_is_torch_bit_for_bit(gen):
    x, w = torch.randn(9, 576, generator=gen), torch.randn(576, generator=gen)
    assert torch.equal(cpu_ops.rmsnorm(x, w, 1e-6), ops.rmsnorm(x, w, 1e-6))
    gu = torch.randn(9, 64, generator=gen)
    assert torch.equal(cpu_ops.silu_mul(gu), ops.silu_mul(gu))


def test_the_cpu_backend_offers_them():
    assert get_backend("cpu", KVPool(1, 8, 2, 16)).ops is cpu_ops
