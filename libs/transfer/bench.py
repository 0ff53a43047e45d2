"""``python -m libs.transfer.bench``: throughput of export/import and device <-> host copies
for one prefix, on a pool of the default model's layout (SmolLM2-135M: 30 layers, 3 KV heads
x 64 dims). Slots are scattered, as an allocator hands them out. Prints a markdown table."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from libs.kernels import KVPool

from .buffer import KVBuffer, checksum
from .codec import export_slots, import_slots
from .host_pool import HostKVPool
from .layout import DTYPES
from .tokens import gather_tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m libs.transfer.bench", description=__doc__)
    p.add_argument("--tokens", type=int, default=1500)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--slots", type=int, default=8192, help="device pool size")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per operation (best and median are reported)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    return p.parse_args(argv)


def _times(fn: Callable[[], object], repeat: int, device: torch.device) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def operations(pool: KVPool, host: HostKVPool, src: torch.Tensor, dst: torch.Tensor,
               host_slots: torch.Tensor) -> dict[str, Callable[[], object]]:
    """What is timed, by name; each moves the prefix's bytes once."""
    buf = export_slots(pool, src)
    wire = buf.to_bytes()
    rows = gather_tokens(pool, src)
    return {
        "ceiling: one contiguous copy (clone)": rows.clone,
        "gather (device, token-major)": lambda: gather_tokens(pool, src),
        "export (gather + to host + crc32)": lambda: export_slots(pool, src),
        "to_bytes (header + payload copy)": buf.to_bytes,
        "crc32 alone": lambda: checksum(buf.payload),
        "import from bytes (crc32 + scatter)": lambda: import_slots(pool, dst, KVBuffer.from_bytes(wire)),
        "import, checksum known (scatter)": lambda: import_slots(pool, dst, buf),
        "d2h (HostKVPool.save)": lambda: host.save(pool, src, host_slots),
        "h2d (HostKVPool.load)": lambda: host.load(pool, host_slots, dst),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pool = KVPool(args.layers, args.slots, args.kv_heads, args.head_dim, DTYPES[args.dtype], device)
    for t in pool.k + pool.v:
        t.normal_()
    host = HostKVPool.for_pool(pool, args.tokens)
    perm = torch.randperm(args.slots, generator=torch.Generator().manual_seed(0))
    src, dst = perm[: args.tokens], perm[args.tokens: 2 * args.tokens]
    host_slots = torch.randperm(args.tokens, generator=torch.Generator().manual_seed(1))
    nbytes = args.tokens * host.layout.token_bytes
    print(f"{args.tokens} tokens, {host.layout.describe()}, {nbytes / 1e6:.1f} MB, device {device}, "
          f"{torch.get_num_threads()} threads, host pool pinned: {host.data.is_pinned()}\n")
    print("| operation | best ms | median ms | GB/s (best) |\n|---|---:|---:|---:|")
    for name, fn in operations(pool, host, src, dst, host_slots).items():
        times = _times(fn, args.repeat, device)
        best, median = min(times), statistics.median(times)
        print(f"| {name} | {best * 1e3:.1f} | {median * 1e3:.1f} | {nbytes / best / 1e9:.2f} |")


if __name__ == "__main__":
    main()
