"""``python -m services.gpu_worker``: load the model, then serve it on the bus."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import uuid

import torch

from libs.kernels import BackendNotAvailable, cpu_ext
from libs.models import ModelNotFoundError, resolve_model, served_name
from libs.protocol import event_loop
from libs.protocol.env_flags import env_default
from libs.protocol.metrics import add_metrics_args, serve_metrics
from libs.protocol.service import ServiceContext, add_common_args, common_config, run_service, setup_logging
from libs.protocol.subjects import check_token
from libs.transfer.mooncake import MooncakeUnavailable, unavailable

from .compute import ComputeThread
from .kv.service import serve_kv_transfer
from .kv.store_service import STORE_KINDS, StoreConfig, open_data_bus, serve_store
from .kv.transfer import ROLES, TRANSFER_MODES, KVTransferConfig
from .model_runner import ModelRunner, RunnerConfig
from .models.compiled import DEFAULT_SIZES
from .models.precision import DTYPE_CHOICES
from .models.weights import LINEAR_KERNELS
from .service import WorkerService

SERVICE = "gpu_worker"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def env(flag: str, default, kind=str):
        """RADIXMESH_GPU_WORKER_<FLAG>, then RADIXMESH_<FLAG> (radixmesh up's names)."""
        return env_default(SERVICE, flag, default, kind)

    p = argparse.ArgumentParser(prog="python -m services.gpu_worker", description=__doc__)
    p.add_argument("--model", default=env("--model", "default"), help='"default" or a local HF directory')
    p.add_argument("--dtype", default=env("--dtype", "auto"), choices=DTYPE_CHOICES,
                   help="auto: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32")
    p.add_argument("--kv-dtype", default=env("--kv-dtype", "auto"), choices=DTYPE_CHOICES,
                   help="the KV cache's precision; auto: bfloat16 where the model runs fp32 over bf16 linear "
                        "weights (AVX2 CPUs under --dtype auto: half the bytes a decode step's attention reads), "
                        "else --dtype's")
    p.add_argument("--kv-slots", type=int, default=env("--kv-slots", 32768, int))
    p.add_argument("--max-requests", type=int, default=env("--max-requests", 256, int))
    p.add_argument("--max-model-len", type=int, default=env("--max-model-len", None, int), help="default: max_position_embeddings")
    p.add_argument("--host-kv-slots", type=int, default=env("--host-kv-slots", 0, int),
                   help="slots of the host KV pool for device <-> host copies (0: none)")
    p.add_argument("--kv-store", choices=STORE_KINDS, default=env("--kv-store", "none"),
                   help="shared KV store (L3) for host pages: nats = a JetStream KV bucket on the worker's "
                        "broker (JetStream must be on: nats-server -js); mooncake = Mooncake Store (pip extra "
                        "radixmesh[mooncake]; its master at --kv-store-url, radixmesh up starts one); "
                        "needs --host-kv-slots")
    p.add_argument("--kv-store-bucket", default=env("--kv-store-bucket", StoreConfig.bucket))
    p.add_argument("--kv-store-url", default=env("--kv-store-url", ""),
                   help="nats: the store's own NATS server (JetStream on), e.g. a cluster kept for KV; "
                        "default: the worker's broker. mooncake: mooncake_master's host:port (default "
                        "127.0.0.1:50051)")
    p.add_argument("--kv-store-max-bytes", type=int,
                   default=env("--kv-store-max-bytes", StoreConfig.max_bytes, int),
                   help="nats: byte limit of the bucket when this worker creates it (full: the oldest pages go); "
                        "mooncake: this worker's segment of the pool (mapped, touched as pages land)")
    p.add_argument("--kv-store-mooncake-metadata", default=env("--kv-store-mooncake-metadata", "P2PHANDSHAKE"),
                   help="Mooncake's metadata server: P2PHANDSHAKE (none needed) or http://host:port/metadata")
    p.add_argument("--kv-store-mooncake-hostname", default=env("--kv-store-mooncake-hostname", ""),
                   help="the address peers reach this worker's Mooncake segment at (default: this host's "
                        "address on the route to the master)")
    p.add_argument("--attention-backend", default=env("--attention-backend", "auto"),
                   help="torch | cpu | triton | flashinfer | auto (cpu, else torch, on the CPU; "
                        "best available on CUDA)")
    p.add_argument("--device", default=env("--device", "cpu"))
    p.add_argument("--threads", type=int, default=env("--threads", 0, int),
                   help="the most compute threads a step runs on (0: one per core)")
    p.add_argument("--thread-choice", choices=("auto", "fixed"), default=env("--thread-choice", "auto"),
                   help="auto: each step runs on 1, half or all of --threads, whichever has run steps of its "
                        "size fastest lately (measured as it serves); fixed: always --threads")
    p.add_argument("--linear-kernel", choices=LINEAR_KERNELS, default=env("--linear-kernel", "auto"),
                   help="linears on the CPU: tiles (our C++ kernel over bf16 weights: AVX512-BF16's dot "
                        "instruction under bf16, widened to fp32 on AVX2), onednn (oneDNN's packed matmul) or "
                        "tiles+onednn (fp32: the tiles below 96 rows a step, oneDNN's fp32 matmul over the same "
                        "bf16-rounded weights from there; 4 bytes a weight more); auto: tiles under bf16 on CPUs "
                        "with AVX512-BF16 and no AMX, tiles+onednn under dtype auto on AVX2 (tiles alone where "
                        "the fp32 copy would take over a quarter of the free memory)")
    p.add_argument("--deterministic", action="store_true",
                   default=env("--deterministic", "") not in ("", "0", "false"),
                   help="batch-invariant kernels (cpu attention backend: bf16, or dtype auto on AVX2, the "
                        "linears on the tiles; triton on CUDA, the default there under this flag: the linears on "
                        "a fixed-tile Triton matmul, tested in the interpreter only; both: every token a decode "
                        "query with fixed splits): a token's logits the same "
                        "bits in any batch, chunk, cached prefix or not, so greedy output survives a worker's "
                        "death, retraction and a PD transfer; its cost: docs/cpu-kernels.md")
    p.add_argument("--compile", choices=("on", "off"), default=env("--compile", "off"),
                   help="compile the model's pieces between attention calls (inductor, cached on disk)")
    p.add_argument("--compile-sizes", default=env("--compile-sizes", ",".join(map(str, DEFAULT_SIZES))),
                   help="token-count buckets of the compiled step (steps are padded up; longer ones run eagerly)")
    p.add_argument("--role", choices=ROLES, default=env("--role", "both"),
                   help="prefill/decode disaggregation: both (colocated), prefill or decode (announced in WorkerInfo)")
    p.add_argument("--kv-transfer", choices=TRANSFER_MODES, default=env("--kv-transfer", "auto"),
                   help="how KV moves to a decode worker: auto = shared memory (/dev/shm) with a peer of the "
                        "same host_id, NATS chunks otherwise; shm or nats forces one; mooncake: the Mooncake "
                        "Transfer Engine over TCP (extra radixmesh[mooncake]; give it to both workers: a decode "
                        "worker without it gets NATS chunks)")
    p.add_argument("--kv-mooncake-host", default=env("--kv-mooncake-host", ""),
                   help="with --kv-transfer mooncake: the address peers reach this worker's engine at "
                        "(default: this host's name, resolved)")
    p.add_argument("--worker-id", default=env("--worker-id", "") or f"worker-{uuid.uuid4().hex[:8]}")
    p.add_argument("--announce-interval", type=float, default=1.0, help="seconds between WorkerInfo announcements")
    add_common_args(p, SERVICE)
    add_metrics_args(p, SERVICE)
    return p.parse_args(argv)


def compute_thread(requested: int) -> ComputeThread:
    """The compute thread with torch's intra-op threads (``requested``, or one per core: with
    --thread-choice auto a step moves to fewer where the other services' load makes all of
    them slower), and a single inter-op thread (the forward runs in one thread; an idle pool
    would only compete)."""
    threads = requested if requested > 0 else max(1, os.cpu_count() or 1)
    with contextlib.suppress(RuntimeError):  # NOTE: settable once, before any inter-op work
        torch.set_num_interop_threads(1)
    return ComputeThread(threads)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = common_config(args)
    setup_logging(SERVICE, config.log_level)
    serve_metrics(args.metrics_port, args.metrics_host)
    compute = compute_thread(args.threads)
    threads = compute.threads
    if args.kv_transfer == "mooncake" and unavailable():  # NOTE: before the model loads
        raise SystemExit(f"{SERVICE}: --kv-transfer mooncake: {unavailable()}")
    try:
        check_token(args.worker_id)
        runner = compute.call(ModelRunner, RunnerConfig(  # NOTE: on the thread that runs its steps
            model=str(resolve_model(args.model)), dtype=args.dtype, kv_dtype=args.kv_dtype, kv_slots=args.kv_slots,
            max_requests=args.max_requests,
            attention_backend=args.attention_backend, device=args.device, max_model_len=args.max_model_len,
            host_kv_slots=args.host_kv_slots, compile=args.compile == "on",
            compile_sizes=tuple(int(n) for n in args.compile_sizes.split(",")),
            threads=threads, adaptive_threads=args.thread_choice == "auto", linear_kernel=args.linear_kernel,
            deterministic=args.deterministic,
        ))
    except (BackendNotAvailable, ModelNotFoundError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"{SERVICE}: {exc}") from None
    logging.getLogger(SERVICE).info(
        "loaded %s (%s [%s], %s linears, %s attention%s, %d KV slots, %.0f MiB KV in %s [%s], %d compute threads, "
        "cpu kernels %s)",
        runner.path, runner.config.dtype, runner.dtype_choice.reason, runner.model.linear_kernel, runner.attn.name,
        " (deterministic)" if args.deterministic else "",
        args.kv_slots, runner.kv.nbytes() / 2**20, runner.config.kv_dtype, runner.kv_choice.reason, threads,
        cpu_ext.describe(),
    )
    if runner.compiled is not None:
        if runner.device.type == "cpu":
            logging.getLogger(SERVICE).warning(
                "--compile on: the linears run plain weights through inductor's matmuls, not the packed kernels "
                "--compile off runs (on an AVX2 CPU under --dtype auto, 3.2x slower at batch 1 and 8)")
        compute.call(runner.compiled.warm_up, logging.getLogger(SERVICE).info)

    async def body(ctx: ServiceContext) -> None:
        worker = WorkerService(
            runner, args.worker_id, served_name(args.model), ctx.subjects, args.announce_interval, ctx.detail,
            role=args.role, compute=compute,
        )
        data_bus = await open_data_bus(ctx)  # NOTE: bulk bytes (pages, KV transfers) off the control connection
        await serve_store(ctx, worker, StoreConfig(args.kv_store, args.kv_store_bucket, args.kv_store_max_bytes,
                                                      args.kv_store_url, args.kv_store_mooncake_metadata,
                                                      args.kv_store_mooncake_hostname),
                          data_bus)
        try:
            await serve_kv_transfer(ctx, worker, KVTransferConfig(mode=args.kv_transfer,
                                                                  mooncake_host=args.kv_mooncake_host), data_bus)
        except MooncakeUnavailable as exc:
            raise SystemExit(f"{SERVICE}: --kv-transfer mooncake: {exc}") from None
        await worker.start(ctx.bus)  # NOTE: after the store: the first announcement names it
        ctx.stack.push_async_callback(worker.stop)

    event_loop.run(run_service(SERVICE, config, body))


if __name__ == "__main__":
    main()
