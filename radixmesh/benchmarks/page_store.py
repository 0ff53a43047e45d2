"""``python -m radixmesh.benchmarks.page_store``: the shared page store (JetStream KV; ``--backend
mooncake`` or ``both``: Mooncake Store too) for one prefix
of the default model's layout (SmolLM2-135M: 30 layers, 3 KV heads x 64 dims) in 16-token
pages: put, exists, get by direct get and by nats-py's default get, and a fetch into a host
pool; with ``--recompute``, the time the worker's runner takes to compute that prefix instead.
Starts its own ``nats-server -js`` unless ``--nats-url`` is given. Prints a markdown table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch

from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow
from libs.transfer.host_pool import HostKVPool
from libs.transfer.jetstream_store import JetStreamStore
from libs.transfer.layout import DTYPES, KVLayout
from libs.transfer.store import PageSpec, page_keys, page_values
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m radixmesh.benchmarks.page_store", description=__doc__)
    p.add_argument("--tokens", type=int, default=1500, help="prefix length (whole pages of it are moved)")
    p.add_argument("--page-tokens", type=int, default=16)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--in-flight", type=int, default=8, help="requests a call keeps outstanding")
    p.add_argument("--storage", default="file", choices=("file", "memory"))
    p.add_argument("--repeat", type=int, default=7, help="timed rounds (best and median reported)")
    p.add_argument("--nats-url", default="", help="a broker with JetStream (default: start one)")
    p.add_argument("--backend", default="jetstream", choices=("jetstream", "mooncake", "both"),
                   help="mooncake: Mooncake Store over TCP (its own mooncake_master; the mooncake extra)")
    p.add_argument("--recompute", action="store_true", help="also time the default model prefilling the prefix")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (the worker's default here: one per core less one)")
    return p.parse_args(argv)


@contextlib.contextmanager
def jetstream_server(binary: str | None = None):
    """A throwaway ``nats-server -js`` on a free loopback port; yields its URL."""
    binary = binary or str(Path(sys.executable).parent / "nats-server")
    binary = binary if Path(binary).is_file() else (shutil.which("nats-server") or "nats-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = tempfile.mkdtemp(prefix="radixmesh-store-bench-")
    proc = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(store, ignore_errors=True)


def _wait_for(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on port {port}")


async def _rounds(ops: list[tuple[str, Callable[[], Awaitable[object]]]], repeat: int) -> list[tuple[str, list[float]]]:
    """Each operation once per round, round after round (this machine is shared and noisy:
    taking turns gives every operation the same conditions); one warm-up round."""
    times: dict[str, list[float]] = {name: [] for name, _ in ops}
    for round_ in range(repeat + 1):
        for name, fn in ops:
            start = time.perf_counter()
            await fn()
            if round_:
                times[name].append(time.perf_counter() - start)
    return list(times.items())


async def measure(args: argparse.Namespace, url: str) -> list[tuple[str, list[float]]]:
    import nats

    layout = KVLayout(args.layers, args.kv_heads, args.head_dim, args.dtype)
    spec = PageSpec(layout, args.page_tokens)
    pages = args.tokens // args.page_tokens
    n = pages * args.page_tokens
    host = HostKVPool(layout, 2 * n)
    host.data.normal_()
    rows = host.read(torch.arange(n))
    values = page_values(spec, rows)
    keys = page_keys("bench", args.dtype, list(range(n)), "", args.page_tokens)
    items = list(zip(keys, values))
    nc = await nats.connect(url)
    try:
        store = await JetStreamStore.open(nc, spec, "bench", max_bytes=4 * pages * spec.value_bytes,
                                          storage=args.storage, in_flight=args.in_flight, timeout_s=10)
        await store.batch_set(items)
        dst = torch.arange(n, 2 * n).view(pages, args.page_tokens)

        async def fetch() -> None:
            async def write(i, page, bad):
                host.write(dst[i], page)
            store.direct = True
            await store.get_each(keys, write)

        def get(direct: bool):
            async def run():
                store.direct = direct
                got = await store.batch_get(keys)
                assert all(v is not None for v in got)
            return run

        async def seal():
            await asyncio.to_thread(page_values, spec, rows)

        ops = [("seal pages (copy + CRC-32, the put's CPU part)", seal),
               ("put (batch_set, one value per page)", lambda: store.batch_set(items)),
               ("exists (batch_exists, no value moves)", lambda: store.batch_exists(keys)),
               ("get, direct get (batch_get)", get(True)),
               ("get, nats-py's default get (JSON + base64)", get(False)),
               ("fetch into a host pool (direct get + check + write)", fetch)]
        return await _rounds(ops, args.repeat)
    finally:
        await nc.close()


async def measure_mooncake(args: argparse.Namespace) -> list[tuple[str, list[float]]]:
    """The same pages through Mooncake Store: a mooncake_master of its own, one client."""
    from libs.transfer.mooncake_master import MooncakeMaster
    from libs.transfer.mooncake_store import MooncakeConfig, MooncakeStore

    layout = KVLayout(args.layers, args.kv_heads, args.head_dim, args.dtype)
    spec = PageSpec(layout, args.page_tokens)
    pages = args.tokens // args.page_tokens
    n = pages * args.page_tokens
    host = HostKVPool(layout, 2 * n)
    host.data.normal_()
    items = list(zip(page_keys("bench", args.dtype, list(range(n)), "", args.page_tokens),
                     page_values(spec, host.read(torch.arange(n)))))
    keys = [k for k, _ in items]
    dst = torch.arange(n, 2 * n).view(pages, args.page_tokens)
    with MooncakeMaster() as master:
        config = MooncakeConfig(master=master.address, segment_bytes=max(64 << 20, 4 * n * layout.token_bytes))
        store = await MooncakeStore.open(spec, config, timeout_s=10, in_flight=args.in_flight)
        try:
            async def get():
                assert all(v is not None for v in await store.batch_get(keys))

            async def fetch():
                async def write(i, page, bad):
                    host.write(dst[i], page)
                await store.get_each(keys, write)

            ops = [("mooncake: put (batch_set, one value per page)", lambda: store.batch_set(items)),
                   ("mooncake: exists (one batch_is_exist)", lambda: store.batch_exists(keys)),
                   ("mooncake: get (get_into, batch_get)", get),
                   ("mooncake: fetch into a host pool (get + check + write)", fetch)]
            return await _rounds(ops, args.repeat)
        finally:
            await store.close()


def recompute_times(args: argparse.Namespace, tokens: int) -> list[float]:
    """Seconds the default model's runner takes to prefill ``tokens`` tokens."""
    runner = ModelRunner(RunnerConfig(model=str(resolve_model()), dtype=args.dtype, kv_slots=tokens + 16,
                                      max_requests=1))
    ids = torch.randint(100, 10000, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    batch = ForwardBatch(step=0, new_rows=[NewRow(row=0, temperature=0.0, top_p=1.0, top_k=-1, seed=0)], rows=[0],
                         prefix_lens=[0], extend_lens=[tokens], input_ids=ids, out_slots=list(range(tokens)))
    runner.run(batch)  # warm-up
    times = []
    for _ in range(max(2, args.repeat // 2)):
        start = time.perf_counter()
        runner.run(batch)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    layout = KVLayout(args.layers, args.kv_heads, args.head_dim, args.dtype)
    pages = args.tokens // args.page_tokens
    nbytes = pages * args.page_tokens * layout.token_bytes
    with contextlib.ExitStack() as stack:
        rows = []
        if args.backend != "mooncake":
            url = args.nats_url or stack.enter_context(jetstream_server())
            rows += asyncio.run(measure(args, url))
        if args.backend != "jetstream":
            rows += asyncio.run(measure_mooncake(args))
    if args.recompute:
        threads = f"{args.threads} thread" + "s" * (args.threads > 1)
        rows.append((f"recompute instead (the model's runner, {threads})", recompute_times(args, pages * args.page_tokens)))
    print(f"{pages} pages of {args.page_tokens} tokens ({pages * args.page_tokens} of a {args.tokens}-token "
          f"prefix), {layout.describe()}, {nbytes / 1e6:.1f} MB, {args.in_flight} requests in flight, "
          f"{args.storage} storage, broker {args.nats_url or 'local nats-server -js'}\n")
    print("| operation | best ms | median ms | GB/s (best) |\n|---|---:|---:|---:|")
    for name, times in rows:
        best, median = min(times), statistics.median(times)
        rate = "-" if "recompute" in name or "exists" in name else f"{nbytes / best / 1e9:.2f}"  # no bytes moved
        print(f"| {name} | {best * 1e3:.1f} | {median * 1e3:.1f} | {rate} |")


if __name__ == "__main__":
    main()
