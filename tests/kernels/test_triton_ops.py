"""Triton RMSNorm, RoPE and SiLU-mul against the torch ops (interpreter on a CPU, compiled on CUDA)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from libs.kernels import ops  # noqa: E402
from libs.kernels import triton_ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _close(got, ref, dtype):
    assert got.dtype == ref.dtype and got.shape == ref.shape
    err = float((got.double() - ref.double()).abs().max() / ref.double().abs().max())
    assert err <= TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_on_strided_rows(gen, dtype):
    wide = torch.randn(7, 200, generator=gen).to(DEVICE, dtype)
    x, w = wide[:, :150], (torch.randn(150, generator=gen) * 0.5 + 1).to(DEVICE, dtype)  # 150: not a power of 2
    _close(triton_ops.rmsnorm(x, w, 1e-5), ops.rmsnorm(x.contiguous(), w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(gen, dtype):
    gu = (torch.randn(5, 2 * 96, generator=gen) * 3).to(DEVICE, dtype)
    _close(triton_ops.silu_mul(gu), ops.silu_mul(gu), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_on_a_qkv_view(gen, dtype):
    """The model rotates q and k inside the fused qkv projection: a strided [T, heads, D] view."""
    t, heads, dim = 6, 5, 64
    qkv = torch.randn(t, (heads + 2) * dim, generator=gen).to(DEVICE, dtype)
    x = qkv[:, : heads * dim].view(t, heads, dim)
    rot = ops.Rotary(ops.rope_inv_freq(dim, 10000.0), 64, DEVICE)
    cos, sin = rot.lookup(torch.randint(0, 64, (t,), generator=gen).to(DEVICE), dtype)
    _close(triton_ops.apply_rope(x, cos, sin), ops.apply_rope(x, cos, sin), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,rot", [(64, 48), (20, 12)])
def test_partial_rope_passes_the_rest_of_each_head_through(gen, dtype, dim, rot):
    """Phi-3's partial rotary: the tables cover the first ``rot`` columns of each head."""
    t, heads = 6, 5
    qkv = torch.randn(t, (heads + 2) * dim, generator=gen).to(DEVICE, dtype)
    x = qkv[:, : heads * dim].view(t, heads, dim)
    rot_tables = ops.Rotary(ops.rope_inv_freq(rot, 10000.0), 64, DEVICE)
    cos, sin = rot_tables.lookup(torch.randint(0, 64, (t,), generator=gen).to(DEVICE), dtype)
    got = triton_ops.apply_rope(x, cos, sin)
    _close(got, ops.apply_rope(x, cos, sin), dtype)
    assert torch.equal(got[..., rot:], x[..., rot:])
