"""Decode throughput of ModelRunner: ``python -m services.gpu_worker.bench``.

Each request starts with a ``--context``-token KV already in place (the table
rows are filled directly: KV content does not change the cost), then every
step decodes one token for the whole batch.
"""

from __future__ import annotations

import argparse
import time

import torch

from libs.models import resolve_model
from libs.protocol.messages import ForwardBatch, NewRow

from .model_runner import ModelRunner, RunnerConfig


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    kv_slots = max(batches) * (args.context + args.steps + 3)
    runner = ModelRunner(RunnerConfig(model=str(resolve_model(args.model)), dtype=args.dtype, kv_slots=kv_slots, max_requests=max(batches)))
    for b in batches:
        sec = bench_decode(runner, b, args.context, args.steps)
        print(f"batch {b:3d}: {sec * 1e3:7.1f} ms/step  {1 / sec:6.1f} steps/s  {b / sec:7.1f} tok/s")


if __name__ == "__main__":
    main()
