"""The cpu backend's C++ elementwise kernels against the torch versions (libs/kernels/ops.py).

Tolerances, by what each kernel does differently from torch:
- the residual add and RoPE keep torch's rounding points exactly (products rounded to
  the dtype, no FMA): bit for bit in every dtype;
- RMSNorm sums its squares in another order: the fp32 1/rms differs in its last bits, so
  a bf16 / fp16 result is one rounding step off now and then (2 ulp of the dtype, >= 99%
  identical); in fp32 each sum (16 lanes of H/16 terms) is within (H/16 + 4) * 2^-23
  ~ 5e-6 of exact, so results agree to rtol 1e-5;
- SiLU uses its own exp (Cephes' expf, ~1 ulp) and a division: fp32 within a few ulp
  (rtol 1e-6), bf16 / fp16 as RMSNorm.

The kernel tests run on every ISA level this CPU executes (the ``level`` fixture).
"""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool, cpu_ops, get_backend, ops

HALF = [torch.bfloat16, torch.float16]
ALL = [torch.float32, *HALF]


def _close_to_torch(got: torch.Tensor, want: torch.Tensor, fp32_rtol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=fp32_rtol, atol=fp32_rtol)
        return
    ulp = torch.finfo(got.dtype).eps
    torch.testing.assert_close(got, want, rtol=2 * ulp, atol=2 * ulp)
    assert (got == want).float().mean() > 0.99


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("rows,width", [(1, 576), (7, 576), (64, 576), (5, 100)])  # 100: a masked tail
def test_rmsnorm_and_silu_mul_match_torch(gen, dtype, rows, width, level):
    x = (torch.randn(rows, width, generator=gen) * 3).to(dtype)
    w = torch.randn(width, generator=gen).to(dtype)
    gate_up = (torch.randn(rows, 2 * width, generator=gen) * 4).to(dtype)
    _close_to_torch(cpu_ops.rmsnorm(x, w, 1e-5), ops.rmsnorm(x, w, 1e-5), fp32_rtol=1e-5)
    _close_to_torch(cpu_ops.silu_mul(gate_up), ops.silu_mul(gate_up), fp32_rtol=1e-6)


def test_silu_mul_at_the_extremes(level):
    g = torch.tensor([[-200.0, -30.0, -1e-30, 0.0, 1e-30, 30.0, 200.0, float("nan")]])
    got = cpu_ops.silu_mul(torch.cat([g, torch.ones_like(g)], dim=1))
    want = ops.silu_mul(torch.cat([g, torch.ones_like(g)], dim=1))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("rows,width", [(1, 576), (33, 576), (3, 40)])
def test_add_rmsnorm_in_place_matches_torch(gen, dtype, rows, width, level):
    x = (torch.randn(rows, width, generator=gen) * 3).to(dtype)
    h = torch.randn(rows, width, generator=gen).to(dtype)
    w = torch.randn(width, generator=gen).to(dtype)
    want_x, want_h = ops.add_rmsnorm(x, h, w, 1e-6)
    xp, hp = x.data_ptr(), h.data_ptr()
    got_x, got_h = cpu_ops.add_rmsnorm(x, h, w, 1e-6)
    assert got_x.data_ptr() == xp and got_h.data_ptr() == hp  # in place
    assert torch.equal(got_x, want_x)  # the residual add rounds as torch's
    _close_to_torch(got_h, want_h, fp32_rtol=1e-5)


def _rope_case(gen, dtype, tokens, heads, kv_heads, dim, positions):
    rot = ops.Rotary(ops.rope_inv_freq(dim, 10000.0), positions, attention_factor=1.1)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen) * 2).to(dtype)
    pos = torch.randint(0, positions, (tokens,), generator=gen)
    return rot, qkv, pos


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("tokens,dim", [(1, 64), (37, 64), (5, 128), (4, 20)])  # 20: a masked half row
def test_rope_qk_is_torch_bit_for_bit_in_place(gen, dtype, tokens, dim, level):
    heads, kv_heads = 9, 3
    rot, qkv, pos = _rope_case(gen, dtype, tokens, heads, kv_heads, dim, 4096)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    want = ops.rope_qk(qkv, heads + kv_heads, dim, ops.rope_cache(rot, pos, dtype))
    rope = cpu_ops.rope_cache(rot, pos, dtype)
    assert isinstance(rope, cpu_ops.RopeStep)
    got = cpu_ops.rope_qk(qkv, heads + kv_heads, dim, rope)
    assert got.data_ptr() == qkv.data_ptr() and got.shape == (tokens, heads + kv_heads, dim)
    assert torch.equal(got, want)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("dim,rot", [(64, 48), (128, 96), (20, 12), (16, 2)])  # 12: a masked half row
