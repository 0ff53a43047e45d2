"""The C++ cpu backend (decode and extend kernels) against the float64 reference, and its guard on slots.

bf16 tolerance (attention_case.TOLERANCE, 1e-2 of the largest output): inputs and
outputs are bf16 (a relative rounding of 2^-9 each), and in the native bf16 extend (AMX,
AVX512-BF16) the probabilities are rounded to bf16 before P . V; the sums themselves are fp32. Measured over random
ragged batches: 3.7e-3 worst (the torch backend's bf16: 3.2e-3).

Every test runs on each ISA level of the C++ kernels this CPU executes (the ``level`` fixture).
"""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool, cpu_ext, get_backend
from libs.kernels.synthetic import synthetic_step

from .attention_case import Case, check_attention, random_lens


def cpu_backend(pool):
    return get_backend("cpu", pool)


def cpu_loops(pool):
    """Extend rows through the C++ kernel's fp32 loops (by default they go to brgemm or
    AVX512-BF16's dot products, or to SDPA)."""
    backend = get_backend("cpu", pool)
    backend.cpp_extend, backend.native_bf16 = True, False
    return backend


pytestmark = pytest.mark.usefixtures("level")
BOTH = pytest.mark.parametrize("make", [cpu_backend, cpu_loops], ids=["default", "cpp-loops"])


def test_extend_goes_to_cpp_where_bf16_products_are_native(level):
    kernel = get_backend("cpu", KVPool(1, 8, 2, 64, torch.bfloat16))._kernel
    assert kernel is cpu_ext.load(level)
    native = bool(kernel.amx_bf16()) or level == "avx512bf16"  # NOTE: AMX through oneDNN, whatever the level
    assert bool(kernel.bf16_extend()) == native
    assert get_backend("cpu", KVPool(1, 8, 2, 64, torch.bfloat16)).cpp_extend == native
    fp32 = bool(kernel.fp32_extend())
    assert fp32 == (level == "avx2")
    assert get_backend("cpu", KVPool(1, 8, 2, 64)).cpp_extend == fp32  # AVX2's register-blocked fp32 products
    assert get_backend("cpu", KVPool(1, 8, 2, 64, torch.bfloat16), dtype=torch.float32).cpp_extend == fp32


@BOTH
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch_fp32(gen, page_size, head_dim, group, make):
    prefix, extend = random_lens(gen, batch=6, max_prefix=70, max_extend=20)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 2, group=group, head_dim=head_dim,
                page_size=page_size, layers=2)
    check_attention(make, case, gen)


@BOTH
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_ragged_mixed_batch_bf16(gen, group, head_dim, make):
    prefix, extend = random_lens(gen, batch=5, max_prefix=150, max_extend=80)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 3, group=group, head_dim=head_dim,
                dtype=torch.bfloat16, page_size=16)
    check_attention(make, case, gen)


@pytest.fixture()
def without_brgemm(level):
    """oneDNN's brgemm forbidden in the level's build: on an AMX CPU bf16 extend products then run
    where a CPU without AMX runs them (AVX512-BF16's dot products, ``dot_tiles.h``; else SDPA)."""
    kernel = cpu_ext.load(level)
    before = kernel.set_brgemm(False)
    yield kernel
    kernel.set_brgemm(before)


@pytest.mark.parametrize("group", [1, 3, 8])
def test_bf16_extend_without_amx(gen, without_brgemm, level, group):
    assert not without_brgemm.amx_bf16() and bool(without_brgemm.bf16_extend()) == (level == "avx512bf16")
    prefix, extend = random_lens(gen, batch=5, max_prefix=150, max_extend=80)
    kv_heads = 1 if group == 8 else 3
    check_attention(cpu_backend, Case(prefix, extend, kv_heads=kv_heads, group=group, dtype=torch.bfloat16,
                                      page_size=16), gen)
    check_attention(cpu_backend, Case([0, 127, 128, 129], [65] * 4, kv_heads=kv_heads, group=group,
                                      dtype=torch.bfloat16), gen)  # query tiles and key blocks past their edges
    if group == 3:
        check_attention(cpu_backend, Case([3800, 0], [300, 129], kv_heads=3, group=3, dtype=torch.bfloat16), gen)


