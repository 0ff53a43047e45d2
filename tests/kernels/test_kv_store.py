"""The cpu backend's one-call KV store (``csrc/kv_store.cpp``) against the pool's torch store
(``KVPool.store``: a cast and an index_copy_ per tensor): bit for bit in every pair of dtypes,
bad arguments refused before anything is written; on every ISA level this CPU executes."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool, cpu_ext

ALL = [torch.float32, torch.bfloat16, torch.float16]
HEADS, DIM, SLOTS = 3, 64, 500


def _qkv_views(gen, tokens: int, dtype: torch.dtype):
    """k and v as the model hands them over: strided views into a fused QKV projection's rows."""
    qkv = (torch.randn(tokens, (9 + 2 * HEADS) * DIM, generator=gen) * 5).to(dtype)
    qkv[0, 9 * DIM : 9 * DIM + 4] = torch.tensor([1.00390625, 1.01171875, -2.0078125, 3.0e-39])  # bf16 ties, a denormal
    k = qkv[:, 9 * DIM : (9 + HEADS) * DIM].view(tokens, HEADS, DIM)
    v = qkv[:, (9 + HEADS) * DIM :].view(tokens, HEADS, DIM)
    return k, v


@pytest.mark.parametrize("tokens", [1, 7, 1024])  # 1024: the rows split across threads
@pytest.mark.parametrize("pool_dtype", ALL)
@pytest.mark.parametrize("dtype", ALL)
def test_store_matches_the_pools_torch_store(gen, dtype, pool_dtype, tokens, level):
    torch.set_num_threads(2)
    kernel = cpu_ext.load()
    k, v = _qkv_views(gen, tokens, dtype)
    slots = torch.randperm(max(SLOTS, tokens), generator=gen)[:tokens]
    want, got = (KVPool(1, max(SLOTS, tokens), HEADS, DIM, pool_dtype) for _ in range(2))
    want.store(0, slots, k, v)
    kernel.store_kv_(got.k[0], got.v[0], slots, k, v)
    assert torch.equal(got.k[0].view(torch.uint8), want.k[0].view(torch.uint8))
    assert torch.equal(got.v[0].view(torch.uint8), want.v[0].view(torch.uint8))


@pytest.mark.parametrize("case", ["slot past the pool", "negative slot", "heads", "strided heads", "token count",
                                  "pool dtypes", "int32 slots"])
def test_bad_arguments_are_refused_and_nothing_is_written(gen, case, level):
    kernel = cpu_ext.load()
    pool = KVPool(1, SLOTS, HEADS, DIM, torch.bfloat16)
    k, v = _qkv_views(gen, 4, torch.float32)
    slots = torch.tensor([3, 9, 27, 81])
    kp, vp = pool.k[0], pool.v[0]
    if case == "slot past the pool":
        slots = torch.tensor([3, 9, SLOTS, 81])
    elif case == "negative slot":
        slots = torch.tensor([3, -1, 27, 81])
    elif case == "heads":
        k = k[:, :2]
    elif case == "strided heads":
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
    elif case == "token count":
        v = v[:3]
    elif case == "pool dtypes":
        vp = vp.float()
    else:
        slots = slots.int()
    with pytest.raises(RuntimeError):
        kernel.store_kv_(kp, vp, slots, k, v)
    assert not pool.k[0].any() and not pool.v[0].any()
