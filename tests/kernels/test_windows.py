"""Sliding-window attention (``set_windows``) in every backend against the float64 reference
with HF's mask: decode, extend over a cached prefix, prompts in chunks, windows shorter and
longer than the sequence, a window per layer, fp32 and bf16 KV.

The V rows no query of a request sees hold 1e4 (attention_case.py): any weight on them shows.
The cpu backend's cases run on each ISA level this CPU executes (the ``level`` fixture), on
each extend path: brgemm (AMX) / AVX512-BF16 dots / AVX2 for bf16 and fp32, SDPA, the fp32 loops.
"""

from __future__ import annotations

import pytest
import torch

from libs.kernels import BackendNotAvailable, KVPool, get_backend
from libs.kernels.synthetic import synthetic_step

from .attention_case import Case, check_attention

# (prefix, extend) rows: decode rows whose windows are longer than, equal to and shorter than
# their sequences, fresh prompts, chunks over a cached prefix crossing key blocks (128) and
# query tiles (64)
DECODE = ([0, 5, 15, 16, 17, 64, 130, 700], [1] * 8)
MIXED = ([0, 127, 128, 129, 300, 40, 0], [65, 130, 1, 40, 200, 1, 9])
WINDOWS = [1, 16, 100, 128, 129, 4096]


def cpu(pool):
    return get_backend("cpu", pool)


def cpu_fp32_queries(pool):
    return get_backend("cpu", pool, dtype=torch.float32)


def cpu_loops(pool):
    """Extend rows through the C++ kernel's fp32 loops (as test_cpu_backend's)."""
    backend = get_backend("cpu", pool)
    backend.cpp_extend, backend.native_bf16 = True, False
    return backend


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("make", [cpu, cpu_loops], ids=["default", "cpp-loops"])
def test_cpu_mixed_steps(gen, level, window, dtype, make):
    check_attention(make, Case(*MIXED, kv_heads=3, group=3, dtype=dtype, page_size=16, windows=(window,)), gen)


@pytest.mark.parametrize("window", [1, 16, 129])
@pytest.mark.parametrize("head_dim,group", [(64, 1), (64, 3), (64, 4), (128, 2), (128, 3), (48, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_decode_items(gen, level, window, head_dim, group, dtype):
    """Every decode item kind (AVX512-BF16 pairs, AVX2, the widening loops) starts at the window."""
    check_attention(cpu, Case(*DECODE, kv_heads=2, group=group, head_dim=head_dim, dtype=dtype, windows=(window,)),
                    gen)


@pytest.mark.parametrize("window", [16, 129])
def test_cpu_fp32_queries_over_a_bf16_pool(gen, level, window):
    check_attention(cpu_fp32_queries, Case(*MIXED, kv_heads=2, group=3, kv_dtype=torch.bfloat16,
                                           windows=(window,)), gen)
    check_attention(cpu_fp32_queries, Case(*DECODE, kv_heads=2, group=4, kv_dtype=torch.bfloat16,
                                           windows=(window,)), gen)


def test_cpu_bf16_extend_without_amx(gen, level):
    """bf16 products where a CPU without AMX runs them (AVX512-BF16's dots, else SDPA)."""
    kernel = get_backend("cpu", KVPool(1, 8, 2, 64, torch.bfloat16))._kernel
    before = kernel.set_brgemm(False)
    try:
        for window in (16, 129):
            check_attention(cpu, Case(*MIXED, kv_heads=2, group=4, dtype=torch.bfloat16, windows=(window,)), gen)
    finally:
        kernel.set_brgemm(before)


def test_cpu_a_window_per_layer_and_threads(gen, level):
    """Local and global layers in one step (Gemma 3's pattern), the work split over two threads
    by its windowed cost."""
    torch.set_num_threads(2)  # NOTE: the conftest fixture restores the count
    for dtype in (torch.float32, torch.bfloat16):
        check_attention(cpu, Case([0, 700, 90, 7], [300, 200, 1, 1], kv_heads=3, group=3, dtype=dtype, layers=3,
                                  windows=(64, None, 200)), gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_prompt_in_chunks_matches_it_whole(gen, dtype):
    """A 300-token prompt attended at once and as chunks of 90 over its cached prefix: one result."""
    n, chunk, window = 300, 90, 40
    pool = KVPool(1, 512, 2, 64, dtype)
    q, k, v = (torch.randn(n, h, 64, generator=gen).to(dtype) for h in (6, 2, 2))
    whole = synthetic_step([0], [n], num_slots=512, generator=gen)
    backend = get_backend("cpu", pool)
    backend.set_windows((window,))
    backend.prepare(whole.meta)
    expected = backend.forward(0, q, k, v)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        part = synthetic_step([start], [end - start], num_slots=512, generator=gen)
        part.meta.slot_table[part.meta.rows[0], :end] = whole.meta.slot_table[whole.meta.rows[0], :end]
        part.meta.out_slots.copy_(whole.meta.out_slots[start:end])
        backend.prepare(part.meta)
        got = backend.forward(0, q[start:end], k[start:end], v[start:end])
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, expected[start:end], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_matches_the_torch_backend(gen, dtype):
    pool = KVPool(2, 4096, 3, 64, dtype)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=gen))
    step = synthetic_step([100, 900, 5, 0, 300], [1, 1, 70, 33, 150], num_slots=4096, page_size=16, generator=gen)
    tokens = step.meta.num_tokens
    q = torch.randn(tokens, 9, 64, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, 3, 64, generator=gen).to(dtype) for _ in range(2))
    outs = {}
    for name in ("torch", "cpu"):
        backend = get_backend(name, pool)
        backend.set_windows((32, None))
        backend.prepare(step.meta)
        outs[name] = [backend.forward(layer, q, k, v) for layer in range(2)]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for layer in range(2):
        torch.testing.assert_close(outs["cpu"][layer], outs["torch"][layer], rtol=tol, atol=tol)


@pytest.mark.parametrize("window", [1, 16, 129])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend(gen, window, dtype):
    check_attention(lambda pool: get_backend("torch", pool), Case(*MIXED, kv_heads=2, group=3, dtype=dtype,
                                                                   layers=2, windows=(window, None)), gen)


def test_torch_fp32_queries_over_a_bf16_pool(gen):
    check_attention(lambda pool: get_backend("torch", pool, dtype=torch.float32),
                    Case(*MIXED, kv_heads=2, group=3, kv_dtype=torch.bfloat16, windows=(16,)), gen)


def test_cpu_v1_refuses_windows():
    backend = get_backend("cpu_v1", KVPool(2, 8, 2, 64))
    backend.set_windows((None, None))  # no window that binds: fine
    with pytest.raises(BackendNotAvailable, match="no sliding-window attention"):
        backend.set_windows((16, None))


def test_the_kernels_refuse_a_negative_window(gen):
    pool = KVPool(1, 64, 2, 64)
    step = synthetic_step([3, 9], [1, 1], num_slots=64, generator=gen)
    kernel = get_backend("cpu", pool)._kernel
    q = torch.randn(2, 2, 64)
    m = step.meta
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        kernel.paged_decode(q, pool.k[0], pool.v[0], m.slot_table, m.rows, torch.tensor([4, 10]),
                            torch.empty(0, dtype=torch.int64), 0.125, torch.empty_like(q), -1)
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        kernel.paged_extend(q, pool.k[0], pool.v[0], m.slot_table, m.rows, torch.tensor([3, 9]), torch.tensor([1, 1]),
                            torch.tensor([0, 1]), 0.125, torch.empty_like(q), True, -1)
