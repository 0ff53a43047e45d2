"""Decode throughput of ModelRunner, systems side by side: ``python -m services.gpu_worker.bench``.

Each request starts with a ``--context``-token KV already in place (the table
rows are filled directly: KV content does not change the cost), then every
step decodes one token for the whole batch.

A system is ``dtype:mode:threads``: mode ``eager`` (the default runner: bf16
weights packed for oneDNN where it has bf16), ``plain`` (eager, unpacked) or
``compiled``; by default fp32 and bf16, eager and compiled, at ``--threads``. The systems take turns batch
by batch, round after round, and the table reports medians: this machine is
noisy (shared, the second vCPU sometimes delivers little), so only ratios taken
in one run mean anything.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow

from .model_runner import ModelRunner, RunnerConfig

SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def bench_decode(runner: ModelRunner, batch: int, context: int, steps: int, warmup: int = 3) -> float:
    """Seconds per decode step at ``batch`` requests of ``context`` cached tokens."""
    rows = list(range(batch))
    slots = torch.arange(batch * (context + steps + warmup)).view(batch, -1)
    runner.table[:batch, :context] = slots[:, :context]
    new_rows = [NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=r) for r in rows]
    tokens = [1] * batch
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        length = context + i
        tokens = runner.execute(ForwardBatch(
            step=i, new_rows=new_rows if i == 0 else [], rows=rows, prefix_lens=[length] * batch,
            extend_lens=[1] * batch, input_ids=tokens, out_slots=slots[:, length].tolist(),
        ))
    return (time.perf_counter() - start) / steps


def parse_system(text: str) -> tuple[str, str, int]:
    dtype, mode, threads = text.split(":")
    dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(dtype, dtype)
    if dtype not in SHORT or mode not in ("eager", "plain", "compiled"):
        raise argparse.ArgumentTypeError(f"system {text!r}: want dtype:eager|plain|compiled:threads")
    return dtype, mode, int(threads)


def label(system: tuple[str, str, int]) -> str:
    return f"{SHORT[system[0]]} {system[1]} {system[2]}t"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--threads", default="1", help="comma-separated: every default system at each count")
    p.add_argument("--systems", default="", help="comma-separated dtype:mode:threads (overrides the defaults)")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.systems:
        systems = [parse_system(s) for s in args.systems.split(",")]
    else:
        systems = [(d, m, int(t)) for t in args.threads.split(",") for d in SHORT for m in ("eager", "compiled")]
    kv_slots = max(batches) * (args.context + args.steps + 3)
    runners: dict[tuple[str, str], ModelRunner] = {}
    for dtype, mode in dict.fromkeys(s[:2] for s in systems):
        runners[dtype, mode] = r = ModelRunner(RunnerConfig(
            model=str(resolve_model(args.model)), dtype=dtype, kv_slots=kv_slots, max_requests=max(batches),
            compile=mode == "compiled", compile_sizes=tuple(batches), pack_weights=mode != "plain"))
        if r.compiled is not None:
            torch.set_num_threads(systems[0][2])  # NOTE: other thread counts compile in their first warm-up steps
            r.compiled.warm_up(print)
    samples: dict[tuple, list[float]] = {(s, b): [] for s in systems for b in batches}
    for i in range(args.rounds):
        for b in batches:
            for s in systems:
                torch.set_num_threads(s[2])
                samples[s, b].append(b / bench_decode(runners[s[:2]], b, args.context, args.steps))
            print(f"round {i + 1}/{args.rounds}: batch {b} done", flush=True)
    print_table({k: statistics.median(v) for k, v in samples.items()}, systems, batches, args)


def print_table(tps: dict[tuple, float], systems: list, batches: list[int], args) -> None:
    print(f"\ndecode tokens/s, {args.context}-token contexts, {args.steps} steps, "
          f"median of {args.rounds} interleaved rounds")
    ratios = [(c, e) for c in systems for e in systems
              if (c[1], e[1]) in (("compiled", "eager"), ("eager", "plain")) and (c[0], c[2]) == (e[0], e[2])]
    ratios += [(a, b) for a in systems for b in systems
               if a[0] == "bfloat16" and b[0] == "float32" and a[1:] == b[1:]]
    ratios += [(a, b) for a in systems for b in systems if a[:2] == b[:2] and a[2] > b[2]]
    head = [label(s) for s in systems] + [f"{label(a)} / {label(b)}" for a, b in ratios]
    print("| batch | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for b in batches:
        cells = [f"{tps[s, b]:.1f}" for s in systems] + [f"{tps[a, b] / tps[c, b]:.2f}" for a, c in ratios]
        print(f"| {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
