"""One simulated worker: the real scheduler core, with a service-time model for a GPU.

The core (services/scheduler/core.py) plans every step exactly as it does for a
real worker: admission with the decaying new-token ratio, chunked prefill,
retraction, the radix tree with LRU eviction, KV events and load reports. Only
the forward pass is simulated: a step takes ``ServiceModel.step_s`` seconds and
"samples" the trace's next output token for each request, so a request stops at
its trace length. Steps run one at a time (no overlap), as the model prices them.
"""

from __future__ import annotations

import numpy as np

from libs.protocol.messages import (
    ForwardResult, KVEventBatch, KVSnapshot, LoadReport, SamplingParams, WorkerInfo,
)
from services.scheduler.config import CoreConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.reports import StepRates
from services.scheduler.request import Req

from .model import ServiceModel

MODEL = "sim"
VOCAB = 1 << 31  # trace tokens are arbitrary ids


class SimRequest:
    __slots__ = ("idx", "rid", "tokens", "outputs", "prompt_len", "out_tokens", "arrival",
                 "worker", "cached", "first_token_at", "finished_at", "predicted_ttft")

    def __init__(self, idx: int, tokens: np.ndarray, outputs: np.ndarray, arrival: float) -> None:
        self.idx, self.rid = idx, f"r{idx}"
        self.tokens, self.outputs = tokens, outputs
        self.prompt_len, self.out_tokens = len(tokens), len(outputs)
        self.arrival = arrival
        self.worker = -1
        self.cached = 0
        self.first_token_at = self.finished_at = self.predicted_ttft = -1.0


class SimWorker:
    def __init__(self, worker_id: str, model: ServiceModel) -> None:
        self.worker_id, self.model = worker_id, model
        info = WorkerInfo(worker_id=worker_id, model=MODEL, kv_slots=model.kv_slots,
                          max_requests=model.max_running, max_model_len=model.kv_slots,
                          vocab_size=VOCAB, eos_token_ids=[], dtype="sim",
                          host_kv_slots=model.host_slots)
        self.core = SchedulerCore(info, CoreConfig(
            max_running_requests=model.max_running, max_queued_requests=1 << 30,
            chunked_prefill_size=model.chunk_tokens, page_size=model.page_size, overlap=False))
        self.rates = StepRates()
        self.stepping = False
        self._by_rid: dict[str, tuple[SimRequest, Req]] = {}
        self.steps = self.served = self.prefilled = 0
        self.busy_s = 0.0

    @property
    def retractions(self) -> int:
        return self.core.planner.retractions

    def submit(self, sim: SimRequest) -> None:
        req = Req(rid=sim.rid, input_ids=sim.tokens.tolist(), detok_instance="",
                  sampling=SamplingParams(max_new_tokens=sim.out_tokens, ignore_eos=True))
        self.core.submit(req)
        self._by_rid[sim.rid] = (sim, req)

    def plan_step(self) -> float | None:
        """Plan and "send" the next step; its duration, or None if there is nothing to run."""
        if self.core.next_batch() is None:
            return None
        step = self.core.last_step
        prefill = sum(item.tokens for item in step.items if not item.decode)
        self.prefilled += prefill
        decodes = len(step.items) - sum(not item.decode for item in step.items)
        # NOTE: the step's host-tier copies run before its forward, as on a real worker
        return self.model.step_s(decodes, prefill) + step.copied / self.model.host_load_tps

    def complete_step(self, now: float, seconds: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """The step in flight took ``seconds``: apply its tokens; (first tokens, finished)."""
        step = self.core.last_step
        tokens = [self._next_token(item.req) for item in step.items]
        self.core.complete(ForwardResult(step=step.number, next_token_ids=tokens,
                                         forward_ms=seconds * 1e3))
        self.steps += 1
        self.busy_s += seconds
        self.rates.measure([item.tokens for item in step.items], seconds)
        started, finished = [], []
        for _, delta in self.core.take_deltas():
            sim = self._by_rid[delta.rid][0]
            if delta.token_ids and sim.first_token_at < 0:
                sim.first_token_at, sim.cached = now, delta.cached_tokens
                started.append(sim)
            if delta.finish_reason is not None:
                sim.finished_at = now
                finished.append(sim)
                self.served += 1
                del self._by_rid[delta.rid]
        return started, finished

    def _next_token(self, req: Req) -> int:
        sim = self._by_rid[req.rid][0]
        return int(sim.outputs[min(len(req.output_ids), sim.out_tokens - 1)])

    # -- what the scheduler publishes ---------------------------------------------

    def load_report(self, now: float) -> LoadReport:
        return self.core.load_report(self.rates, "sim", now)

    def take_events(self) -> KVEventBatch | None:
        return self.core.take_events()

    def snapshot(self) -> KVSnapshot:
        return self.core.snapshot()
