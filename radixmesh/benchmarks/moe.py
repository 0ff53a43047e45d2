"""The CPU grouped expert matmul (moe_layer.grouped_experts) against a naive loop over (token,
choice) pairs, on one sparse layer of a Qwen3-30B-A3B-shaped model (by default: 128 experts,
top-8, hidden 2048, expert width 768), random weights.

    python -m radixmesh.benchmarks.moe [--tokens 1 8 64 256] [--dtype bfloat16] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def naive(x, gate_up, down, weights, ids):
    out = torch.zeros_like(x)
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = F.linear(x[t: t + 1], gate_up[e]).chunk(2, dim=-1)
            out[t] += (weights[t, k] * F.linear(F.silu(gate) * up, down[e])[0]).to(x.dtype)
    return out


def _time(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def main(argv=None) -> None:
    from libs.kernels import ops
    from services.gpu_worker.models.moe_layer import grouped_experts
    from services.gpu_worker.models.weights import linear_kernel, pack

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default)")
    p.add_argument("--naive-max", type=int, default=64, help="skip the naive loop above this many tokens")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)  # NOTE: on a loaded machine one thread waits on no other
    g = torch.Generator().manual_seed(0)
    e, h, i = args.experts, args.hidden, args.inter
    gate_up = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype)
    down = (torch.randn(e, h, i, generator=g) / i**0.5).to(dtype)
    kernel = linear_kernel("auto", dtype, torch.device("cpu"))
    packed = ([pack(w, kernel) for w in gate_up], [pack(w, kernel) for w in down]) if kernel != "plain" else None
    print(f"{e} experts, top-{args.top_k}, hidden {h}, expert width {i}, {args.dtype}, "
          f"{torch.get_num_threads()} threads; packed kernel: {kernel}; ms per layer")
    print("| tokens | naive (token, choice) loop | grouped, plain weights | grouped, packed | packed vs naive |")
    print("|---:|---:|---:|---:|---:|")
    for t in args.tokens:
        x = torch.randn(t, h, generator=g).to(dtype)
        ids = torch.rand(t, e, generator=g).argsort(-1)[:, : args.top_k]
        weights = torch.rand(t, args.top_k, generator=g).to(dtype)
        repeat = max(2, 64 // t)
        slow = _time(lambda: naive(x, gate_up, down, weights, ids), 2) if t <= args.naive_max else float("nan")
        plain = _time(lambda: grouped_experts(x, gate_up, down, weights, ids, ops.silu_mul), repeat)
        fast = (_time(lambda: grouped_experts(x, *packed, weights, ids, ops.silu_mul), repeat)
                if packed else float("nan"))
        print(f"| {t} | {slow:.1f} | {plain:.1f} | {fast:.1f} | {slow / fast:.1f}x |")


if __name__ == "__main__":
    main()
