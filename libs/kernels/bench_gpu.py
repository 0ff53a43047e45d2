"""Correctness and speed of every available attention backend on one device (an H200 in < 5 min).

    python -m libs.kernels.bench_gpu                 # CUDA: bf16, Llama-8B shape (32/8 heads, D=128)
    python -m libs.kernels.bench_gpu --quick --device cpu   # tiny shapes, torch only (CI)

1. Copy ceiling: the device's measured copy bandwidth (bytes read + written).
2. Correctness: each backend on a mixed batch (prefill, prefix + extend, decode;
   page sizes 1 and 16) against a float64 reference; any miss exits with 1.
3. Decode: one query per request over scattered slots, for several batch sizes
   and contexts; achieved bandwidth = K/V bytes read / time, against the ceiling.
4. Extend: new tokens over a cached prefix; TFLOP/s and bandwidth.

Every timed output is also checked against the torch backend. Configurations
still pending when ``--budget`` seconds have passed are skipped, with a note.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from .kv_pool import KVPool
from .registry import available_backends, get_backend
from .synthetic import SyntheticStep, reference_attention, synthetic_step


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int


FULL = dict(
    shape=Shape(32, 8, 128), copy_mib=1024, max_tokens=2_100_000,
    decode=[(b, n) for b in (1, 16, 64, 256) for n in (1024, 8192, 32768)],
    extend=[(1, 0, 8192), (4, 0, 2048), (8, 4096, 512), (32, 1024, 128)],
    check=([0, 700, 3000, 1, 150], [900, 64, 1, 1, 200]), iters=20,
)
QUICK = dict(
    shape=Shape(4, 2, 64), copy_mib=32, max_tokens=4096,
    decode=[(1, 64), (4, 256), (8, 512)], extend=[(2, 0, 48), (2, 64, 16)],
    check=([0, 40, 9, 1], [20, 5, 1, 1]), iters=3,
)


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn, iters: int) -> float:
        """Median seconds of ``fn()`` over ``iters`` runs after one warm-up."""
        fn()
        self.sync()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]


def copy_ceiling(device: torch.device, mib: int, timer: Timer) -> float:
    """GB/s of a large device-to-device copy, counting the bytes read and written."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timer(lambda: dst.copy_(src), 10) / 1e9


def _inputs(shape: Shape, tokens: int, dtype, device, gen):
    make = lambda h: torch.randn(tokens, h, shape.head_dim, generator=gen).to(device, dtype)  # noqa: E731
    return make(shape.heads), make(shape.kv_heads), make(shape.kv_heads)


def _step(prefix, extend, pool: KVPool, page: int, gen, device) -> SyntheticStep:
    return synthetic_step(prefix, extend, num_slots=pool.num_slots, page_size=page, generator=gen, device=device)


def check_backend(name: str, pool: KVPool, cfg: dict, gen, device) -> float:
    """Worst relative error of ``name`` against float64 on the mixed check batch (page sizes 1 and 16)."""
    worst = 0.0
    for page in (1, 16):
        prefix, extend = cfg["check"]
        step = _step(prefix, extend, pool, page, gen, device)
        backend = get_backend(name, pool)
        backend.prepare(step.meta)
        q, k, v = _inputs(cfg["shape"], step.meta.num_tokens, pool.dtype, device, gen)
        out = torch.full_like(q, float("nan"))
        backend.forward(0, q, k, v, out=out)
        for i, span in enumerate(step.token_spans):
            owned = step.owned[i]
            ref = reference_attention(q[span], pool.k[0][owned], pool.v[0][owned], prefix[i], backend.scale)
            worst = max(worst, float((out[span].double() - ref).abs().max() / ref.abs().max()))
    return worst


