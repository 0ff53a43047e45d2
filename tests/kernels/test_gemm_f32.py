"""The fp32 linear kernel over packed bf16 weights (libs.kernels.gemm, csrc/gemm_f32.cpp), on every ISA
level this CPU executes (all of them build it)."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import gemm

from .gil_check import longest_stall

pytestmark = pytest.mark.skipif(not gemm.f32_available(), reason="needs the C++ kernels on a CPU with AVX2 and FMA")


def _pack(w: torch.Tensor) -> gemm.TiledWeight:
    return gemm.pack(w, gemm.tile_for(torch.float32))


def _case(gen, m: int, n: int, k: int):
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    return x, w, x @ w.bfloat16().float().T  # NOTE: the weight rounded to bf16, the rest fp32


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    # NOTE: fp32 sums of fp32 products (bf16 weights widen exactly): only the summation order
    # differs from torch's, ~sqrt(K) * 2^-24 of the terms' scale
    assert got.dtype == torch.float32 and got.shape == ref.shape
    err = (got - ref).abs() / (ref.abs() + ref.abs().mean())
    assert float(err.max()) < 1e-5, float(err.max())


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 13, 16, 39, 40, 64])  # 40: widened once (kWideFrom)
@pytest.mark.parametrize("n, k", [(960, 576), (576, 1536), (100, 64), (17, 2), (70, 32)])
def test_linear_matches_an_fp32_matmul_of_the_rounded_weight(gen, m, n, k, level):
    x, w, ref = _case(gen, m, n, k)
    _close(gemm.linear(x, _pack(w)), ref)


def test_a_bf16_weight_packs_to_the_same_tiles_as_its_fp32_original(gen):
    w = torch.randn(80, 48, generator=gen)
    assert torch.equal(_pack(w).tiles, _pack(w.bfloat16()).tiles)


def test_bias_is_added_and_columns_past_the_weight_stay_unwritten(gen, level):
    x, w, ref = _case(gen, 3, 70, 32)  # five tiles, the last 6 columns wide
    bias = torch.randn(70, generator=gen)
    out = gemm.linear(x, _pack(w), bias)
    _close(out, ref + bias)
    assert out.shape == (3, 70)


def test_rows_of_a_wider_tensor_are_read_in_place(gen, level):
    big = torch.randn(5, 130, generator=gen)
    w = torch.randn(40, 64, generator=gen)
    for x in (big[:, :64], big[:, 1:65]):
        _close(gemm.linear(x, _pack(w)), x @ w.bfloat16().float().T)


def test_pack_lays_column_pairs_out_in_tiles_of_16_for_fp32():
    w = torch.arange(20 * 4, dtype=torch.float32).view(20, 4)
    tiles = _pack(w).tiles
    assert gemm.tile_for(torch.float32) == 16 and gemm.tile_for(torch.bfloat16) == 64
    assert tiles.shape == (2, 2, 16) and tiles.is_contiguous()  # NOTE: a tile's rows follow each other
    pair = tiles[1, 1, 3].item()  # column 16 + 3, elements 2 and 3 of its row
    low, high = pair & 0xFFFF, (pair >> 16) & 0xFFFF
    assert torch.tensor([low, high], dtype=torch.int16).view(torch.bfloat16).float().tolist() == w[19, 2:4].tolist()
    assert not tiles[1, :, 4:].any()  # padding columns are zero


def test_an_empty_batch_and_bad_arguments(gen, level):
    w = _pack(torch.randn(16, 8, generator=gen))
    assert gemm.linear(torch.randn(0, 8), w).shape == (0, 16)
    with pytest.raises(RuntimeError, match=r"\[tiles, K/2, 16\]"):  # the bf16 kernel's 64-column tiles
        gemm.linear(torch.randn(2, 8), gemm.pack(torch.randn(16, 8, generator=gen), gemm.TILE))
    with pytest.raises(ValueError, match="16 .fp32. columns wide, not 32"):
        gemm.pack(torch.randn(16, 8, generator=gen), 32)
    with pytest.raises(RuntimeError, match="width"):
        gemm.linear(torch.randn(2, 10), w)
    with pytest.raises(RuntimeError, match="bias must be"):
        gemm.linear(torch.randn(2, 8), w, torch.randn(16).bfloat16())
    with pytest.raises(RuntimeError, match="bias must be"):
        gemm.linear(torch.randn(2, 8), w, torch.randn(15))


def test_thread_counts_give_the_same_result(gen, level):
    x, w, _ = _case(gen, 7, 576, 192)
    packed, before = _pack(w), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemm.linear(x, packed)
        torch.set_num_threads(2)
        two = gemm.linear(x, packed)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # NOTE: threads split columns, never a sum


def test_the_kernel_releases_the_gil_while_it_runs():
    x, w = torch.randn(512, 1536), _pack(torch.randn(4096, 1536))
    assert longest_stall(lambda: gemm.linear(x, w)) < 0.5
