"""Linear layers in C++ over bf16 weights packed once: bf16 activations on AVX512-BF16's dot
instruction (``csrc/gemm_bf16.cpp``, for CPUs without AMX), fp32 activations on AVX2 + FMA
(``csrc/gemm_f32.cpp``: the weight widened in registers, for CPUs without native bf16
products, where a small-batch step is bound by reading the weights and bf16 halves them).

A weight [out, in] is packed once into tiles of output columns, each ``in / 2`` rows of column
pairs (int32: elements ``2k`` and ``2k + 1`` of a row in its low and high half), as wide as
the kernel that runs them reads: 64 columns for the dot instruction (4 registers of 16
pairs), 16 for the fp32 kernel (two registers' worth of columns, so each of its calls reads
one contiguous stream); ``linear`` then streams each tile once per call whatever the batch. Where oneDNN has AMX its own packed matmul is faster for large batches
and stays in use (``services/gpu_worker/models/weights.py`` decides).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cpu_ext
from .errors import BackendNotAvailable

TILE = 64  # columns per tile under bf16 activations (gemm_bf16.cpp)
F32_TILE = 16  # under fp32 activations (gemm_f32.cpp)


@dataclass(frozen=True)
class TiledWeight:
    """A bf16 weight in the kernel's tiles; ``shape`` is the plain weight's [out, in]."""

    tiles: torch.Tensor  # [ceil(out / tile), in / 2, tile] int32
    shape: tuple[int, int]


def f32_available() -> bool:
    """Whether the fp32-activation kernel is built here (the C++ module loads; AVX2 and FMA).
    NOTE: not cached: the answer is the level ``cpu_ext.load()`` gives now (its own cache)."""
    try:
        return bool(cpu_ext.load().gemm_f32())
    except BackendNotAvailable:
        return False


def available() -> bool:
    """Whether the bf16-activation kernel is built here (the C++ module loads at a level with AVX512-BF16)."""
    try:
        return bool(cpu_ext.load().gemm_bf16())
    except BackendNotAvailable:
        return False


def tile_for(activations: torch.dtype) -> int:
    """The tile width of the kernel that runs ``activations``' dtype: F32_TILE for fp32, TILE for bf16."""
    return F32_TILE if activations == torch.float32 else TILE


def pack(weight: torch.Tensor, tile: int = TILE) -> TiledWeight:
    """``weight`` [out, in] (bf16, or fp32 rounded to bf16; ``in`` even) in tiles ``tile`` columns
    wide (``tile_for`` the activations' dtype)."""
    if tile not in (TILE, F32_TILE):
        raise ValueError(f"tiles are {TILE} (bf16 activations) or {F32_TILE} (fp32) columns wide, not {tile}")
    if weight.dtype not in (torch.bfloat16, torch.float32) or weight.dim() != 2 or weight.shape[1] % 2:
        raise ValueError(f"pack takes a 2-d bf16 or fp32 weight with an even width, not {weight.dtype} {tuple(weight.shape)}")
    weight = weight.to(torch.bfloat16)
    out, width = weight.shape
    tiles = -(-out // tile)
    pairs = weight.contiguous().view(torch.int32)  # NOTE: [out, in / 2]: little-endian pairs
    padded = torch.zeros(tiles * tile, width // 2, dtype=torch.int32, device=weight.device)
    padded[:out] = pairs
    return TiledWeight(padded.view(tiles, tile, width // 2).transpose(1, 2).contiguous(), (out, width))


def linear(x: torch.Tensor, w: TiledWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` accumulated in fp32, in ``x``'s dtype: bf16 (AVX512-BF16) or fp32
    (AVX2), over tiles packed for it (``tile_for(x.dtype)``); ``x`` [M, in], ``bias`` [out] of
    ``x``'s dtype."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    module = cpu_ext.load()
    run = module.linear_bf16w if x.dtype == torch.float32 else module.linear_bf16
    return run(x, w.tiles, w.shape[0], bias)


# NOTE: gemm_f32.cpp runs blocks of one or two rows on two accumulator chains (even and odd
# k, added at the end) and blocks of three or four, and the panels of 40 rows and up, on one
# chain in k order: below 40 rows, a batch padded to a multiple of 4 runs every row on the one chain
FIXED_ROWS, FIXED_WIDE_FROM = 4, 40


def linear_fixed(x: torch.Tensor, w: TiledWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` on the fp32 kernel (tiles ``F32_TILE`` wide) with each row's arithmetic the same
    whatever the batch: bf16 ``x`` widened to fp32 and the result rounded back, the batch padded
    (FIXED_ROWS); for a deterministic mode on CPUs without AVX512-BF16."""
    m = x.shape[0]
    wide = x.float()
    if m < FIXED_WIDE_FROM and m % FIXED_ROWS:
        wide = torch.cat([wide, wide.new_zeros(FIXED_ROWS - m % FIXED_ROWS, wide.shape[1])])
    out = cpu_ext.load().linear_bf16w(wide.contiguous(), w.tiles, w.shape[0], None if bias is None else bias.float())
    return out[:m].to(x.dtype)

