"""The worker's dtype: ``auto`` picks bf16 where the hardware computes it natively.

On this project's CPUs bf16 is a win only with AMX or AVX512-BF16 (Sapphire Rapids:
prefill ~3.5x fp32, batched decode ~1.6x); without them torch emulates bf16 matmuls
and batched decode gets slower than fp32, so ``auto`` keeps fp32 there.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_CHOICES = ("auto", *DTYPES)
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


class DtypeChoice(NamedTuple):
    name: str  # a key of DTYPES
    reason: str  # why, for the start-up log


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo is unreadable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


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
    return DtypeChoice("float32", f"auto: the CPU has neither {' nor '.join(BF16_CPU_FLAGS)}")