def test_partial_rope_qk_is_torch_bit_for_bit_and_passes_the_rest_through(gen, dtype, dim, rot, level):
    heads, kv_heads, tokens = 5, 2, 9
    table = ops.Rotary(ops.rope_inv_freq(rot, 10000.0), 256, attention_factor=1.2)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen) * 2).to(dtype)
    pos = torch.randint(0, 256, (tokens,), generator=gen)
    before = qkv.clone().view(tokens, -1, dim)
    want = ops.rope_qk(qkv.clone(), heads + kv_heads, dim, ops.rope_cache(table, pos, dtype))
    got = cpu_ops.rope_qk(qkv, heads + kv_heads, dim, cpu_ops.rope_cache(table, pos, dtype))
    assert torch.equal(got, want)
    assert torch.equal(qkv.view(tokens, -1, dim)[:, :, rot:], before[:, :, rot:])  # the unrotated columns, v
    assert not torch.equal(got[:, :, :rot], before[:, : heads + kv_heads, :rot])


def test_rope_qk_refuses_a_position_past_the_tables(gen, level):
    rot, qkv, _ = _rope_case(gen, torch.bfloat16, 2, 2, 1, 16, 8)
    with pytest.raises(RuntimeError, match="position out of"):
        cpu_ops.rope_qk(qkv, 3, 16, cpu_ops.rope_cache(rot, torch.tensor([3, 8]), torch.bfloat16))


def test_rows_the_kernels_do_not_take_go_to_torch(gen):
    rot, qkv, pos = _rope_case(gen, torch.bfloat16, 6, 2, 1, 16, 32)
    strided = qkv[::2]  # not contiguous
    rope = cpu_ops.rope_cache(rot, pos[::2], torch.bfloat16)
    want = ops.rope_qk(strided.clone(), 3, 16, ops.rope_cache(rot, pos[::2], torch.bfloat16))
    assert torch.equal(cpu_ops.rope_qk(strided, 3, 16, rope), want)
    x, h, w = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8)  # not [T, H]
    x_ref = x.clone()
    got_x, got_h = cpu_ops.add_rmsnorm(x, h, w, 1e-5)
    assert torch.equal(x, x_ref)  # the torch path does not write its inputs
    torch.testing.assert_close(got_h, ops.rmsnorm(x + h, w, 1e-5))


def test_the_cpp_path_is_the_one_taken(monkeypatch):
    calls = []
    real = cpu_ops.cpu_ext.load()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    monkeypatch.setattr(cpu_ops.cpu_ext, "load", lambda: Spy())
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(64).bfloat16()
    rot = ops.Rotary(ops.rope_inv_freq(16, 10000.0), 8)
    cpu_ops.rmsnorm(x, w, 1e-5)
    cpu_ops.add_rmsnorm(x, x.clone(), w, 1e-5)
    cpu_ops.silu_mul(torch.randn(4, 32))
    cpu_ops.rope_qk(torch.randn(2, 48), 2, 16, cpu_ops.rope_cache(rot, torch.tensor([0, 7]), torch.float32))
    assert calls == ["rmsnorm", "add_rmsnorm_", "silu_mul", "rope_qk_"]
    cpu_ops.silu_mul(torch.randn(2, 4, 32).bfloat16())  # not [T, H]: torch's
    cpu_ops.rmsnorm(x.double(), w.double(), 1e-5)  # fp64: torch's
    assert calls == ["rmsnorm", "add_rmsnorm_", "silu_mul", "rope_qk_"]


def test_the_cpu_backend_offers_them():
    assert get_backend("cpu", KVPool(1, 8, 2, 16)).ops is cpu_ops
