from __future__ import annotations

import torch

from libs.transfer import gather_tokens, scatter_tokens

from .conftest import filled_pool


def test_gather_is_token_major_over_every_layer(pool):
    slots = torch.tensor([7, 0, 63, 7])
    out = gather_tokens(pool, slots)
    assert out.shape == (4, 2, pool.num_layers, pool.num_kv_heads, pool.head_dim) and out.is_contiguous()
    for layer in range(pool.num_layers):
        assert torch.equal(out[:, 0, layer], pool.k[layer][slots])
        assert torch.equal(out[:, 1, layer], pool.v[layer][slots])
    # one token's K/V across all layers is one contiguous run
    assert torch.equal(out[2].reshape(-1), torch.cat([pool.k[i][63].reshape(-1) for i in range(3)]
                                                     + [pool.v[i][63].reshape(-1) for i in range(3)]))


def test_scatter_writes_only_the_given_slots(pool):
    other = filled_pool(seed=1)
    before = [t.clone() for t in pool.k]
    slots = torch.tensor([5, 9, 2])
    scatter_tokens(pool, slots, gather_tokens(other, torch.tensor([1, 2, 3])))
    for layer in range(pool.num_layers):
        assert torch.equal(pool.k[layer][slots], other.k[layer][[1, 2, 3]])
        assert torch.equal(pool.v[layer][slots], other.v[layer][[1, 2, 3]])
        untouched = torch.ones(pool.num_slots, dtype=torch.bool)
        untouched[slots] = False
        assert torch.equal(pool.k[layer][untouched], before[layer][untouched])
