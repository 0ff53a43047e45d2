"""Small KV pools filled with distinct random values (no model)."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool


def filled_pool(num_slots: int = 64, layers: int = 3, heads: int = 2, dim: int = 4,
                dtype: torch.dtype = torch.float32, seed: int = 0) -> KVPool:
    pool = KVPool(layers, num_slots, heads, dim, dtype)
    gen = torch.Generator().manual_seed(seed)
    for layer in range(layers):
        pool.k[layer].copy_(torch.randn(pool.k[layer].shape, generator=gen))
        pool.v[layer].copy_(torch.randn(pool.v[layer].shape, generator=gen))
    return pool


def snapshot(pool: KVPool) -> list[torch.Tensor]:
    return [t.clone() for t in pool.k + pool.v]


@pytest.fixture
def pool() -> KVPool:
    return filled_pool()


@pytest.fixture(scope="module")
def jetstream():
    """A nats-server with JetStream for one test module."""
    from .jetstream import JetStreamServer

    with JetStreamServer() as server:
        yield server
