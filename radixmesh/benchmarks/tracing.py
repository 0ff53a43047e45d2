"""Decode throughput with tracing off vs on (every request sampled), in one run.

Two stacks run side by side on the same model: one exports no spans, the other
exports every span over OTLP/HTTP to a receiver in this process (the local
``radixmesh up`` setup). Measurements alternate between them, round by round,
so both see the same machine load; the table shows the median round.

    python -m radixmesh.benchmarks.tracing [--batches 1 8 32] [--context 256] [--steps 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
from pathlib import Path

from radixmesh.benchmarks.decode import bench_stack, make_prompts
from radixmesh.launcher import LocalStack, ephemeral_stack_config


@contextlib.contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start(log_dir: Path, traces: bool, threads: int) -> LocalStack:
    config = ephemeral_stack_config(log_dir, threads_per_worker=threads, traces=traces)
    sampler = {"OTEL_TRACES_SAMPLER": "parentbased_always_on"} if traces else {"OTEL_SDK_DISABLED": "true"}
    with _env(**sampler):
        return LocalStack(config, progress=lambda m: None).start()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[key]  # NOTE: "off" must really be off; "on" goes to our receiver
    results: dict[int, dict[str, list[float]]] = {b: {"off": [], "on": []} for b in args.batches}
    with tempfile.TemporaryDirectory() as logs:
        stacks = {"off": start(Path(logs) / "off", False, args.threads),
                  "on": start(Path(logs) / "on", True, args.threads)}
        try:
            for stack in stacks.values():
                asyncio.run(bench_stack(stack.url, make_prompts(1, 16, seed=99), 4))  # warm-up
            for b in args.batches:
                prompts = make_prompts(b, args.context)
                for r in range(args.rounds):
                    for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
                        results[b][name].append(asyncio.run(bench_stack(stacks[name].url, prompts,
                                                                        args.steps)))
            spans = len(stacks["on"].spans.snapshot()) if stacks["on"].spans else 0
        finally:
            for stack in stacks.values():
                stack.stop()
    print_table(results, args, spans)


def print_table(results: dict[int, dict[str, list[float]]], args: argparse.Namespace, spans: int) -> None:
    print(f"\ndecode tokens/s, {args.context}-token contexts, {args.steps} decode steps, "
          f"median of {args.rounds} alternating rounds; {spans} spans exported by the traced stack")
    print("| batch | tracing off | tracing on (100% sampled) | on/off |")
    print("|---|---|---|---|")
    for b, r in results.items():
        off, on = statistics.median(r["off"]), statistics.median(r["on"])
        print(f"| {b} | {off:.1f} | {on:.1f} | {on / off:.3f} |")


if __name__ == "__main__":
    main()
