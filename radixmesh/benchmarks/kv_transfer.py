"""``python -m radixmesh.benchmarks.kv_transfer``: one prompt's KV (default 1,500 tokens of the
default model's layout: 30 layers, 3 KV heads x 64 dims) moved worker to worker by shared
memory, by NATS chunks and (when the engine imports) by the Mooncake Transfer Engine over
TCP, side by side: the sending worker in this process, the receiving one in a child
process, over a local nats-server (default max_payload: 1 MB chunks).

Timed: the KVSend round trip (gather on the sender, push, the receiver's whole-buffer
check, staged), as KVSendReply.seconds reports it, then the scatter of the staged buffer
into scattered slots (the decode step's import). Prints a markdown table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from types import SimpleNamespace

import torch

from libs.kernels import KVPool
from libs.protocol import Bus, Subjects
from libs.protocol.messages import KVDrop, KVSend, KVSendReply
from libs.transfer import DTYPES, export_slots, import_slots
from libs.transfer.mooncake import unavailable
from services.gpu_worker.kv.copy import KVCopier
from services.gpu_worker.kv.service import start_kv_paths
from services.gpu_worker.kv.transfer import KVTransferConfig
from services.gpu_worker.service import WorkerService

from .page_store import jetstream_server

PATHS = ("shm", "nats", "mooncake")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m radixmesh.benchmarks.kv_transfer", description=__doc__)
    p.add_argument("--tokens", type=int, default=1500)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--slots", type=int, default=4096, help="KV pool size of each worker")
    p.add_argument("--in-flight", type=int, default=4, help="chunk requests outstanding (nats path)")
    p.add_argument("--repeat", type=int, default=7, help="timed rounds (best and median reported)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--nats-url", default="", help="default: start a local nats-server")
    p.add_argument("--paths", default=",".join(PATHS), help="of " + ", ".join(PATHS) +
                   " (mooncake left out, with the reason, when its engine does not import)")
    p.add_argument("--receive", default="", help=argparse.SUPPRESS)  # internal: serve as the receiver "prefix:dtype"
    return p.parse_args(argv)


def bench_worker(args: argparse.Namespace, subjects: Subjects, wid: str, dtype: str) -> WorkerService:
    """A worker service over a filled pool of the bench's layout (no model: only KV moves), adopted."""
    pool = KVPool(args.layers, args.slots, args.kv_heads, args.head_dim, DTYPES[dtype])
    for t in pool.k + pool.v:
        t.normal_()
    runner = SimpleNamespace(kv=pool, kv_copies=KVCopier(pool))
    service = WorkerService(runner, wid, "bench", subjects)  # type: ignore[arg-type]
    service.adoption.adopt("bench", 3600)
    return service


async def receive(args: argparse.Namespace) -> None:
    prefix, dtype = args.receive.split(":")
    bus = await Bus.connect(args.nats_url, "kv-bench-recv")
    config = KVTransferConfig(mode="mooncake" if "mooncake" in args.paths.split(",") else "auto",
                              mooncake_host="127.0.0.1")
    await start_kv_paths(bus, bench_worker(args, Subjects(prefix), "recv", dtype), config)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
    await bus.close()


async def measure(args: argparse.Namespace, url: str, dtype: str) -> dict[str, tuple[list[float], int, int]]:
    """Seconds per KVSend by path, with the bytes and chunks of one transfer."""
    prefix = "kvb" + uuid.uuid4().hex[:8]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "radixmesh.benchmarks.kv_transfer", "--receive", f"{prefix}:{dtype}", "--nats-url", url,
        "--layers", str(args.layers), "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
        "--slots", str(args.slots), "--paths", args.paths, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    bus = await Bus.connect(url, "kv-bench-send")
    try:
        if (await asyncio.wait_for(child.stdout.readline(), 120)).strip() != b"ready":
            raise SystemExit("kv_transfer: the receiving process did not start")
        subjects, paths = Subjects(prefix), args.paths.split(",")
        for path in paths:
            config = KVTransferConfig(mode=path, in_flight=args.in_flight, mooncake_host="127.0.0.1")
            await start_kv_paths(bus, bench_worker(args, subjects, f"send-{path}", dtype), config)
        slots = torch.randperm(args.slots, generator=torch.Generator().manual_seed(0))[: args.tokens].tolist()
        times: dict[str, list[float]] = {p: [] for p in paths}
        last: dict[str, KVSendReply] = {}
        for round_ in range(args.repeat + 1):  # NOTE: paths take turns; round 0 warms up
            for path in paths:
                tid = f"{path}-{round_}"
                msg = KVSend(transfer_id=tid, slots=slots, dest_worker="recv", dest_host="", deadline_s=30)
                reply = await bus.request(subjects.worker_kv_send(f"send-{path}"), msg, KVSendReply, timeout=60)
                if not reply.ok or reply.path != path:
                    raise SystemExit(f"kv_transfer: {path} transfer failed: {reply.error or reply.path}")
                await bus.publish(subjects.worker_kv_drop("recv"), KVDrop(transfer_ids=[tid]))
                if round_:
                    times[path].append(reply.seconds)
                last[path] = reply
        return {p: (times[p], last[p].nbytes, last[p].chunks) for p in paths}
    finally:
        await bus.close()
        child.stdin.close()
        with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
            await asyncio.wait_for(child.wait(), 10)
        if child.returncode is None:
            child.kill()


