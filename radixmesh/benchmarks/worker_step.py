"""Decode throughput of ModelRunner, systems side by side: ``python -m radixmesh.benchmarks.worker_step``.

Each request starts with a ``--context``-token KV already in place (the table
rows are filled directly: KV content does not change the cost), then every
step decodes one token for the whole batch.

A system is ``dtype:mode:threads[:attention[:knobs]]``: mode ``eager`` (the default runner: bf16
weights packed for oneDNN where it has bf16), ``plain`` (eager, unpacked) or
``compiled``; attention an attention backend by name (default ``auto``; e.g.
``cpu_v1``, the first C++ kernel, against ``cpu``); knobs, joined by ``+``, turn parts
off: ``torch-ops`` runs the eager model's elementwise ops (RMSNorm, residual add, RoPE,
SiLU-mul) in torch instead of the backend's own (the C++ ones of ``cpu``), ``fp32-attn``
sends the ``cpu`` backend's extend rows to torch's SDPA (what it did on CPUs without AMX
before its AVX512-BF16 extend); ``cpp-ops`` has a compiled step's pieces call the C++ ops
(custom ops) instead of inductor's fused loops; ``onednn`` / ``tiles`` / ``hybrid`` (tiles+onednn)
pick the linears' kernel (tiles under fp32: bf16 weights, AVX2) (the worker's models.weights.linear_kernel; default: the machine's choice);
``kv-bf16`` / ``kv-fp32`` the KV pool's dtype (default: the runner's auto); ``py-layers``
runs decode steps' layers from Python even where the C++ layer loop fits (models/layer_loop.py); ``deterministic``
the worker's --deterministic (batch-invariant kernels: the tile linears, every token through the
decode kernel; its cost against the default is the ratio column of a pair); by default
fp32 and bf16, eager and compiled, at ``--threads``. ``--prefill N`` adds a row: one N-token prefill chunk, tokens/s. The
systems take turns batch by batch, round after round, and the table reports medians:
this machine is noisy (shared, the second vCPU sometimes delivers little), so only
ratios taken in one run mean anything.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from libs.kernels import ops as torch_ops
from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig

from . import ceilings

SHORT = {"float32": "fp32", "bfloat16": "bf16"}
KV_KNOBS = {"kv-bf16": "bfloat16", "kv-fp32": "float32"}


def bench_decode(runner: ModelRunner, batch: int, context: int, steps: int, warmup: int = 3,
                 clock=time.perf_counter) -> float:
    """Seconds per decode step at ``batch`` requests of ``context`` cached tokens."""
    rows = list(range(batch))
    slots = torch.arange(batch * (context + steps + warmup)).view(batch, -1)
    runner.table[:batch, :context] = slots[:, :context]
    new_rows = [NewRow(row=r, temperature=0.0, top_p=1.0, top_k=-1, seed=r) for r in rows]
    tokens = [1] * batch
    for i in range(warmup + steps):
        if i == warmup:
            start = clock()
        length = context + i
        tokens = runner.execute(ForwardBatch(
            step=i, new_rows=new_rows if i == 0 else [], rows=rows, prefix_lens=[length] * batch,
            extend_lens=[1] * batch, input_ids=tokens, out_slots=slots[:, length].tolist(),
        ))
    return (clock() - start) / steps


def bench_prefill(runner: ModelRunner, tokens: int, repeat: int = 2, clock=time.perf_counter) -> float:
    """Seconds per prefill of one ``tokens``-token chunk (no cached prefix), after one untimed."""
    batch = ForwardBatch(step=0, new_rows=[NewRow(row=0, temperature=0.0, top_p=1.0, top_k=-1, seed=0)], rows=[0],
                         prefix_lens=[0], extend_lens=[tokens], input_ids=[(i * 7919) % runner.vocab_size for i in range(tokens)],
                         out_slots=list(range(tokens)))
    runner.execute(batch)
    start = clock()
    for _ in range(repeat):
        runner.execute(batch)
    return (clock() - start) / repeat


KNOBS = ("torch-ops", "fp32-attn", "cpp-ops", "onednn", "tiles", "hybrid", "py-layers", "deterministic", *KV_KNOBS)
System = tuple[str, str, int, str, frozenset]  # dtype, mode, threads, attention, knobs


def parse_system(text: str) -> System:
    dtype, mode, threads, *rest = text.split(":")
    dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(dtype, dtype)
    attention = rest[0] if rest and rest[0] else "auto"
    knobs = frozenset(rest[1].split("+")) if len(rest) > 1 else frozenset()
    if dtype not in SHORT or mode not in ("eager", "plain", "compiled") or len(rest) > 2 or not knobs <= set(KNOBS):
        raise argparse.ArgumentTypeError(
            f"system {text!r}: want dtype:eager|plain|compiled:threads[:attention[:knob+knob]], knobs {', '.join(KNOBS)}")
    return dtype, mode, int(threads), attention, knobs


def label(system: System) -> str:
    attention = "" if system[3] == "auto" else f" {system[3]}"
    knobs = "".join(f" {k}" for k in KNOBS if k in system[4])
    return f"{SHORT[system[0]]} {system[1]} {system[2]}t{attention}{knobs}"


def _apply(runner: ModelRunner, knobs: frozenset) -> None:
    if "torch-ops" in knobs:
        runner.attn.ops = torch_ops  # NOTE: the eager model reads attn.ops on every step
    if "py-layers" in knobs:
        runner.model.layer_loop = False
    if "fp32-attn" in knobs:
        if not hasattr(runner.attn, "native_bf16"):
            raise SystemExit(f"fp32-attn: the {runner.attn.name} backend has no bf16 paths to turn off")
        runner.attn.native_bf16 = runner.attn.cpp_extend = False


def _key(system: System) -> tuple[str, str, str, frozenset]:
    """What a runner is built for (the thread count is set per measurement)."""
    return system[0], system[1], system[3], system[4]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--threads", default="1", help="comma-separated: every default system at each count")
    p.add_argument("--systems", default="", help="comma-separated dtype:mode:threads[:attention[:knobs]] (overrides the defaults)")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported")
    p.add_argument("--prefill", type=int, default=0, help="also time one prefill chunk of this many tokens")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: the thread's CPU time, blind to time spent descheduled on a shared machine "
                        "(one-thread systems only)")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.systems:
        systems = [parse_system(s) for s in args.systems.split(",")]
    else:
        systems = [(d, m, int(t), "auto", frozenset()) for t in args.threads.split(",") for d in SHORT
                   for m in ("eager", "compiled")]
    if args.clock == "cpu" and any(s[2] != 1 for s in systems):
        p.error("--clock cpu times one thread: every system must run one")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    kv_slots = max(max(batches) * (args.context + args.steps + 3), args.prefill)
    runners: dict[tuple[str, str, str, frozenset], ModelRunner] = {}
    for key in dict.fromkeys(_key(s) for s in systems):
        dtype, mode, attention, knobs = key
        runners[key] = r = ModelRunner(RunnerConfig(
            model=str(resolve_model(args.model)), dtype=dtype, kv_slots=kv_slots, max_requests=max(batches),
            compile=mode == "compiled", compile_sizes=tuple(batches), compile_ops="cpp" if "cpp-ops" in knobs else "torch", pack_weights=mode != "plain",
            linear_kernel=next((k for k in ("onednn", "tiles") if k in knobs), "tiles+onednn" if "hybrid" in knobs else "auto"), attention_backend=attention,
            kv_dtype=next((KV_KNOBS[k] for k in KV_KNOBS if k in knobs), "auto"), deterministic="deterministic" in knobs))
        _apply(r, knobs)
        if r.compiled is not None:
            torch.set_num_threads(systems[0][2])  # NOTE: other thread counts compile in their first warm-up steps
            r.compiled.warm_up(print)
    rows: list[int | str] = [*batches, *([f"prefill {args.prefill}"] if args.prefill else [])]
    samples: dict[tuple, list[float]] = {(s, b): [] for s in systems for b in rows}
    for i in range(args.rounds):
        for b in rows:
            for s in systems:
                torch.set_num_threads(s[2])
                runner = runners[_key(s)]
                tps = (args.prefill / bench_prefill(runner, args.prefill, clock=clock) if isinstance(b, str)
                       else b / bench_decode(runner, b, args.context, args.steps, clock=clock))
                samples[s, b].append(tps)
            print(f"round {i + 1}/{args.rounds}: {b} done", flush=True)
    tps = {k: statistics.median(v) for k, v in samples.items()}
    print_table(tps, systems, rows, args)
    limits = print_ceilings(sorted({s[2] for s in systems}), runners)
    print_shares(tps, systems, rows, limits, next(iter(runners.values())).model.config, args.prefill)


def print_table(tps: dict[tuple, float], systems: list, batches: list, args) -> None:
    print(f"\ndecode tokens/s (batch rows), {args.context}-token contexts, {args.steps} steps; prefill tokens/s "
          f"(prefill row); median of {args.rounds} interleaved rounds; {args.clock} clock")
    same = lambda a, b, *fields: all(a[f] == b[f] for f in fields)  # noqa: E731
    ratios = [(c, e) for c in systems for e in systems
              if (c[1], e[1]) in (("compiled", "eager"), ("eager", "plain")) and same(c, e, 0, 2, 3, 4)]
    ratios += [(a, b) for a in systems for b in systems
               if a[0] == "bfloat16" and b[0] == "float32" and a[1:] == b[1:]]
    ratios += [(a, b) for a in systems for b in systems if same(a, b, 0, 1, 3, 4) and a[2] > b[2]]
    ratios += [(a, b) for a in systems for b in systems
               if a[:3] == b[:3] and a[4] == b[4] and (a[3], b[3]) == ("cpu", "cpu_v1")]
    ratios += [(a, b) for a in systems for b in systems if a[:4] == b[:4] and a[4] < b[4]]  # fewer knobs off
    head = [label(s) for s in systems] + [f"{label(a)} / {label(b)}" for a, b in ratios]
    print("| batch | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for b in batches:
        cells = [f"{tps[s, b]:.1f}" for s in systems] + [f"{tps[a, b] / tps[c, b]:.2f}" for a, c in ratios]
        print(f"| {b} | " + " | ".join(cells) + " |")


def print_ceilings(threads: list[int], runners: dict) -> dict[tuple[int, torch.dtype], tuple[float, float]]:
    """What this machine allows, measured now (ceilings.py): a decode-batch matmul at the
    model's gate/up shape, a copy. Returns the (matmul GFLOP/s, copy GB/s) each system's
    thread count and dtype runs at (bf16: over packed weights where it can pack)."""
    config = next(iter(runners.values())).model.config
    k, n = ceilings.mlp_shape(config)
    dtypes = {key[0] for key in runners}
    print(f"\nceilings measured in this run (best of {ceilings.REPEAT})")
    print(f"| threads | matmul {ceilings.BATCH}x{k} @ {k}x{n} fp32 | bf16 | bf16 packed | copy (read + write) |"
          " batch-1 decode at that copy rate: fp32 / bf16 |")
    print("|---|---|---|---|---|---|")
    limits = {}
    for t in threads:
        torch.set_num_threads(t)
        mm32 = ceilings.matmul_gflops(k, n, torch.float32)
        mm16 = ceilings.matmul_gflops(k, n, torch.bfloat16)
        mmp = ceilings.matmul_gflops(k, n, torch.bfloat16, packed=True)
        copy = ceilings.copy_gbs()
        steps = " / ".join(f"{ceilings.decode_bound(copy, config, getattr(torch, d)):.0f}" if d in dtypes else "-"
                           for d in SHORT)
        print(f"| {t} | {mm32:.0f} GFLOP/s | {mm16:.0f} GFLOP/s | {mmp:.0f} GFLOP/s | {copy:.1f} GB/s | {steps} steps/s |")
        limits[t, torch.float32] = (mm32, copy)
        limits[t, torch.bfloat16] = (mm16 if math.isnan(mmp) else mmp, copy)  # NaN: no packed form
    return limits


def print_shares(tps: dict[tuple, float], systems: list, rows: list, limits: dict, config, prefill: int) -> None:
    """Each figure as a share of its roofline (ceilings.step_bound at the ceilings above)."""
    print("\nshare of the linears' roofline: tokens/s / min(matmul rate, weights read at half the copy rate)")
    print("| batch | " + " | ".join(label(s) for s in systems) + " |")
    print("|---" * (len(systems) + 1) + "|")
    for b in rows:
        tokens, logits = (prefill, 1) if isinstance(b, str) else (b, b)
        cells = []
        for s in systems:
            dtype = getattr(torch, s[0])
            mm, copy = limits[s[2], dtype]
            cells.append(f"{tps[s, b] / ceilings.step_bound(tokens, logits, config, dtype, mm, copy):.2f}")
        print(f"| {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
