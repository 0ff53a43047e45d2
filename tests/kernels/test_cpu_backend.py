"""The C++ cpu backend against the float64 reference, and its guard on slots."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool, get_backend
from libs.kernels.synthetic import synthetic_step

from .attention_case import Case, check_attention, random_lens


def cpu_backend(pool):
    return get_backend("cpu", pool)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch_fp32(gen, page_size, head_dim, group):
    prefix, extend = random_lens(gen, batch=6, max_prefix=70, max_extend=20)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 2, group=group, head_dim=head_dim,
                page_size=page_size, layers=2)
    check_attention(cpu_backend, case, gen)


@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch_bf16(gen, group):
    prefix, extend = random_lens(gen, batch=5, max_prefix=60, max_extend=16)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 3, group=group, dtype=torch.bfloat16, page_size=16)
    check_attention(cpu_backend, case, gen)


def test_decode_only_long_contexts(gen):
    """Every row decodes, over contexts long enough to span many pages."""
    check_attention(cpu_backend, Case([700, 0, 1500, 31, 257], [1] * 5, kv_heads=3, group=3,
                                      page_size=16), gen)


@pytest.mark.parametrize("prefix", range(0, 5))
def test_short_prefixes_next_to_extends(gen, prefix):
    check_attention(cpu_backend, Case([prefix, prefix, 0], [1, 5, 3], kv_heads=2, group=3), gen)


def test_slots_outside_the_pool_are_refused(gen):
    pool = KVPool(1, 64, 2, 64)
    step = synthetic_step([3, 9], [1, 1], num_slots=64, generator=gen)
    step.meta.slot_table[step.meta.rows[1], 2] = 64  # one past the pool
    with pytest.raises(ValueError, match="outside the KV pool"):
        get_backend("cpu", pool).prepare(step.meta)


def test_same_result_as_the_torch_backend(gen):
    pool = KVPool(1, 4096, 3, 64)
    for t in pool.k + pool.v:
        t.normal_(generator=gen)
    step = synthetic_step([100, 900, 5], [1, 1, 1], num_slots=4096, page_size=16, generator=gen)
    q = torch.randn(3, 9, 64, generator=gen)
    k, v = torch.randn(3, 3, 64, generator=gen), torch.randn(3, 3, 64, generator=gen)
    outs = []
    for name in ("torch", "cpu"):
        backend = get_backend(name, pool)
        backend.prepare(step.meta)
        outs.append(backend.forward(0, q, k, v))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