@BOTH
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_head_dim_without_a_vector_path(gen, dtype, make):
    """D = 48: neither the 64/128 decode loops nor brgemm's tiles apply."""
    check_attention(make, Case([0, 40, 97], [33, 1, 5], kv_heads=2, group=3, head_dim=48, dtype=dtype), gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,group", [(64, 1), (64, 2), (64, 3), (64, 4), (128, 1), (128, 2), (128, 3), (128, 4)])
def test_decode_shapes_of_the_register_blocked_paths(gen, dtype, head_dim, group):
    """Decode rows at every (head dim, group) the vector decode items are built for (and 128 x 3,
    which is not): lengths that end mid-way through a group of four keys and a 64-key block, 1 to 200."""
    check_attention(cpu_backend, Case([0, 1, 2, 62, 63, 64, 130, 199], [1] * 8, kv_heads=2, group=group,
                                      head_dim=head_dim, dtype=dtype), gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_only_long_contexts(gen, dtype):
    """Every row decodes, over contexts long enough to span many pages and blocks (~4k)."""
    check_attention(cpu_backend, Case([700, 0, 4000, 31, 257, 63, 64], [1] * 7, kv_heads=3, group=3,
                                      page_size=16, dtype=dtype), gen)


@BOTH
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_over_a_long_prefix(gen, dtype, make):
    """A chunk of 300 over a ~3.8k prefix next to a fresh prefill, page size 1 (every slot scattered)."""
    check_attention(make, Case([3800, 0], [300, 129], kv_heads=3, group=3, dtype=dtype), gen)


@BOTH
@pytest.mark.parametrize("extend", [2, 63, 64, 65, 127, 128, 129])
def test_tile_edges(gen, extend, make):
    """Query tiles (64 tokens) and key blocks (128) that end short of, on and past their edges."""
    check_attention(make, Case([0, 127, 128, 129], [extend] * 4, kv_heads=2, group=4, dtype=torch.bfloat16), gen)
    check_attention(make, Case([0, 127, 128, 129], [extend] * 4, kv_heads=2, group=4), gen)


@pytest.mark.parametrize("prefix", range(0, 5))
def test_short_prefixes_next_to_extends(gen, prefix):
    check_attention(cpu_backend, Case([prefix, prefix, 0], [1, 5, 3], kv_heads=2, group=3), gen)


@BOTH
@pytest.mark.parametrize("threads", [2, 3])
def test_several_threads(gen, make, threads):
    """Work items split between threads by their cost, in contiguous runs (each thread packs
    its own key blocks): a long causal prompt, mixed requests, fewer items than threads."""
    torch.set_num_threads(threads)  # NOTE: the conftest fixture restores the count
    for dtype in (torch.float32, torch.bfloat16):
        check_attention(make, Case([0, 500, 90, 7], [200, 100, 1, 1], kv_heads=3, group=3, dtype=dtype), gen)
        check_attention(make, Case([0], [512], kv_heads=3, group=3, dtype=dtype), gen)
        check_attention(make, Case([30], [5], kv_heads=1, group=2, dtype=dtype), gen)


def test_slots_outside_the_pool_are_refused(gen):
    pool = KVPool(1, 64, 2, 64)
    step = synthetic_step([3, 9], [1, 1], num_slots=64, generator=gen)
    step.meta.slot_table[step.meta.rows[1], 2] = 64  # one past the pool
    with pytest.raises(ValueError, match="outside the KV pool"):
        get_backend("cpu", pool).prepare(step.meta)


def test_extend_slots_are_checked_too(gen):
    pool = KVPool(1, 256, 2, 64)
    step = synthetic_step([30, 9], [1, 40], num_slots=256, generator=gen)
    step.meta.slot_table[step.meta.rows[1], 5] = -1
    with pytest.raises(ValueError, match="outside the KV pool"):
        get_backend("cpu", pool).prepare(step.meta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_result_as_the_torch_backend(gen, dtype):
    """Decode and extend rows in one step, returned (out=None) and into a non-contiguous ``out``."""
    pool = KVPool(1, 4096, 3, 64, dtype)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=gen))
    step = synthetic_step([100, 900, 5, 0], [1, 1, 70, 33], num_slots=4096, page_size=16, generator=gen)
    tokens = step.meta.num_tokens
    q = torch.randn(tokens, 9, 64, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, 3, 64, generator=gen).to(dtype) for _ in range(2))
    outs = []
    for name in ("torch", "cpu"):
        backend = get_backend(name, pool)
        backend.prepare(step.meta)
        outs.append(backend.forward(0, q, k, v))
    strided = torch.empty(tokens, 9, 128, dtype=dtype)[..., :64]
    backend.forward(0, q, k, v, out=strided)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[1], outs[0], rtol=tol, atol=tol)
    torch.testing.assert_close(strided, outs[1], rtol=0, atol=0)


