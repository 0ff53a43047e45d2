"""Discrete-event simulation of a cluster routed by the real cache_index code.

The cache index here is services/cache_index's Registry, PrefixIndex and
Router, fed as the service feeds them: LoadReports every ``report_interval``
seconds of simulated time, KV event batches after every step, a snapshot when
the index asks for one, and a release when a request finishes. Messages arrive
instantly; the Registry's clock is the simulated clock.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass

import numpy as np

from libs.protocol.messages import KVEventBatch, LoadReport, RouteRequest
from services.cache_index.policies import predict_ttft
from services.cache_index.prefix_index import PrefixIndex
from services.cache_index.registry import Registry
from services.cache_index.router import Router

from .model import ServiceModel
from .trace import Trace
from .worker import MODEL, SimRequest, SimWorker

ARRIVAL, STEP_END, REPORT = 0, 1, 2


class SimIndex:
    """The cache_index service's handlers (services/cache_index/service.py), minus the bus."""

    def __init__(self, policy: str, clock, workers: dict[str, SimWorker]) -> None:
        self.registry = Registry(clock=clock)
        self.index = PrefixIndex()
        self.router = Router(self.registry, self.index, policy)
        self.workers = workers

    def on_load(self, report: LoadReport) -> None:
        before = {s.report.worker_id for s in self.registry.live()}
        self.registry.update(report)
        for gone in before - {s.report.worker_id for s in self.registry.live()}:
            self.index.drop(gone)
        if self.index.needs_snapshot(report.worker_id):
            self.index.on_snapshot(self.workers[report.worker_id].snapshot())

    def on_events(self, batch: KVEventBatch) -> None:
        if not self.index.on_events(batch):
            self.index.on_snapshot(self.workers[batch.worker_id].snapshot())


@dataclass
class RunResult:
    policy: str
    requests: list[SimRequest]
    workers: list[SimWorker]
    makespan_s: float
    wall_s: float
    route_s: float  # wall time spent in Router.route
    resyncs: int


class Simulation:
    def __init__(self, trace: Trace, model: ServiceModel, policy: str,
                 report_interval: float = 0.5, report_on_change: bool = False) -> None:
        if report_interval <= 0:
            raise ValueError("report_interval must be positive (workers must stay live)")
        self.trace, self.model, self.policy = trace, model, policy
        self.report_interval, self.report_on_change = report_interval, report_on_change
        self.now = 0.0
        self.workers = [SimWorker(f"sim-{i:04d}", model) for i in range(trace.config.workers)]
        self.by_id = {w.worker_id: w for w in self.workers}
        self.slot_of = {w.worker_id: i for i, w in enumerate(self.workers)}
        self._step_s = [0.0] * len(self.workers)  # duration of each worker's current step
        self.index = SimIndex(policy, lambda: self.now, self.by_id)
        self.requests: list[SimRequest] = []
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._done = 0
        self._route_s = 0.0

    def run(self) -> RunResult:
        """Route and serve the whole trace (once); deterministic for a trace and policy."""
        state = random.getstate()
        random.seed(self.trace.config.seed)  # the policies' tie-breaks and ``random``
        start = time.perf_counter()
        try:
            self._loop()
        finally:
            random.setstate(state)
        return RunResult(self.policy, self.requests, self.workers, self.now,
                         time.perf_counter() - start, self._route_s, self.index.index.resyncs)

    def _loop(self) -> None:
        phases = np.random.default_rng([self.trace.config.seed, 99]).uniform(
            0, self.report_interval, len(self.workers))
        for i, worker in enumerate(self.workers):
            self.index.on_load(worker.load_report(0.0))
            self._push(float(phases[i]), REPORT, i)
        if len(self.trace):
            self._push(float(self.trace.arrivals[0]), ARRIVAL, 0)
        handlers = {ARRIVAL: self._arrive, STEP_END: self._step_end, REPORT: self._report}
        while self._done < len(self.trace):
            self.now, _, kind, arg = heapq.heappop(self._heap)
            handlers[kind](arg)

    def _push(self, at: float, kind: int, arg: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, arg))

    def _arrive(self, i: int) -> None:
        trace = self.trace
        if i + 1 < len(trace):
            self._push(float(trace.arrivals[i + 1]), ARRIVAL, i + 1)
        req = SimRequest(i, trace.prompt(i), trace.outputs[i], self.now)
        self.requests.append(req)
        route = RouteRequest(rid=req.rid, model=MODEL, num_tokens=req.prompt_len,
                             input_ids=req.tokens.tolist())
        start = time.perf_counter()
        decision = self.index.router.route(route)
        self._route_s += time.perf_counter() - start
        req.predicted_ttft = predict_ttft(decision.chosen, req.prompt_len)
        w = req.worker = self.slot_of[decision.chosen.worker_id]
        worker = self.workers[w]
        worker.submit(req)
        if not worker.stepping:
            self._start_step(w)
        elif self.report_on_change:
            self.index.on_load(worker.load_report(self.now))

    def _start_step(self, w: int) -> None:
        worker = self.workers[w]
        seconds = worker.plan_step()
        self._publish(worker)
        worker.stepping = seconds is not None
        if seconds is not None:
            self._push(self.now + seconds, STEP_END, w)
            self._step_s[w] = seconds

    def _step_end(self, w: int) -> None:
        worker = self.workers[w]
        _, finished = worker.complete_step(self.now, self._step_s[w])
        for req in finished:
            self.index.registry.release(worker.worker_id, req.rid)
            req.tokens = None  # NOTE: the prompt is rebuilt per request; let it go
        self._done += len(finished)
        self._start_step(w)

    def _publish(self, worker: SimWorker) -> None:
        batch = worker.take_events()
        if batch is not None:
            self.index.on_events(batch)
        if self.report_on_change:
            self.index.on_load(worker.load_report(self.now))

    def _report(self, w: int) -> None:
        self.index.on_load(self.workers[w].load_report(self.now))
        self._push(self.now + self.report_interval, REPORT, w)