def time_step(name: str, pool: KVPool, step: SyntheticStep, qkv, cfg: dict, timer: Timer):
    """(seconds per forward, seconds per prepare, output) of backend ``name`` on ``step``."""
    q, k, v = qkv
    backend = get_backend(name, pool)
    prep = timer(lambda: backend.prepare(step.meta), max(1, cfg["iters"] // 4))
    out = torch.empty_like(q)
    seconds = timer(lambda: backend.forward(0, q, k, v, out=out), cfg["iters"])
    return seconds, prep, out


def _rel_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m libs.kernels.bench_gpu", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CI on a CPU)")
    p.add_argument("--backends", nargs="+", default=None, help="default: every available one (torch only on cpu)")
    p.add_argument("--budget", type=float, default=270.0, help="seconds before pending timings are skipped")
    args = p.parse_args(argv)
    started = time.perf_counter()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    cfg = QUICK if args.quick else FULL
    names = args.backends or (available_backends(device, dtype) if device.type == "cuda" else ["torch"])
    gen = torch.Generator().manual_seed(0)
    timer = Timer(device)
    shape: Shape = cfg["shape"]
    print(f"# attention backends on {_device_name(device)}: {', '.join(names)}; {dtype}; "
          f"heads {shape.heads}/{shape.kv_heads}, D={shape.head_dim}")
    ceiling = copy_ceiling(device, cfg["copy_mib"], timer)
    print(f"copy ceiling: {ceiling:.0f} GB/s (read + write)\n")

    pool = KVPool(1, cfg["max_tokens"] + 4096, shape.kv_heads, shape.head_dim, dtype, device)
    for t in pool.k + pool.v:
        t.normal_()
    failed = False
    print("| backend | max rel. error vs float64 | verdict |\n|---|---:|---|")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name in names:
        err = check_backend(name, pool, cfg, gen, device)
        failed |= not err <= tol
        print(f"| {name} | {err:.1e} | {'ok' if err <= tol else 'FAIL'} |", flush=True)

    elt = pool.k[0].element_size()
    row_bytes = 2 * shape.kv_heads * shape.head_dim * elt  # K and V of one token
    print("\n## decode (one query per request, scattered slots)\n")
    print("| batch | context | backend | ms | GB/s | % of copy | prepare ms | vs torch |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for batch, context in cfg["decode"]:
        if batch * context > cfg["max_tokens"]:
            continue
        step = _step([context - 1] * batch, [1] * batch, pool, 1, gen, device)
        qkv = _inputs(shape, batch, dtype, device, gen)
        ref = _torch_reference(pool, step, qkv)
        for name in names:
            if time.perf_counter() - started > args.budget:
                print(f"| {batch} | {context} | {name} | skipped: over the {args.budget:.0f} s budget | | | | |")
                continue
            sec, prep, out = time_step(name, pool, step, qkv, cfg, timer)
            diff = _rel_diff(out, ref)
            gbs = batch * context * row_bytes / sec / 1e9
            failed |= not diff <= 2 * tol
            print(f"| {batch} | {context} | {name} | {sec * 1e3:.3f} | {gbs:.0f} | {100 * gbs / ceiling:.0f}% "
                  f"| {prep * 1e3:.2f} | {diff:.0e} |", flush=True)

    print("\n## extend (new tokens over a cached prefix)\n")
    print("| batch | prefix | new | backend | ms | TFLOP/s | GB/s | vs torch |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for batch, prefix, new in cfg["extend"]:
        step = _step([prefix] * batch, [new] * batch, pool, 1, gen, device)
        flops = 4 * batch * new * (prefix + (new + 1) / 2) * shape.heads * shape.head_dim
        qkv = _inputs(shape, batch * new, dtype, device, gen)
        ref = _torch_reference(pool, step, qkv)
        for name in names:
            if time.perf_counter() - started > args.budget:
                print(f"| {batch} | {prefix} | {new} | {name} | skipped: over the {args.budget:.0f} s budget | | | |")
                continue
            sec, _, out = time_step(name, pool, step, qkv, cfg, timer)
            diff = _rel_diff(out, ref)
            failed |= not diff <= 2 * tol
            print(f"| {batch} | {prefix} | {new} | {name} | {sec * 1e3:.3f} | {flops / sec / 1e12:.2f} "
                  f"| {batch * (prefix + new) * row_bytes / sec / 1e9:.0f} | {diff:.0e} |", flush=True)
    print(f"\n{'FAILED' if failed else 'all checks ok'} in {time.perf_counter() - started:.0f} s")
    return 1 if failed else 0


def _torch_reference(pool: KVPool, step: SyntheticStep, qkv) -> torch.Tensor:
    backend = get_backend("torch", pool)
    backend.prepare(step.meta)
    return backend.forward(0, *qkv)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


if __name__ == "__main__":
    sys.exit(main())
