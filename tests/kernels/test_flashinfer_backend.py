"""FlashInfer's wrappers over our pool against a float64 reference (CUDA with flashinfer only)."""

from __future__ import annotations

import pytest
import torch

from libs.kernels import BackendNotAvailable, get_backend

from .attention_case import Case, check_attention, random_lens

if not torch.cuda.is_available():
    pytest.skip("flashinfer needs CUDA", allow_module_level=True)
pytest.importorskip("flashinfer")


def flashinfer_backend(pool):
    return get_backend("flashinfer", pool)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch(gen, dtype, page_size, head_dim, group):
    prefix, extend = random_lens(gen, batch=6, max_prefix=300, max_extend=40)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 2, group=group, head_dim=head_dim,
                dtype=dtype, page_size=page_size, layers=2)
    check_attention(flashinfer_backend, case, gen, "cuda")


@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_only_step(gen, group):
    prefix = torch.randint(1, 2000, (16,), generator=gen).tolist()
    case = Case(prefix, [1] * 16, kv_heads=2, group=group, dtype=torch.bfloat16, layers=2)
    check_attention(flashinfer_backend, case, gen, "cuda")


def test_float32_pool_is_refused():
    from libs.kernels import KVPool

    with pytest.raises(BackendNotAvailable, match="float16/bfloat16"):
        get_backend("flashinfer", KVPool(1, 8, 2, 64, torch.float32, "cuda"))


@pytest.mark.parametrize("window", [1, 16, 100])
def test_sliding_windows(gen, window):
    """window_left per layer (flashinfer_plan.py): mixed steps (the prefill wrapper) and decode-only
    steps (the decode wrappers), a windowed layer beside a global one."""
    prefix, extend = random_lens(gen, batch=6, max_prefix=300, max_extend=40)
    for lens in (extend, [1] * 6):
        case = Case(prefix, lens, kv_heads=2, group=4, dtype=torch.bfloat16, layers=2, windows=(window, None))
        check_attention(flashinfer_backend, case, gen, "cuda")
