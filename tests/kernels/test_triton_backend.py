"""The Triton attention kernels against a float64 reference: in the interpreter on a CPU, compiled on CUDA.

Small shapes and small tiles (16) so that one case crosses several key blocks,
query blocks and decode splits while the interpreter stays fast.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from libs.kernels import get_backend  # noqa: E402
from libs.kernels.triton_backend import TritonAttentionBackend  # noqa: E402

from .attention_case import Case, check_attention, random_lens  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def small_tiles(pool):
    return TritonAttentionBackend(pool, block_m=16, block_n=16, min_split_len=16)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_mixed_batch_fp32(gen, page_size, head_dim, group):
    prefix, extend = random_lens(gen, batch=4, max_prefix=40, max_extend=20)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 2, group=group, head_dim=head_dim, page_size=page_size)
    check_attention(small_tiles, case, gen, DEVICE)


@pytest.mark.parametrize("group", [1, 8])
def test_ragged_mixed_batch_bf16(gen, group):
    prefix, extend = random_lens(gen, batch=4, max_prefix=40, max_extend=20)
    case = Case(prefix, extend, kv_heads=1 if group == 8 else 2, group=group, dtype=torch.bfloat16, page_size=16)
    check_attention(small_tiles, case, gen, DEVICE)


def test_split_k_decode_long_and_short_contexts(gen):
    """Up to 16 splits: short requests leave splits empty, long ones fill them; layers reuse the step."""
    lens = torch.randint(0, 200, (5,), generator=gen).tolist()
    case = Case(lens[:-1] + [300], [1] * 5, kv_heads=2, group=3, layers=2)
    backend = {}

    def make(pool):
        backend["b"] = TritonAttentionBackend(pool, block_n=16, min_split_len=16, max_splits=16)
        return backend["b"]

    check_attention(make, case, gen, DEVICE)
    if DEVICE == "cpu":
        assert backend["b"]._step.splits[None] == 16


@pytest.mark.parametrize("window", [1, 5, 16, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_windows(gen, window, dtype):
    """Windows shorter and longer than the sequences, a windowed layer beside a global one; query
    blocks (32) taller than key blocks (16), so a row may see nothing of its block's first keys.
    Decode splits and extend blocks start at the window."""
    case = Case([0, 15, 16, 40, 3, 60], [20, 1, 17, 1, 33, 1], kv_heads=2, group=3, layers=2, dtype=dtype,
                windows=(window, None))
    backend = {}

    def make(pool):
        backend["b"] = TritonAttentionBackend(pool, block_m=32, block_n=16, min_split_len=16, max_splits=4)
        return backend["b"]

    check_attention(make, case, gen, DEVICE)
    assert backend["b"]._step.splits[window] == min(4, -(-min(61, window) // 16))


@pytest.mark.parametrize("prefix", [0, 1, 15, 16, 17])
def test_prefix_lengths_around_tile_edges(gen, prefix):
    check_attention(small_tiles, Case([prefix, prefix, 0], [1, 17, 16], kv_heads=2, group=3), gen, DEVICE)


def test_default_tiles_by_name(gen):
    prefix, extend = random_lens(gen, batch=3, max_prefix=70, max_extend=40)
    check_attention(lambda pool: get_backend("triton", pool), Case(prefix, extend, kv_heads=2, group=3), gen, DEVICE)
