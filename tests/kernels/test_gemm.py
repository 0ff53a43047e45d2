"""The bf16 linear kernel (libs.kernels.gemm, csrc/gemm_bf16.cpp) against fp32 matmuls, and the
tiles both kernels read."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import cpu_ext, gemm

from .gil_check import longest_stall

needs_bf16 = pytest.mark.skipif(not gemm.available(), reason="needs the C++ kernels on a CPU with AVX512-BF16")
BF16_LEVELS = [name for name in cpu_ext.runnable_levels() if "avx512_bf16" in cpu_ext.LEVELS[name].needs]


@pytest.fixture(params=BF16_LEVELS or [pytest.param(None, marks=pytest.mark.skip(reason="needs a CPU with AVX512-BF16"))])
def bf16_level(request) -> str:
    """Each level this CPU executes that has the bf16 kernel (the ``level`` fixture's, narrowed)."""
    with cpu_ext.using(request.param):
        yield request.param


def _case(gen, m: int, n: int, k: int):
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    return x, w, x.float() @ w.float().T


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    # NOTE: fp32 sums of exact bf16 products, rounded once to bf16: within ~1 bf16 ulp of
    # the fp32 result (2^-8 relative) plus the sum's order
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    err = (got.float() - ref).abs() / (ref.abs() + ref.abs().mean())
    assert float(err.max()) < 2**-7, float(err.max())


@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 8, 13, 64])
@pytest.mark.parametrize("n, k", [(960, 576), (576, 1536), (100, 64), (17, 2)])
def test_linear_matches_an_fp32_matmul(gen, m, n, k, bf16_level):
    x, w, ref = _case(gen, m, n, k)
    _close(gemm.linear(x, gemm.pack(w)), ref)


def test_bias_is_added_and_columns_past_the_weight_stay_unwritten(gen, bf16_level):
    x, w, ref = _case(gen, 3, 70, 32)  # two tiles, the second 6 columns wide
    bias = torch.randn(70, generator=gen).bfloat16()
    out = gemm.linear(x, gemm.pack(w), bias)
    _close(out, ref + bias.float())
    assert out.shape == (3, 70)


def test_rows_of_a_wider_tensor_are_read_in_place(gen, bf16_level):
    """x may be a column slice (row stride > width) or 2-byte aligned: the kernel reads pairs unaligned."""
    big = torch.randn(4, 130, generator=gen).bfloat16()
    w = torch.randn(40, 64, generator=gen).bfloat16()
    for x in (big[:, :64], big[:, 1:65]):
        _close(gemm.linear(x, gemm.pack(w)), x.float() @ w.float().T)


def test_pack_lays_column_pairs_out_in_tiles_of_64():
    w = torch.arange(70 * 4, dtype=torch.float32).view(70, 4).bfloat16()
    tiles = gemm.pack(w).tiles
    assert tiles.shape == (2, 2, 64) and tiles.dtype == torch.int32
    pair = tiles[1, 1, 3].item()  # column 64 + 3, elements 2 and 3 of its row
    low, high = pair & 0xFFFF, (pair >> 16) & 0xFFFF
    as_bf16 = torch.tensor([low, high], dtype=torch.int16).view(torch.bfloat16).float().tolist()
    assert as_bf16 == w[67, 2:4].float().tolist()
    assert not tiles[1, :, 6:].any()  # padding columns are zero


def test_bad_shapes_are_refused(gen, bf16_level):
    w = gemm.pack(torch.randn(16, 8, generator=gen).bfloat16())
    with pytest.raises(RuntimeError, match="width"):
        gemm.linear(torch.randn(2, 10).bfloat16(), w)
    with pytest.raises(ValueError, match="even width"):
        gemm.pack(torch.randn(4, 5).bfloat16())
    with pytest.raises(ValueError, match="bf16 or fp32"):
        gemm.pack(torch.randn(4, 6).half())


@pytest.mark.skipif(not gemm.available() and not gemm.f32_available(), reason="needs the C++ kernels")
def test_the_kernels_parallel_loops_run_on_torchs_threads():
    """The module is built with OpenMP on torch's own runtime: its parallel_for loops use
    torch.set_num_threads' team (built without it, they ran on one thread whatever the count)."""
    from pathlib import Path

    cpu_ext.load()
    maps = Path("/proc/self/maps")
    if maps.exists():  # one OpenMP runtime in the process: the module bound to torch's libgomp
        runtimes = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line}
        assert len(runtimes) == 1, runtimes
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cpu_ext.load().parallel_team(64) == 2
        torch.set_num_threads(1)
        assert cpu_ext.load().parallel_team(64) == 1
    finally:
        torch.set_num_threads(before)


@needs_bf16
def test_kernels_release_the_gil_while_they_run():
    """The worker's event loop thread must run while a step computes: another Python thread
    keeps running through a long kernel call."""
    x, w = torch.randn(1024, 1536).bfloat16(), gemm.pack(torch.randn(4096, 1536).bfloat16())
    assert longest_stall(lambda: gemm.linear(x, w)) < 0.5
