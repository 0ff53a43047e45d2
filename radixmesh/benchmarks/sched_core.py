"""The scheduler core's CPU per decode step, in-process: ``python -m radixmesh.benchmarks.sched_core``.

    python -m radixmesh.benchmarks.sched_core [--batches 64 256] [--steps 256] [--rounds 3]

The real SchedulerCore (services/scheduler/core.py) drives B greedy ``ignore_eos`` streams the
way its driver does on the overlap schedule: each step is planned while the one before it is
still in flight, encoded as the bus encodes it (msgpack), its result decoded, applied, and the
step's deltas grouped per tokenizer instance and encoded as DetokBatches. The "worker" here
answers each step with random token ids at once (its forward is not what is measured); no bus,
no event loop, so what the mesh benchmark (mesh.py) adds on top is the transport. CPU time
(``time.process_time``) per steady decode step, split into plan (``next_batch``), apply
(``complete``) and the codec, median over ``--rounds``. To compare two checkouts, run it from
each (``PYTHONPATH=<checkout>``) one after the other.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from libs.protocol import codec
from libs.protocol.messages import DetokBatch, ForwardBatch, ForwardResult, SamplingParams, WorkerInfo
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.request import Req

VOCAB = 32000


@dataclass
class CoreTimes:
    """CPU milliseconds per steady decode step."""

    plan: float
    apply: float
    codec: float

    @property
    def total(self) -> float:
        return self.plan + self.apply + self.codec


class _Loop:
    """The driver's overlap loop without a bus: one step in flight while the next is planned."""

    def __init__(self, core: SchedulerCore, seed: int) -> None:
        self.core, self.rng = core, np.random.default_rng(seed)
        self.inflight: list[ForwardBatch] = []
        self.seconds = defaultdict(float)

    def _timed(self, key: str, fn, *args):
        start = time.process_time()
        out = fn(*args)
        self.seconds[key] += time.process_time() - start
        return out

    def send(self) -> bool:
        batch = self._timed("plan", self.core.next_batch)
        if batch is None:
            return False
        self.inflight.append(self._timed("codec", lambda: codec.decode(codec.encode(batch), ForwardBatch)))
        return True

    def answer(self) -> None:
        batch = self.inflight.pop(0)
        ids = self.rng.integers(3, VOCAB, len(batch.rows)).tolist()
        raw = codec.encode(ForwardResult(step=batch.step, next_token_ids=ids, forward_ms=0.0))
        result = self._timed("codec", codec.decode, raw, ForwardResult)
        self._timed("apply", self.core.complete, result)
        self._timed("codec", self._publish, self.core.take_delta_batches())

    def _publish(self, deltas: dict[str, list]) -> list[bytes]:
        return [codec.encode(DetokBatch(worker_id="bench", step=self.core.steps, items=items))
                for items in deltas.values()]

    def step(self) -> None:
        """One steady step: plan the next, then apply the oldest in flight."""
        if not self.inflight:
            self.send()
        self.send()
        self.answer()


def measure(batch: int, steps: int, prompt_tokens: int = 32, seed: int = 0) -> CoreTimes:
    """``steps`` steady decode steps of ``batch`` streams (after their prefill)."""
    config = CoreConfig(max_running_requests=batch)
    warm = -(-batch * prompt_tokens // config.chunked_prefill_size) + 3  # the prefill chunks, then decodes
    info = WorkerInfo(worker_id="bench", model="bench", kv_slots=2 * batch * (prompt_tokens + steps + 2 * warm),
                      max_requests=batch, max_model_len=prompt_tokens + steps + 4 * warm, vocab_size=VOCAB,
                      eos_token_ids=[2], dtype="bfloat16")
    core = SchedulerCore(info, config)
    rng = np.random.default_rng(seed)
    for i in range(batch):
        core.submit(Req(rid=f"{i:032x}", input_ids=rng.integers(3, VOCAB, prompt_tokens).tolist(),
                        detok_instance="tokenizer-0", sampling=SamplingParams(
                            max_new_tokens=steps + 2 * warm, temperature=0.0, ignore_eos=True)))
    loop = _Loop(core, seed)
    for _ in range(warm):  # the prefill and the first decodes
        loop.step()
    if len(core.running) != batch:
        raise RuntimeError(f"{len(core.running)} of {batch} streams running after the prefill")
    gc.collect()
    gc.freeze()  # NOTE: as every service does after start-up
    loop.seconds.clear()
    try:
        for _ in range(steps):
            loop.step()
    finally:
        gc.unfreeze()
    per = {k: v / steps * 1e3 for k, v in loop.seconds.items()}
    return CoreTimes(plan=per["plan"], apply=per["apply"], codec=per["codec"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="medians reported")
    args = p.parse_args(argv)
    print("scheduler core in-process, CPU ms per decode step (us per request in brackets), "
          f"median of {args.rounds}\n")
    print("| batch | plan | apply | codec | total |")
    print("|---|---|---|---|---|")
    for b in args.batches:
        runs = [measure(b, args.steps, seed=r) for r in range(args.rounds)]
        med = {k: statistics.median(getattr(r, k) for r in runs) for k in ("plan", "apply", "codec", "total")}
        cells = " | ".join(f"{med[k]:.3f} ({med[k] * 1e3 / b:.2f})" for k in ("plan", "apply", "codec", "total"))
        print(f"| {b} | {cells} |")


if __name__ == "__main__":
    main()
