"""Attention on the CPU over the paged pool, kernel against kernel: ``python -m libs.kernels.bench_cpu``.

    python -m libs.kernels.bench_cpu [--batches 1 8 32 64] [--context 256] [--prefix 1000 --chunk 512]
                                     [--dtypes float32 bfloat16] [--page 1] [--threads 1] [--window W]

Times one step's attention (every layer: store the new K/V, attend) of the torch
backend, the first C++ kernel (``cpu_v1``: C++ decode, torch extend) and the
``cpu`` backend (C++ decode and extend), plus the same decode math on contiguous
[B, kv_heads, L, D] caches (no gather): decode at each batch over ``--context``
tokens, and one extend of ``--chunk`` tokens over a ``--prefix``-token cached
prefix. Variants are timed round-robin, so machine noise falls on all of them
alike; medians. Model shape defaults to SmolLM2-135M (9 heads, 3 KV heads, head
dim 64, 30 layers). Each timed layer has its own pool so nothing stays in cache
between layers; the step time is the per-layer median times ``--layers``. ``--window W``: every
layer attends within a W-token sliding window (backends without windows left out; the
contiguous yardstick over the last W keys).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from .kv_pool import KVPool
from .registry import _backend_class, available_backends, get_backend
from .synthetic import synthetic_step

DISTINCT_LAYERS = 16  # pools kept in memory: at batch 8 and up, more than a 32 MB L3 holds
BACKENDS = ("torch", "cpu_v1", "cpu")


def contiguous_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per request ([B, H, D]) over contiguous caches [B, kv_heads, L, D]: the no-gather baseline."""
    b, kv_heads, _, dim = keys.shape
    qg = q.view(b, kv_heads, -1, dim).float()
    scores = torch.matmul(qg, keys.float().transpose(-1, -2))
    probs = torch.softmax(scores.mul_(scale), dim=-1)
    return torch.matmul(probs, values.float()).view(b, -1, dim).to(q.dtype)


def _interleaved_ms(fns: dict[str, object], layers: int, repeats: int) -> dict[str, float]:
    """Median ms per layer of each fn, timed round-robin so machine noise hits all alike.
    NOTE: each fn walks every layer before the next fn starts: run one after another on
    the same layer, the second would find the first's rows in the caches."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn(0)  # warm-up
    for _ in range(repeats):
        for name, fn in fns.items():
            for layer in range(layers):
                t0 = time.perf_counter()
                fn(layer)
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def _step_fns(args, dtype, prefix: list[int], extend: list[int], backends: list[str]) -> dict[str, object]:
    """forward(layer) of each backend over one pool holding the step (random K/V)."""
    kvh, dim, tokens = args.kv_heads, args.head_dim, sum(extend)
    slots = 2 * sum(p + e + args.page for p, e in zip(prefix, extend))
    pool = KVPool(DISTINCT_LAYERS, slots, kvh, dim, dtype)
    for t in pool.k + pool.v:
        t.normal_()
    step = synthetic_step(prefix, extend, num_slots=pool.num_slots, page_size=args.page)
    q = torch.randn(tokens, args.heads, dim).to(dtype)
    k_new, v_new = torch.randn(tokens, kvh, dim).to(dtype), torch.randn(tokens, kvh, dim).to(dtype)
    fns = {}
    for name in backends:
        backend = get_backend(name, pool, dim**-0.5)
        if args.window:
            backend.set_windows((args.window,) * DISTINCT_LAYERS)
        backend.prepare(step.meta)  # once per step, as in the worker
        fns[name] = lambda layer, b=backend: b.forward(layer, q, k_new, v_new)
    return fns


def bench_decode(args, dtype, batch: int, backends: list[str]) -> dict[str, float]:
    kvh, dim, ctx = args.kv_heads, args.head_dim, args.context
    fns = _step_fns(args, dtype, [ctx - 1] * batch, [1] * batch, backends)
    q = torch.randn(batch, args.heads, dim).to(dtype)
    seen = min(ctx, args.window or ctx)
    caches = [(torch.randn(batch, kvh, seen, dim).to(dtype), torch.randn(batch, kvh, seen, dim).to(dtype))
              for _ in range(DISTINCT_LAYERS)]
    fns["contiguous"] = lambda i: contiguous_decode(q, *caches[i], dim**-0.5)
    return {name: ms * args.layers for name, ms in _interleaved_ms(fns, DISTINCT_LAYERS, args.repeats).items()}


def bench_extend(args, dtype, backends: list[str]) -> dict[str, float]:
    fns = _step_fns(args, dtype, [args.prefix], [args.chunk], backends)
    return {name: ms * args.layers for name, ms in _interleaved_ms(fns, DISTINCT_LAYERS, args.repeats).items()}


def _row(label: str, r: dict[str, float], columns: list[str]) -> str:
    cells = " | ".join(f"{r[c]:.1f}" for c in columns)
    speedup = f"{r['cpu_v1'] / r['cpu']:.2f}x" if {"cpu", "cpu_v1"} <= r.keys() else "-"
    return f"| {label} | {cells} | {speedup} |"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m libs.kernels.bench_cpu", description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prefix", type=int, default=1000)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--page", type=int, default=1, help="page size of the synthetic slot tables")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--window", type=int, default=0, help="a sliding window on every layer (0: none)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    backends = [name for name in BACKENDS if name in available_backends("cpu")
                and (not args.window or _backend_class(name).sliding_window)]
    window = f", a {args.window}-token window" if args.window else ""
    print(f"attention ms per step ({args.layers} layers), {args.heads}/{args.kv_heads} heads, D={args.head_dim}, "
          f"page size {args.page}, {args.threads} thread(s){window}, medians of {args.repeats} interleaved rounds")
    columns = ["contiguous", *backends]
    print("| step | dtype | " + " | ".join(columns) + " | cpu_v1 / cpu |")
    print("|---" * (len(columns) + 3) + "|")
    for dtype in args.dtypes:
        for batch in args.batches:
            r = bench_decode(args, getattr(torch, dtype), batch, backends)
            print(_row(f"decode, batch {batch}, {args.context} ctx | {dtype}", r, columns), flush=True)
        r = bench_extend(args, getattr(torch, dtype), backends)
        r["contiguous"] = float("nan")
        print(_row(f"extend {args.chunk} over {args.prefix} | {dtype}", r, columns), flush=True)


if __name__ == "__main__":
    main()
