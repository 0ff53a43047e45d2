"""The torch attention backend against a float64 reference on ragged, mixed, paged batches."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import KVPool, get_backend
from libs.kernels.synthetic import synthetic_step

from .attention_case import Case, check_attention, random_lens
from .conftest import DEVICES


def torch_backend(pool):
    return get_backend("torch", pool)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch_fp32(gen, device, page_size, head_dim, group):
    prefix, extend = random_lens(gen, batch=6, max_prefix=70, max_extend=20)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 2, group=group, head_dim=head_dim,
                page_size=page_size, layers=2)
    check_attention(torch_backend, case, gen, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch_bf16(gen, device, group):
    prefix, extend = random_lens(gen, batch=5, max_prefix=60, max_extend=16)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 3, group=group, dtype=torch.bfloat16, page_size=16)
    check_attention(torch_backend, case, gen, device)


@pytest.mark.parametrize("prefix", range(0, 9))
def test_every_short_prefix_length(gen, prefix):
    """Prefix lengths 0..N with decode and extend rows of every kind next to each other."""
    case = Case([prefix, prefix, 0], [1, 5, 3], kv_heads=2, group=3)
    check_attention(torch_backend, case, gen)


def test_decode_only_and_extend_only_steps(gen):
    check_attention(torch_backend, Case([5, 0, 31, 12, 47], [1] * 5, kv_heads=3, group=3), gen)
    check_attention(torch_backend, Case([0, 9, 20], [7, 4, 13], kv_heads=2, group=3), gen)


def test_without_out_returns_an_equal_fresh_tensor(gen):
    pool = KVPool(1, 64, 2, 64)
    step = synthetic_step([3, 0, 9], [1, 4, 1], num_slots=64, generator=gen)
    backend = get_backend("torch", pool)
    q = torch.randn(6, 6, 64, generator=gen)
    k, v = torch.randn(6, 2, 64, generator=gen), torch.randn(6, 2, 64, generator=gen)
    backend.prepare(step.meta)
    out = backend.forward(0, q, k, v, out=torch.empty_like(q))
    backend.prepare(step.meta)
    torch.testing.assert_close(backend.forward(0, q, k, v), out)


def test_prepare_required():
    backend = get_backend("torch", KVPool(1, 4, 1, 64))
    x = torch.zeros(1, 1, 64)
    with pytest.raises(AssertionError):
        backend.forward(0, x, x, x)