def fp32_over_bf16(name):
    return lambda pool: get_backend(name, pool, dtype=torch.float32)


MIXED = pytest.mark.parametrize("make", [fp32_over_bf16("cpu"), fp32_over_bf16("torch")], ids=["cpu", "torch"])


@MIXED
@pytest.mark.parametrize("head_dim,group", [(64, 1), (64, 3), (64, 4), (128, 2), (128, 3), (48, 3)])
def test_fp32_queries_over_a_bf16_pool(gen, head_dim, group, make):
    """KV kept in bf16 under an fp32 model: decode rows read the pool's rows widened (the AVX2
    items, the plain loops at 128 x 3 and D = 48), extend rows go to SDPA; held to fp32's
    tolerance against the K/V as stored, fresh prompts' own K/V rounded as the pool rounds them."""
    prefix, extend = random_lens(gen, batch=6, max_prefix=140, max_extend=40)
    check_attention(make, Case(prefix, extend, kv_heads=2, group=group, head_dim=head_dim, page_size=16, layers=2,
                               kv_dtype=torch.bfloat16), gen)
    check_attention(make, Case([0, 1, 2, 62, 63, 64, 130, 199], [1] * 8, kv_heads=2, group=group, head_dim=head_dim,
                               kv_dtype=torch.bfloat16), gen)


def test_a_fresh_prompt_reads_what_its_cached_prefix_would(gen):
    """Over a bf16 pool, a prompt prefilled at once and the same prompt's last tokens over its
    cached prefix give the same attention (the fresh K/V are rounded as stored)."""
    pool = KVPool(1, 256, 3, 64, torch.bfloat16)
    q, k, v = (torch.randn(40, h, 64, generator=gen) for h in (9, 3, 3))
    whole = get_backend("cpu", pool, dtype=torch.float32)
    step = synthetic_step([0], [40], num_slots=256, generator=gen)
    whole.prepare(step.meta)
    fresh = whole.forward(0, q, k, v)
    tail = synthetic_step([32], [8], num_slots=256, generator=gen)
    tail.meta.slot_table[tail.meta.rows[0], :40] = step.meta.slot_table[step.meta.rows[0], :40]
    tail.meta.out_slots.copy_(step.meta.out_slots[32:])  # the same slots: nothing else overwritten
    cached = get_backend("cpu", pool, dtype=torch.float32)
    cached.prepare(tail.meta)
    torch.testing.assert_close(cached.forward(0, q[32:], k[32:], v[32:]), fresh[32:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cpu_v1", "cpu"])
def test_kv_of_another_dtype_is_refused_where_not_taken(name):
    from libs.kernels import BackendNotAvailable

    with pytest.raises(BackendNotAvailable, match="queries' dtype"):
        get_backend(name, KVPool(1, 8, 2, 64, torch.bfloat16 if name == "cpu_v1" else torch.float32),
                    dtype=torch.float32 if name == "cpu_v1" else torch.bfloat16)


def test_the_decode_kernel_names_the_dtypes_it_takes(gen):
    """Called directly with bf16 queries over an fp32 pool (no backend between): a clear error."""
    pool = KVPool(1, 64, 2, 64)
    step = synthetic_step([3, 9], [1, 1], num_slots=64, generator=gen)
    kernel = get_backend("cpu", pool)._kernel
    q = torch.randn(2, 2, 64).bfloat16()
    with pytest.raises(RuntimeError, match="fp32 q and out over a bf16 pool"):
        kernel.paged_decode(q, pool.k[0], pool.v[0], step.meta.slot_table, step.meta.rows, torch.tensor([4, 10]),
                            torch.empty(0, dtype=torch.int64), 0.125, torch.empty_like(q), 0)
