"""The worker's dtype: ``auto`` picks bf16 where the hardware computes it natively.

On this project's CPUs bf16 is a win only with AMX or AVX512-BF16 (Sapphire Rapids:
prefill ~3.5x fp32, batched decode ~1.6x); without them torch emulates bf16 matmuls
and batched decode gets slower than fp32, so ``auto`` keeps fp32 activations there, with
the linear weights in bf16 where AVX2 widens them in registers (libs.kernels.gemm): a
small-batch step reads half the bytes (AVX2 EPYC: decode 1.5x at batch 1 and 8; greedy
output identical to fp32 on 15 of 16 prompts, HF's own bf16 on 12). ``float32`` asked for
keeps every weight fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from libs.kernels.cpu_ext import cpu_flags  # noqa: F401 - also weights.py's, via this module

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_CHOICES = ("auto", *DTYPES)
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


class DtypeChoice(NamedTuple):
    name: str  # a key of DTYPES
    reason: str  # why, for the start-up log
    bf16_weights: bool = False  # fp32 activations over bf16 linear weights (weights.linear_kernel)


def resolve_dtype(name: str, device: torch.device | str, flags: frozenset[str] | None = None) -> DtypeChoice:
    """``name`` itself unless it is ``auto``; raises ValueError for an unknown name."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"dtype {name!r} not one of {', '.join(DTYPE_CHOICES)}")
    if name != "auto":
        return DtypeChoice(name, "asked for")
    device = torch.device(device)
    if device.type == "cuda":
        return DtypeChoice("bfloat16", "auto: CUDA")
    if device.type != "cpu":
        return DtypeChoice("float32", f"auto: {device.type}")
    found = [f for f in BF16_CPU_FLAGS if f in (cpu_flags() if flags is None else flags)]
    if found:
        return DtypeChoice("bfloat16", f"auto: the CPU has {' and '.join(found)}")
    neither = f"auto: the CPU has neither {' nor '.join(BF16_CPU_FLAGS)}"
    if {"avx2", "fma"} <= (cpu_flags() if flags is None else flags):
        return DtypeChoice("float32", f"{neither}; its linear weights in bf16 (AVX2)", True)
    return DtypeChoice("float32", neither)


def resolve_kv_dtype(name: str, choice: DtypeChoice) -> DtypeChoice:
    """The KV pool's dtype: ``name`` unless it is ``auto``, which keeps KV in bf16 where the
    model runs fp32 activations over bf16 weights (AVX2: a large batch's decode attention reads
    half the bytes; its rows are widened in registers as the weights are), else in the model's
    dtype. Raises ValueError for an unknown name, or a bf16 model over an fp32 pool."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"kv dtype {name!r} not one of {', '.join(DTYPE_CHOICES)}")
    if name != "auto":
        if (choice.name, name) == ("bfloat16", "float32"):
            raise ValueError("kv dtype float32 under a bfloat16 model: KV holds no more than the model computes")
        return DtypeChoice(name, "asked for")
    if choice.bf16_weights:
        return DtypeChoice("bfloat16", "auto: bf16 like the linear weights (AVX2 widens its rows)")
    return DtypeChoice(choice.name, "auto: the model's dtype")
