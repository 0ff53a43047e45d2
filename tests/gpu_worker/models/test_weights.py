"""Which packed form linears take (weights.linear_kernel), and linear's dispatch on it."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import gemm
from services.gpu_worker.models import weights
from services.gpu_worker.models.weights import HYBRID_ROWS, HybridWeight, PackedWeight, can_pack, fp32_copy_fits, linear, linear_kernel, pack

CPU = torch.device("cpu")
ZEN4 = frozenset({"avx512f", "avx512_bf16"})
SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})

needs_bf16 = pytest.mark.skipif(not can_pack(torch.bfloat16, CPU), reason="oneDNN has no bf16 on this CPU")


@needs_bf16
def test_auto_takes_the_tiles_kernel_without_amx_and_onednn_with_it(monkeypatch):
    monkeypatch.setattr(gemm, "available", lambda: True)
    assert linear_kernel("auto", torch.bfloat16, CPU, ZEN4) == "tiles"
    assert linear_kernel("auto", torch.bfloat16, CPU, SAPPHIRE_RAPIDS) == "onednn"
    assert linear_kernel("auto", torch.bfloat16, CPU, frozenset({"avx2"})) == "onednn"
    monkeypatch.setattr(gemm, "available", lambda: False)  # no compiler: the C++ module did not build
    assert linear_kernel("auto", torch.bfloat16, CPU, ZEN4) == "onednn"
    with pytest.raises(ValueError, match="AVX512-BF16"):
        linear_kernel("tiles", torch.bfloat16, CPU, ZEN4)


def test_fp32_takes_onednn_and_unknown_names_are_refused(monkeypatch):
    monkeypatch.setattr(gemm, "available", lambda: True)
    monkeypatch.setattr(gemm, "f32_available", lambda: True)
    assert linear_kernel("auto", torch.float32, CPU, ZEN4) == "onednn"  # fp32 stays fp32 unless asked
    assert linear_kernel("auto", torch.float32, CPU, frozenset({"avx2"})) == "onednn"
    assert linear_kernel("tiles", torch.float32, CPU, frozenset({"avx2"})) == "tiles"
    assert linear_kernel("auto", torch.float32, CPU, frozenset({"avx2"}), bf16_weights=True) == "tiles+onednn"  # auto's pick
    # without the memory for the fp32 copy, the tiles alone
    assert linear_kernel("auto", torch.float32, CPU, frozenset({"avx2"}), bf16_weights=True, fp32_copy_fits=False) == "tiles"
    assert linear_kernel("tiles+onednn", torch.float32, CPU, frozenset({"avx2"})) == "tiles+onednn"
    with pytest.raises(ValueError, match="fp32 activations"):
        linear_kernel("tiles+onednn", torch.bfloat16, CPU, ZEN4)
    monkeypatch.setattr(gemm, "f32_available", lambda: False)  # no compiler: fp32 weights after all
    assert linear_kernel("auto", torch.float32, CPU, frozenset({"avx2"}), bf16_weights=True) == "onednn"
    with pytest.raises(ValueError, match="AVX2 and FMA"):
        linear_kernel("tiles", torch.float32, CPU, ZEN4)
    with pytest.raises(ValueError, match="not one of"):
        linear_kernel("mkl", torch.bfloat16, CPU)


def _fp32_operands(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, 96], a weight [80, 96] and its bias, seeded by ``rows``."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=gen)
    return x, torch.randn(80, 96, generator=gen), torch.randn(80, generator=gen)


@pytest.mark.parametrize("rows", [1, 8, 33])
def test_fp32_packed_linear_matches_f_linear(rows):
    x, w, bias = _fp32_operands(rows)
    packed = pack(w, "onednn")
    assert isinstance(packed, PackedWeight)
    got, ref = linear(x, packed, bias), torch.nn.functional.linear(x, w, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, 80)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)  # fp32: only the summation order differs


@needs_bf16
@pytest.mark.parametrize("kernel", ["onednn", "tiles"])
def test_linear_runs_each_packed_form_like_f_linear(kernel):
    if kernel == "tiles" and not gemm.available():
        pytest.skip("the tiles kernel needs AVX512-BF16")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=gen).bfloat16()
    w, bias = torch.randn(80, 96, generator=gen).bfloat16(), torch.randn(80, generator=gen).bfloat16()
    packed = pack(w, kernel)
    assert isinstance(packed, gemm.TiledWeight if kernel == "tiles" else PackedWeight)
    ref = torch.nn.functional.linear(x.float(), w.float(), bias.float())
    got = linear(x, packed, bias)
    assert got.dtype == torch.bfloat16 and float((got.float() - ref).abs().max()) < 0.1
    assert weights.linear(x, w).shape == (5, 80)  # a plain weight still goes to F.linear


@needs_bf16
def test_an_odd_width_weight_takes_onednn_under_the_tiles_kernel():
    if not gemm.available():
        pytest.skip("the tiles kernel needs AVX512-BF16")
    w = torch.randn(48, 33).bfloat16()
    packed = pack(w, "tiles")
    assert isinstance(packed, PackedWeight)
    x = torch.randn(3, 33).bfloat16()
    assert float((linear(x, packed).float() - x.float() @ w.float().T).abs().max()) < 0.1


needs_f32_tiles = pytest.mark.skipif(not gemm.f32_available(), reason="the fp32 tiles kernel needs AVX2 and FMA")


@needs_f32_tiles
@pytest.mark.parametrize("rows", [1, HYBRID_ROWS - 1, HYBRID_ROWS, 130])
def test_the_hybrid_form_runs_either_kernel_on_the_same_bf16_values(rows):
    x, w, bias = _fp32_operands(rows)
    packed = pack(w, "tiles+onednn")
    assert isinstance(packed, HybridWeight)
    ref = torch.nn.functional.linear(x, w.bfloat16().float(), bias)  # both forms hold the weight rounded to bf16
    torch.testing.assert_close(linear(x, packed, bias), ref, rtol=1e-5, atol=1e-4)
    # each side of the row threshold takes its own form
    form = packed.dense if rows >= HYBRID_ROWS else packed.tiles
    assert torch.equal(linear(x, packed, bias), linear(x, form, bias))


def test_the_fp32_copy_fits_in_a_quarter_of_the_free_memory():
    layer = type("Layer", (), {n: torch.empty(1024, 256) for n in ("qkv", "o_proj", "gate_up", "down")})()
    w = type("W", (), {"layers": [layer] * 2, "lm_head": torch.empty(1024, 256)})()
    need = (8 + 1) * 1024 * 256 * 4  # bytes of the fp32 copy
    assert fp32_copy_fits(w, available=4 * need)
    assert not fp32_copy_fits(w, available=4 * need - 1)


def test_deterministic_takes_a_batch_invariant_form_or_refuses(monkeypatch):
    monkeypatch.setattr(gemm, "available", lambda: True)
    monkeypatch.setattr(gemm, "f32_available", lambda: True)
    for flags in (ZEN4, SAPPHIRE_RAPIDS):  # NOTE: with AMX too: oneDNN's rows change with the batch
        assert linear_kernel("auto", torch.bfloat16, CPU, flags, deterministic=True) == "tiles"
    with pytest.raises(ValueError, match="not batch-invariant"):
        linear_kernel("onednn", torch.bfloat16, CPU, SAPPHIRE_RAPIDS, deterministic=True)
    monkeypatch.setattr(gemm, "available", lambda: False)  # AVX2: the fp32 kernel, padded
    assert linear_kernel("auto", torch.bfloat16, CPU, deterministic=True) == weights.FIXED
    assert linear_kernel("auto", torch.float32, CPU, bf16_weights=True, deterministic=True) == weights.FIXED
    with pytest.raises(ValueError, match="no batch-invariant form for torch.float32"):  # fp32: no CPU form
        linear_kernel("auto", torch.float32, CPU, deterministic=True)
    cuda = torch.device("cuda")  # NOTE: the choice only; tests/kernels/test_triton_invariance.py runs the kernel
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert linear_kernel("auto", dtype, cuda, deterministic=True) == weights.TRITON_FIXED
    with pytest.raises(ValueError, match="is a CPU kernel"):
        linear_kernel("tiles", torch.bfloat16, cuda, deterministic=True)
    monkeypatch.setattr(gemm, "f32_available", lambda: False)
    with pytest.raises(ValueError, match="--deterministic"):
        linear_kernel("auto", torch.bfloat16, CPU, deterministic=True)


@pytest.mark.skipif(not gemm.f32_available(), reason="needs the C++ kernels on a CPU with AVX2 and FMA")
def test_a_fixed_weight_runs_linear_fixed():
    w = torch.randn(40, 64).bfloat16()
    x = torch.randn(3, 64).bfloat16()
    fixed = pack(w, weights.FIXED)
    assert isinstance(fixed, weights.FixedWeight) and fixed.shape == (40, 64)
    got = linear(x, fixed)
    assert got.dtype == torch.bfloat16 and torch.equal(got, gemm.linear_fixed(x, fixed.tiles))
    torch.testing.assert_close(got.float(), x.float() @ w.float().T, rtol=2**-7, atol=1e-2)
