"""The kernels --deterministic rests on, bit for bit: a row of the bf16 tile linear (and of
the padded fp32 one, AVX2's form) is the same whatever the number of rows around it, and the cpu backend's deterministic mode gives every
token the same output in a prefill, an extend over a cached prefix, a mixed step and a decode
step (its default extend kernel does not: the second test fails without the mode)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libs.kernels import KVPool, get_backend, gemm
from libs.kernels.base import AttentionMetadata
from libs.kernels.synthetic import synthetic_step

needs_bf16 = pytest.mark.skipif(not gemm.available(), reason="needs the C++ kernels on a CPU with AVX512-BF16")


@needs_bf16
@pytest.mark.parametrize("n, k", [(960, 576), (576, 1536), (49152, 576)])
def test_a_tile_linear_row_is_the_same_bits_in_any_batch(gen, n, k):
    w = gemm.pack(torch.randn(n, k, generator=gen).bfloat16())
    x = torch.randn(500, k, generator=gen).bfloat16()
    whole = gemm.linear(x, w)
    for m in (1, 2, 5, 7, 13, 64):
        assert torch.equal(gemm.linear(x[:m], w), whole[:m]), m
    assert torch.equal(gemm.linear(x[250:251], w), whole[250:251])


@pytest.mark.skipif(not gemm.f32_available(), reason="needs the C++ kernels on a CPU with AVX2 and FMA")
@pytest.mark.parametrize("n, k", [(960, 576), (576, 1536)])
def test_a_fixed_linear_row_is_the_same_bits_in_any_batch(gen, n, k):
    """``linear_fixed`` (AVX2's deterministic form), where the fp32 kernel as it runs differs
    by row count (its one- and two-row blocks sum even and odd k apart)."""
    w = gemm.pack(torch.randn(n, k, generator=gen).bfloat16(), gemm.F32_TILE)
    x = torch.randn(500, k, generator=gen).bfloat16()
    whole = gemm.linear_fixed(x, w)
    for m in (1, 2, 3, 5, 13, 39, 41, 64):
        assert torch.equal(gemm.linear_fixed(x[:m], w), whole[:m]), m
    plain = gemm.linear(x.float(), w)
    assert not all(torch.equal(gemm.linear(x[:m].float(), w), plain[:m]) for m in (1, 2))


def _meta(step, rows: list[int], prefix: list[int], extend: list[int], out_slots: torch.Tensor) -> AttentionMetadata:
    return AttentionMetadata(rows=torch.tensor(rows), prefix_lens=np.array(prefix, dtype=np.int64),
                             extend_lens=np.array(extend, dtype=np.int64), out_slots=out_slots,
                             slot_table=step.meta.slot_table)


@pytest.mark.skipif(not gemm.f32_available(), reason="needs the C++ kernels (a CPU with AVX2 and FMA)")
def test_deterministic_attention_gives_each_token_its_decode_steps_bits(gen):
    """One step of a fresh prefill, an extend over a cached prefix and a decode row, against
    the same tokens attended one decode step at a time (their K/V already stored)."""
    prefix, extend = [0, 70, 130], [90, 40, 1]
    pool = KVPool(1, 1024, 3, 64, torch.bfloat16)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=gen).bfloat16())
    step = synthetic_step(prefix, extend, num_slots=pool.num_slots, max_requests=4, generator=gen)
    total = sum(extend)
    q = torch.randn(total, 9, 64, generator=gen).bfloat16()
    k = torch.randn(total, 3, 64, generator=gen).bfloat16()
    v = torch.randn(total, 3, 64, generator=gen).bfloat16()
    backend = get_backend("cpu", pool)
    backend.set_deterministic(True)
    backend.prepare(step.meta)
    together = backend.forward(0, q, k, v).clone()
    # token by token: each a decode row of its own over the keys up to it (stored above)
    starts = [sum(extend[:i]) for i in range(len(extend))]
    for i, (p, e) in enumerate(zip(prefix, extend)):
        for j in range(e):
            t = starts[i] + j
            backend.prepare(_meta(step, [int(step.meta.rows[i])], [p + j], [1], step.meta.out_slots[t: t + 1]))
            alone = backend.forward(0, q[t: t + 1], k[t: t + 1], v[t: t + 1])
            assert torch.equal(alone[0], together[t]), (i, j)
