"""The torch attention backend against a float64 reference on ragged, mixed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from libs.kernels import AttentionMetadata, KVPool, get_backend

D = 64


def _reference(q, keys, values, prefix, scale):
    """Causal GQA attention of ``q`` [n, H, D] over keys/values [prefix + n, Hkv, D] in float64."""
    n, heads = q.shape[:2]
    group = heads // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    allowed = torch.arange(keys.shape[0])[None, :] <= (prefix + torch.arange(n))[:, None]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _run_case(prefix_lens, extend_lens, kv_heads, group, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    heads, slots_total, max_len = kv_heads * group, 512, 64
    pool = KVPool(2, slots_total, kv_heads, D, dtype)
    for t in pool.k + pool.v:  # stale data everywhere
        t.copy_(torch.randn(t.shape, generator=gen) * 3)
    b = len(prefix_lens)
    rows = torch.randperm(8, generator=gen)[:b]
    seq = [p + e for p, e in zip(prefix_lens, extend_lens)]
    perm = torch.randperm(slots_total, generator=gen)
    table = torch.randint(0, slots_total, (8, max_len), generator=gen)  # garbage beyond each length
    owned, used = [], 0
    for i in range(b):
        owned.append(perm[used : used + seq[i]])
        used += seq[i]
        table[rows[i], : seq[i]] = owned[i]
    out_slots = torch.cat([owned[i][prefix_lens[i] :] for i in range(b)])
    foreign = perm[used:]  # slots of nobody in this batch: attention must never read them
    for t in pool.k + pool.v:
        t[foreign] = float("nan")
    t = int(sum(extend_lens))
    meta = AttentionMetadata(
        rows=rows, prefix_lens=np.array(prefix_lens), extend_lens=np.array(extend_lens),
        out_slots=out_slots, slot_table=table,
    )
    backend = get_backend("torch", pool)
    backend.prepare(meta)
    for layer in range(2):
        q = torch.randn(t, heads, D, generator=gen).to(dtype)
        k = torch.randn(t, kv_heads, D, generator=gen).to(dtype)
        v = torch.randn(t, kv_heads, D, generator=gen).to(dtype)
        out = torch.full_like(q, float("nan"))
        got = backend.forward(layer, q, k, v, out=out)
        assert got is out
        assert torch.equal(pool.k[layer][out_slots], k) and torch.equal(pool.v[layer][out_slots], v)
        start = 0
        for i in range(b):
            span = slice(start, start + extend_lens[i])
            ref = _reference(q[span], pool.k[layer][owned[i]], pool.v[layer][owned[i]], prefix_lens[i], D**-0.5)
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(out[span].double(), ref, rtol=tol, atol=tol)
            start += extend_lens[i]
        # without ``out`` the backend returns an equal fresh tensor
        backend.prepare(meta)
        torch.testing.assert_close(backend.forward(layer, q, k, v), out)


@pytest.mark.parametrize("group", [1, 3])
def test_decode_batch_ragged(group):
    _run_case([5, 0, 31, 12, 47], [1, 1, 1, 1, 1], kv_heads=3, group=group)


@pytest.mark.parametrize("group", [1, 3])
def test_extend_with_and_without_prefix(group):
    _run_case([0, 9, 0, 20], [7, 4, 1, 13], kv_heads=2, group=group, seed=1)


@pytest.mark.parametrize("group", [1, 3])
def test_mixed_extend_and_decode(group):
    _run_case([3, 0, 17, 0, 25, 8], [1, 12, 1, 1, 6, 1], kv_heads=3, group=group, seed=2)


def test_bfloat16_close_to_reference():
    _run_case([4, 0, 30], [1, 9, 1], kv_heads=3, group=3, dtype=torch.bfloat16, seed=3)


def test_prepare_required():
    backend = get_backend("torch", KVPool(1, 4, 1, D))
    x = torch.zeros(1, 1, D)
    with pytest.raises(AssertionError):
        backend.forward(0, x, x, x)
