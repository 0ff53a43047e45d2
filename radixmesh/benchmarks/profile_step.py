"""Where a step's time goes: ``python -m radixmesh.benchmarks.profile_step``.

    python -m radixmesh.benchmarks.profile_step [--dtype bfloat16] [--batches 1,8,32,64]
                                                [--prefill 512] [--threads 1] [--aten 8]

Runs the real model in-process (ModelRunner, eager) on decode steps at each batch
(``--context`` cached tokens per request) and on one prefill chunk, with a timer
around each kind of call: the linears (matmul), the attention backend's
``forward`` (K/V store + kernel) and ``prepare``, RMSNorm, RoPE (the per-step
cos/sin lookup included), SiLU-mul, the sampler. Times are exclusive (a call's
nested timed calls are not counted twice); what is left of the model's forward
(residual adds, embedding, views, the Python between ops) is "model other",
what is left of the runner's step (batch parsing, slot table) "runner other". The decode
steps run the model's Python loop (the C++ layer loop, models/layer_loop.py, hides its calls from
the timers); the last column is the step with that loop, timed after the others.
``--aten N`` adds torch.profiler's top N ops by self time for the largest batch.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict

import torch

from libs.models import resolve_model
from services.gpu_worker.model_runner import ModelRunner, RunnerConfig
from services.gpu_worker.models import llama as model_module

from .worker_step import bench_decode, bench_prefill

ORDER = ("matmul", "attention", "attn prepare", "rmsnorm", "add+rmsnorm", "rope", "silu_mul", "sampling",
         "model other", "runner other")


class Timers:
    """Exclusive seconds per category over wrapped calls (nested timed calls subtracted)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._children: list[float] = []

    def wrap(self, category: str, fn):
        def timed(*args, **kwargs):
            self._children.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                nested = self._children.pop()
                self.seconds[category] += elapsed - nested
                if self._children:
                    self._children[-1] += elapsed
        return timed

    def reset(self) -> None:
        self.seconds.clear()


def instrument(runner: ModelRunner, timers: Timers) -> contextlib.ExitStack:
    """Wrap the runner's calls in ``timers``; closing the stack undoes it."""
    stack = contextlib.ExitStack()

    def patch(owner, name: str, category: str) -> None:
        if not hasattr(owner, name):
            return
        original = getattr(owner, name)
        setattr(owner, name, timers.wrap(category, original))
        stack.callback(setattr, owner, name, original)

    patch(model_module, "linear", "matmul")
    ops = runner.attn.ops
    for name, category in (("rmsnorm", "rmsnorm"), ("add_rmsnorm", "add+rmsnorm"), ("apply_rope", "rope"),
                           ("rope_qk", "rope"), ("silu_mul", "silu_mul")):
        patch(ops, name, category)
    patch(runner.model.rotary, "lookup", "rope")
    patch(runner.attn, "forward", "attention")
    patch(runner.attn, "prepare", "attn prepare")
    patch(runner, "_sample", "sampling")
    patch(runner.model, "forward", "model other")
    patch(runner, "run", "runner other")
    return stack


def breakdown(timers: Timers, step_s: float, steps: int) -> dict[str, float]:
    """ms per step of each category, and ``total`` (the measured step)."""
    out = {k: timers.seconds.get(k, 0.0) / steps * 1e3 for k in ORDER}
    out["total"] = step_s * 1e3
    return out


def print_table(rows: dict[str, dict[str, float]]) -> None:
    cols = [k for k in ORDER if any(r[k] > 0 for r in rows.values())]
    print("| step | ms/step | " + " | ".join(cols) + " | with the C++ layer loop |")
    print("|---" * (len(cols) + 3) + "|")
    for name, r in rows.items():
        cells = [f"{r[k]:.2f} ({100 * r[k] / r['total']:.0f}%)" for k in cols]
        loop = f"{r['layer loop']:.2f}" if "layer loop" in r else "-"
        print(f"| {name} | {r['total']:.2f} | " + " | ".join(cells) + f" | {loop} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--attention", default="auto")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prefill", type=int, default=512, help="tokens of the prefill chunk (0: none)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--aten", type=int, default=0, help="also list torch.profiler's top N ops (largest batch)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    runner = ModelRunner(RunnerConfig(model=str(resolve_model(args.model)), dtype=args.dtype,
                                      kv_slots=max(max(batches) * (args.context + args.steps + 3), args.prefill),
                                      max_requests=max(batches), attention_backend=args.attention))
    timers = Timers()
    rows: dict[str, dict[str, float]] = {}
    with instrument(runner, timers):
        for b in batches:
            runner.model.layer_loop = False
            bench_decode(runner, b, args.context, 2)  # warm-up (not timed)
            timers.reset()
            rows[f"decode b={b}"] = breakdown(timers, bench_decode(runner, b, args.context, args.steps, 0), args.steps)
            runner.model.layer_loop = True
            bench_decode(runner, b, args.context, 2)
            loop_s = bench_decode(runner, b, args.context, args.steps, 0)
            if runner.model._loop is not None:  # NOTE: a backend without decode_step keeps the Python loop
                rows[f"decode b={b}"]["layer loop"] = loop_s * 1e3
        if args.prefill:
            timers.reset()
            rows[f"prefill {args.prefill}"] = breakdown(timers, bench_prefill(runner, args.prefill, 3), 4)
    print(f"\n{runner.config.dtype}, {runner.attn.name} attention, {args.threads} thread(s), "
          f"{args.context}-token contexts: ms per step (exclusive)")
    print_table(rows)
    if args.aten:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            bench_decode(runner, batches[-1], args.context, 3, 0)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.aten))


if __name__ == "__main__":
    main()
