"""The ``radixmesh`` command: ``radixmesh up`` starts the local stack, ``radixmesh bench``
benchmarks one, ``radixmesh simulate`` simulates routing over many workers, ``radixmesh trace``
shows a request's spans."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from . import trace as trace_cli
from .bench import cli as bench_cli
from .launcher import LocalStack, StackConfig, StackError, StackStopped
from .simulate import cli as simulate_cli


def _up(args: argparse.Namespace) -> int:
    config = StackConfig(
        model=args.model, workers=args.workers, host=args.host, port=args.port,
        nats_url=os.environ.get("NATS_URL") or None, log_dir=Path(args.log_dir),
        dtype=args.dtype, kv_slots=args.kv_slots, threads_per_worker=args.threads,
        traces=not args.no_traces, nats_port=args.nats_port, nats_host=args.nats_host,
    )
    stack = LocalStack(config)

    def on_signal(signum, frame):  # NOTE: only a flag: the main loop stops the stack
        stack.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        stack.start(timeout=args.startup_timeout)
    except StackStopped:
        print("radixmesh: stopped", file=sys.stderr)
        return 0
    except StackError as exc:
        print(f"radixmesh: {exc}", file=sys.stderr)
        return 1
    print(f"\nradixmesh is serving {config.model} at {stack.url}  (OpenAI API: {stack.url}/v1)")
    print(f"nats: {stack.nats_url}   logs: {config.log_dir.resolve()}   stop: Ctrl-C\n", flush=True)
    try:
        while not stack.stopping:
            stack.check_alive(restarts_ok=True)  # a crash loop ends the stack
            time.sleep(0.2)
    except StackError as exc:
        print(f"radixmesh: {exc}", file=sys.stderr)
        return 1
    finally:
        print("radixmesh: stopping (services, then the broker)", file=sys.stderr, flush=True)
        stack.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixmesh")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start nats-server and every service locally")
    up.add_argument("--model", default="default",
                    help="local HF model directory, or 'default' (SmolLM2-135M-Instruct)")
    up.add_argument("--workers", type=int, default=1, help="number of gpu_worker processes")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="auto: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32")
    up.add_argument("--kv-slots", type=int, default=32768, help="KV cache tokens per worker")
    up.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: auto)")
    up.add_argument("--log-dir", default="logs")
    up.add_argument("--nats-port", type=int, default=0,
                    help="port of the nats-server it starts (0: a free one); unused with NATS_URL")
    up.add_argument("--nats-host", default="127.0.0.1",
                    help="where that nats-server listens (0.0.0.0: workers on other hosts can join)")
    up.add_argument("--startup-timeout", type=float, default=300.0)
    up.add_argument("--no-traces", action="store_true",
                    help="do not keep spans in <log-dir>/spans.jsonl (for `radixmesh trace`)")
    bench = sub.add_parser("bench", help="benchmark the stack against baselines, side by side",
                           description=bench_cli.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_cli.add_arguments(bench)
    simulate = sub.add_parser("simulate", help="simulate routing policies over many workers",
                              description=simulate_cli.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    simulate_cli.add_arguments(simulate)
    tr = sub.add_parser("trace", help="print a request's spans as a waterfall (local stack)",
                        description=trace_cli.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    trace_cli.add_arguments(tr)
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args)
    if args.command == "bench":
        return bench_cli.run(args)
    if args.command == "simulate":
        return simulate_cli.run(args)
    if args.command == "trace":
        return trace_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