def scatter_times(args: argparse.Namespace, dtype: str) -> list[float]:
    """The decode step's import of a staged (already checked) buffer into scattered slots."""
    pool = KVPool(args.layers, args.slots, args.kv_heads, args.head_dim, DTYPES[dtype])
    perm = torch.randperm(args.slots, generator=torch.Generator().manual_seed(1))
    src, dst = perm[: args.tokens], perm[args.tokens: 2 * args.tokens]
    buffer = export_slots(pool, src)
    assert buffer.intact  # NOTE: cached, as on the receiver: the import only scatters
    times = []
    for _ in range(args.repeat + 1):
        start = time.perf_counter()
        import_slots(pool, dst, buffer)
        times.append(time.perf_counter() - start)
    return times[1:]


def copy_times(args: argparse.Namespace, dtype: str) -> list[float]:
    """For scale: one contiguous copy of the same bytes, now, on this machine."""
    data = torch.empty(args.tokens * 2 * args.layers * args.kv_heads * args.head_dim, dtype=DTYPES[dtype])
    times = []
    for _ in range(args.repeat + 1):
        start = time.perf_counter()
        data.clone()
        times.append(time.perf_counter() - start)
    return times[1:]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.receive:
        asyncio.run(receive(args))
        return
    paths = args.paths.split(",")
    if not set(paths) <= set(PATHS):
        raise SystemExit(f"kv_transfer: --paths takes {', '.join(PATHS)}, not {args.paths!r}")
    if "mooncake" in paths and unavailable():
        print(f"(mooncake left out: {unavailable()})\n")
        args.paths = ",".join(p for p in paths if p != "mooncake")
    with contextlib.ExitStack() as stack:
        url = args.nats_url or stack.enter_context(jetstream_server())
        args.nats_url = url
        results = {dtype: asyncio.run(measure(args, url, dtype)) for dtype in args.dtypes.split(",")}
    print(f"{args.tokens} tokens, {args.layers} layers x {args.kv_heads} KV heads x {args.head_dim} dims, "
          f"sender and receiver in two processes, {args.threads} torch thread(s) each, "
          f"{args.in_flight} chunks in flight, broker {args.nats_url}\n")
    print("| dtype | path | MB | chunks | KVSend best ms | median ms | GB/s (best) | + import (scatter) ms "
          "| total ms | GB/s (total) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dtype, by_path in results.items():
        scatter, copy = min(scatter_times(args, dtype)), min(copy_times(args, dtype))
        nbytes = next(iter(by_path.values()))[1]
        print(f"| {dtype} | (one memcpy of these bytes, for scale) | {nbytes / 1e6:.1f} | - | {copy * 1e3:.1f} | - "
              f"| {nbytes / copy / 1e9:.2f} | - | - | - |")
        for path, (times, nbytes, chunks) in by_path.items():
            best, median = min(times), statistics.median(times)
            total = best + scatter
            print(f"| {dtype} | {path} | {nbytes / 1e6:.1f} | {chunks} | {best * 1e3:.1f} | {median * 1e3:.1f} "
                  f"| {nbytes / best / 1e9:.2f} | {scatter * 1e3:.1f} | {total * 1e3:.1f} | {nbytes / total / 1e9:.2f} |")


if __name__ == "__main__":
    main()
