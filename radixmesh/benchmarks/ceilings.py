"""What this machine allows, measured now: a matmul at the model's shapes, a memory copy.

One measurement for every benchmark that prints its distance to the limit
(``python -m radixmesh.benchmarks.worker_step``, ``radixmesh bench``): the best of a few
runs (a ceiling: the least disturbed one), at the caller's thread count.

- matmul: a decode batch of ``batch`` rows through the model's largest per-layer
  weight (the fused gate/up projection, hidden -> 2 x intermediate), in the dtype
  given; ``packed``: over the weight packed for oneDNN, as the workers run bf16.
- copy: one large tensor copied (bytes read + written per second).
- the batch-1 decode bound: one step reads every weight once, so at that copy
  rate (half of it reads) no step takes less than weights / (copy / 2).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from services.gpu_worker.models.config import ModelConfig
from services.gpu_worker.models.weights import can_pack, linear, pack

BATCH = 64  # the decode-batch shape the matmul is measured at
COPY_MIB = 128  # src + dst: 256 MiB, past the last-level cache
REPEAT = 5
CALLS = 5  # matmuls per timed run
SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def rate(fn, work: float, repeat: int = REPEAT) -> float:
    """``work`` per second of ``fn``, the best of ``repeat`` after one untimed call."""
    fn()
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return work / best


def mlp_shape(config: ModelConfig) -> tuple[int, int]:
    """(in, out) features of the model's largest per-layer matmul: the fused gate/up."""
    return config.hidden_size, 2 * config.intermediate_size


def matmul_gflops(k: int, n: int, dtype: torch.dtype, packed: bool = False, batch: int = BATCH,
                  repeat: int = REPEAT) -> float:
    """GFLOP/s of ``batch`` x ``k`` @ ``k`` x ``n`` in ``dtype``; NaN for ``packed`` where
    this machine has no packed form (fp32, or oneDNN without bf16)."""
    x, w = torch.randn(batch, k).to(dtype), torch.randn(n, k).to(dtype)
    if packed:
        if not can_pack(dtype, torch.device("cpu")):
            return math.nan
        w = pack(w)
    flop = 2 * batch * k * n
    return rate(lambda: [linear(x, w) for _ in range(CALLS)], CALLS * flop, repeat) / 1e9


def copy_gbs(mib: int = COPY_MIB, repeat: int = REPEAT) -> float:
    """GB/s of one ``mib``-MiB tensor copy, bytes read + written."""
    src = torch.empty(mib * 2**18, dtype=torch.float32)
    dst = torch.empty_like(src)
    return rate(lambda: dst.copy_(src), 2 * src.numel() * 4, repeat) / 1e9


def linear_params(config: ModelConfig) -> tuple[int, int]:
    """(every layer's linear weights, the LM head's) in elements."""
    c = config
    per_layer = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim * c.hidden_size
    per_layer += c.num_heads * c.head_dim * c.hidden_size + 3 * c.intermediate_size * c.hidden_size
    return c.num_layers * per_layer, c.vocab_size * c.hidden_size


def weight_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights a decode step reads (every linear and the LM head)."""
    return sum(linear_params(config)) * torch.empty(0, dtype=dtype).element_size()


def decode_bound(copy: float, config: ModelConfig, dtype: torch.dtype) -> float:
    """Batch-1 decode steps/s at most at ``copy`` GB/s (read + write)."""
    return copy / 2 * 1e9 / weight_bytes(config, dtype)


def step_bound(tokens: int, logits: int, config: ModelConfig, dtype: torch.dtype, matmul_gflops: float,
               copy: float) -> float:
    """Tokens/s at most for steps of ``tokens`` tokens, ``logits`` of them through the LM
    head (a decode step: all; a prefill chunk: its last): such a step reads every weight
    once (at half the ``copy`` rate) and does its linears' work (2 FLOP per weight element
    and token) at ``matmul_gflops``, whichever takes longer. Attention is left out: the
    bound is the linears' roofline."""
    body, head = linear_params(config)
    flop = 2 * (tokens * body + logits * head)
    seconds = max(flop / (matmul_gflops * 1e9), weight_bytes(config, dtype) / (copy / 2 * 1e9))
    return tokens / seconds


@dataclass(frozen=True)
class Ceilings:
    threads: int
    dtype: str  # "fp32" | "bf16"
    shape: tuple[int, int, int]  # batch, in, out of the matmul
    packed: bool  # the matmul ran over a oneDNN-packed weight (as bf16 workers do)
    matmul_gflops: float
    copy_gbs: float
    decode_steps: float  # the batch-1 decode bound at that copy rate

    def line(self) -> str:
        m, k, n = self.shape
        how = f"{self.dtype}{' packed' if self.packed else ''}"
        return (f"ceilings (measured in this run, {self.threads} threads, best of {REPEAT}): "
                f"matmul {m}x{k} @ {k}x{n} {how} {self.matmul_gflops:.0f} GFLOP/s; copy "
                f"{self.copy_gbs:.1f} GB/s (read + write), so batch-1 decode <= "
                f"{self.decode_steps:.0f} steps/s")


def measure(config: ModelConfig, dtype: torch.dtype, threads: int, mib: int = COPY_MIB) -> Ceilings:
    """The ceilings for workers of ``config`` in ``dtype`` at ``threads`` torch threads (the
    matmul on the path the workers take: packed where bf16 can be)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        k, n = mlp_shape(config)
        packed = can_pack(dtype, torch.device("cpu"))
        mm = matmul_gflops(k, n, dtype, packed=packed)
        copy = copy_gbs(mib)
    finally:
        torch.set_num_threads(before)
    return Ceilings(threads, SHORT[dtype], (BATCH, k, n), packed, mm, copy,
                    decode_bound(copy, config, dtype))
