"""Decode attention on the CPU: paged pool (scattered slots) vs contiguous per-request caches.

    python -m libs.kernels.bench_cpu [--batch 32] [--contexts 512 2048] [--threads 1]

Times one decode step of the torch backend (every layer: store the new K/V,
gather, attend) and of the cpu backend (C++, reads the pool in place) for page
sizes 1 and 16, against the same attention math on contiguous
[B, kv_heads, L, D] caches (no gather). Variants are timed round-robin, so
machine noise falls on all of them alike. Model shape defaults to
SmolLM2-135M (9 heads, 3 KV heads, head dim 64, 30 layers). Each timed layer
has its own pool so nothing stays in cache between layers; the step time is
the per-layer median times ``--layers``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from .kv_pool import KVPool
from .synthetic import synthetic_step
from .registry import available_backends, get_backend

DISTINCT_LAYERS = 4  # pools kept in memory; enough to defeat the caches


def contiguous_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per request ([B, H, D]) over contiguous caches [B, kv_heads, L, D]: the no-gather baseline."""
    b, kv_heads, _, dim = keys.shape
    scores = torch.matmul(q.view(b, kv_heads, -1, dim), keys.transpose(-1, -2))
    probs = torch.softmax(scores.mul_(scale), dim=-1)
    return torch.matmul(probs, values).view(b, -1, dim)


def _interleaved_ms(fns: dict[str, object], layers: int, repeats: int) -> dict[str, float]:
    """Median ms per layer of each fn, timed round-robin so machine noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():
        fn(0)  # warm-up
    for _ in range(repeats):
        for layer in range(layers):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn(layer)
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def _paged(args, q, k_new, v_new, context: int, page: int, backend_name: str):
    b, kvh, dim = args.batch, args.kv_heads, args.head_dim
    pool = KVPool(DISTINCT_LAYERS, 2 * b * (context + page), kvh, dim, getattr(torch, args.dtype))
    for t in pool.k + pool.v:
        t.normal_()
    step = synthetic_step([context - 1] * b, [1] * b, num_slots=pool.num_slots, page_size=page)
    backend = get_backend(backend_name, pool, dim**-0.5)
    backend.prepare(step.meta)  # once per step, as in the worker
    return lambda layer: backend.forward(layer, q, k_new, v_new)


def bench_context(args, context: int, backends: list[str]) -> dict[str, float]:
    b, kvh, dim, heads = args.batch, args.kv_heads, args.head_dim, args.heads
    dtype = getattr(torch, args.dtype)
    scale = dim**-0.5
    q = torch.randn(b, heads, dim, dtype=dtype)
    k_new, v_new = torch.randn(b, kvh, dim, dtype=dtype), torch.randn(b, kvh, dim, dtype=dtype)
    caches = [
        (torch.randn(b, kvh, context, dim, dtype=dtype), torch.randn(b, kvh, context, dim, dtype=dtype))
        for _ in range(DISTINCT_LAYERS)
    ]
    fns = {"contiguous": lambda i: contiguous_decode(q, *caches[i], scale)}
    for name in backends:
        for page in (1, 16):
            fns[f"{name} P={page}"] = _paged(args, q, k_new, v_new, context, page, name)
    row = _interleaved_ms(fns, DISTINCT_LAYERS, args.repeats)
    return {name: ms * args.layers for name, ms in row.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m libs.kernels.bench_cpu", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"decode attention ms/step, batch {args.batch}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, "
          f"D={args.head_dim}, {args.dtype}, {args.threads} thread(s)")
    backends = [name for name in ("torch", "cpu") if name in available_backends("cpu")]
    columns = [f"{name} P={page}" for name in backends for page in (1, 16)]
    print("| context | contiguous | " + " | ".join(columns) + " | "
          + " | ".join(f"{c} / contiguous" for c in columns) + " |")
    print("|---:" * (2 + 2 * len(columns)) + "|")
    for context in args.contexts:
        r = bench_context(args, context, backends)
        c = r["contiguous"]
        times = " | ".join(f"{r[col]:.1f}" for col in columns)
        ratios = " | ".join(f"{r[col] / c:.2f}x" for col in columns)
        print(f"| {context} | {c:.1f} | {times} | {ratios} |", flush=True)

if __name__ == "__main__":
    main()
