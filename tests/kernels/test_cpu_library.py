"""The C++ elementwise kernels as torch custom ops: eager against torch's ops, compiled
(fullgraph) against eager, and the in-place writes their schemas declare."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import ops as torch_ops
from libs.kernels.errors import BackendNotAvailable

try:
    from libs.kernels import cpu_library

    lib = cpu_library.load()
except BackendNotAvailable:  # pragma: no cover - no compiler on this machine
    pytest.skip("the C++ kernels cannot build here", allow_module_level=True)

H, HEADS, KV, D = 64, 4, 2, 16


def _block(x, h, w, qkv, positions, cos, sin):
    """A piece's shape of work: residual + norm in place, RoPE in place, SiLU-mul, norm."""
    lib.add_rmsnorm_(x, h, w, 1e-5)
    lib.rope_qk_(qkv, positions, cos, sin, HEADS + KV, D)
    return lib.silu_mul(torch.cat([h, x], dim=1)), lib.rmsnorm(h, w, 1e-5), qkv * 1.0


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x, h = (torch.randn(5, H, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(H, generator=g).to(dtype)
    qkv = torch.randn(5, (HEADS + 2 * KV) * D, generator=g).to(dtype)
    rotary = torch_ops.Rotary(torch_ops.rope_inv_freq(D, 10000.0), 64)
    positions = torch.tensor([0, 3, 9, 17, 63])
    return x, h, w, qkv, positions, rotary.cos, rotary.sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_custom_ops_write_in_place_as_their_schemas_say(dtype):
    x, h, w, qkv, positions, cos, sin = _inputs(dtype)
    want_x, want_h = torch_ops.add_rmsnorm(x.clone(), h.clone(), w, 1e-5)
    rotary = torch_ops.Rotary(torch_ops.rope_inv_freq(D, 10000.0), 64)
    want_qk = torch_ops.rope_qk(qkv.clone(), HEADS + KV, D, torch_ops.rope_cache(rotary, positions, dtype))
    v = qkv[:, (HEADS + KV) * D:].clone()
    assert lib.add_rmsnorm_(x, h, w, 1e-5) is None and lib.rope_qk_(qkv, positions, cos, sin, HEADS + KV, D) is None
    torch.testing.assert_close(x, want_x, rtol=0, atol=0)
    torch.testing.assert_close(h, want_h, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-5)
    torch.testing.assert_close(qkv[:, : (HEADS + KV) * D].view(5, HEADS + KV, D), want_qk, rtol=0, atol=0)
    assert torch.equal(qkv[:, (HEADS + KV) * D:], v)  # v untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_fullgraph_calls_them_and_matches_eager(dtype):
    eager_in, compiled_in = _inputs(dtype), _inputs(dtype)
    want = _block(*eager_in)
    with torch.inference_mode():
        got = torch.compile(_block, fullgraph=True, dynamic=False)(*compiled_in)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for a, b in zip(compiled_in[:4], eager_in[:4]):  # the in-place writes reach the caller's tensors
        assert torch.equal(a, b)


def test_bad_inputs_raise_a_clear_error():
    x, h, w, *_ = _inputs(torch.float32)
    with pytest.raises(RuntimeError, match="weight must be"):
        lib.rmsnorm(x, w[:-1], 1e-5)
    with pytest.raises(RuntimeError, match="different tensors"):
        lib.add_rmsnorm_(x, x, w, 1e-5)
