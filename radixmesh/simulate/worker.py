"""One simulated worker: the scheduler's bookkeeping on a real RadixCache, no model.

Each step mirrors services/scheduler/planner.py: every decoding request gets
one token, unfinished prefills continue, then waiting requests are admitted
FCFS into the rest of the chunk budget, matching their cached prefix in the
tree at admission (a request whose next pages another request is prefilling
right now waits a step, as the real planner defers it). Computed pages go into
the tree after each chunk and the whole sequence on finish; LRU eviction makes
room. KV slots are counts (no bytes exist): the tree holds placeholder slots.

Admission reserves a request's whole output (the real scheduler guesses with a
decaying ratio and retracts when wrong), so nothing is ever retracted. The
tree's LRU stamps are wall-clock reads (RadixCache takes no clock); they follow
the simulated order, so eviction order is the same as on a simulated clock.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from libs.protocol.messages import KVEvent, KVEventBatch, KVSnapshot, LoadReport
from services.scheduler.batcher import QUEUE_PEEK
from services.scheduler.planner import SHARE_PROBE
from services.scheduler.radix_cache import RadixCache

from .model import ServiceModel

MODEL = "sim"
NAMESPACE = ""


class SimRequest:
    __slots__ = ("idx", "rid", "tokens", "outputs", "prompt_len", "out_tokens", "arrival",
                 "worker", "kv_len", "tree_len", "owned", "lock_node", "generated",
                 "cached", "first_token_at", "finished_at", "predicted_ttft")

    def __init__(self, idx: int, tokens: np.ndarray, outputs: np.ndarray, arrival: float) -> None:
        self.idx, self.rid = idx, f"r{idx}"
        self.tokens, self.outputs = tokens, outputs
        self.prompt_len, self.out_tokens = len(tokens), len(outputs)
        self.arrival = arrival
        self.worker = -1
        self.kv_len = self.tree_len = self.owned = self.generated = self.cached = 0
        self.lock_node = None
        self.first_token_at = self.finished_at = self.predicted_ttft = -1.0

    def fill(self) -> np.ndarray:
        """Prompt + outputs so far, as the scheduler caches it."""
        if self.generated == 0:
            return self.tokens
        return np.concatenate((self.tokens, self.outputs[: self.generated]))

    @property
    def need(self) -> int:
        """KV slots it will still allocate: the rest of its prompt, then one per decode."""
        prompt_left = max(self.prompt_len - self.kv_len, 0)
        decodes_done = max(self.generated - 1, 0)  # the first token comes from the prefill
        return prompt_left + self.out_tokens - 1 - decodes_done


class SimWorker:
    def __init__(self, worker_id: str, model: ServiceModel, epoch: int = 1) -> None:
        self.worker_id, self.model, self.epoch = worker_id, model, epoch
        self.tree = RadixCache(model.page_size, "lru", self._on_event)
        self.free = model.kv_slots
        self.waiting: deque[SimRequest] = deque()
        self.waiting_tokens = 0
        self.prefilling: list[SimRequest] = []
        self.decoding: list[SimRequest] = []
        self.stepping = False
        self._plan: tuple[list[SimRequest], list[tuple[SimRequest, int]]] = ([], [])
        self._events: list[KVEvent] = []
        self._seq = 0
        self.prefill_tps = 0.0  # EMAs, as services/scheduler/worker_loop.py measures them
        self.decode_step_s = 0.0
        self.steps = self.served = self.stalls = self.prefilled = 0
        self.busy_s = 0.0

    # -- state ----------------------------------------------------------------

    @property
    def available(self) -> int:
        return self.free + self.tree.size_info().evictable

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.waiting_tokens += req.prompt_len

    # -- one step ---------------------------------------------------------------

    def plan_step(self) -> float | None:
        """Choose this step's work and allocate its slots; its duration, or None if idle."""
        avail = self.available
        decode = self.decoding
        if avail < len(decode):  # NOTE: only if locks outgrew the reservation
            decode, self.stalls = decode[:avail], self.stalls + 1
        used, budget = len(decode), self.model.chunk_tokens
        chunks: list[tuple[SimRequest, int]] = []
        for req in self.prefilling:
            n = min(budget, req.prompt_len - req.kv_len, avail - used)
            if n > 0:
                chunks.append((req, n))
                used, budget = used + n, budget - n
        used = self._admit(chunks, used, budget, avail)
        if not decode and not chunks:
            return None
        self._allocate(used)
        for req in decode:
            req.owned += 1
        for req, n in chunks:
            req.owned += n
        self._plan = (list(decode), chunks)
        prefill = sum(n for _, n in chunks)
        return self.model.step_s(len(decode), prefill)

    def complete_step(self, now: float,
                      seconds: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply the planned step that took ``seconds``; (first tokens, finished)."""
        decode, chunks = self._plan
        self._plan = ([], [])
        self.steps += 1
        self.busy_s += seconds
        self._measure([n for _, n in chunks], seconds)
        started, finished = [], []
        for req in decode:
            req.kv_len += 1
            req.generated += 1
            if req.generated >= req.out_tokens:
                finished.append(req)
        for req, n in chunks:
            req.kv_len += n
            self.prefilled += n
            if req.kv_len < req.prompt_len:
                self._cache_prefix(req)
                continue
            req.generated, req.first_token_at = 1, now
            self._cache_prefix(req)
            self.prefilling.remove(req)
            started.append(req)
            if req.out_tokens == 1:
                finished.append(req)
            else:
                self.decoding.append(req)
        for req in finished:
            self._finish(req, now)
        if finished:
            self.decoding = [r for r in self.decoding if r.finished_at < 0]
        return started, finished

    # -- what the scheduler publishes ---------------------------------------------

    def load_report(self, now: float) -> LoadReport:
        # NOTE: uncached parts only, as services/scheduler/batcher.py reports them
        cached = sum(self.tree.peek(NAMESPACE, r.tokens[:-1])[0]
                     for r in itertools.islice(self.waiting, QUEUE_PEEK))
        queued = self.waiting_tokens - cached + sum(r.prompt_len - r.kv_len for r in self.prefilling)
        return LoadReport(
            worker_id=self.worker_id, scheduler_id="sim", model=MODEL, running=self.running,
            waiting=len(self.waiting), free_slots=self.available,
            total_slots=self.model.kv_slots, max_model_len=self.model.kv_slots, ts=now,
            queued_prefill_tokens=queued, prefill_tps=self.prefill_tps,
            decode_step_s=self.decode_step_s,
        )

    def take_events(self) -> KVEventBatch | None:
        if not self._events:
            return None
        events, self._events = self._events, []
        batch = KVEventBatch(worker_id=self.worker_id, epoch=self.epoch, seq=self._seq,
                             page_size=self.model.page_size, events=events)
        self._seq += len(events)
        return batch

    def snapshot(self) -> KVSnapshot:
        return KVSnapshot(worker_id=self.worker_id, epoch=self.epoch,
                          seq=self._seq + len(self._events), page_size=self.model.page_size,
                          block_hashes=self.tree.all_hashes())

    # -- internals ----------------------------------------------------------------

    def _admit(self, chunks: list[tuple[SimRequest, int]], used: int, budget: int,
               avail: int) -> int:
        if not self.waiting:
            return used
        # NOTE: room covers every running request's whole future (this step included),
        # so decodes never run short; locking a matched prefix may take it from evictable.
        room = avail - sum(r.need for r in self.prefilling) - sum(r.need for r in self.decoding)
        for req in list(self.waiting):
            if budget <= 0 or self.running >= self.model.max_running:
                break
            matched = self.tree.peek(NAMESPACE, req.tokens[:-1])[0]
            if self._shares_running_prefill(req, matched):
                continue  # wait a step: it will hit the prefix being computed
            need = req.need - matched
            if room - matched < need:
                break
            self._start(req)
            n = min(budget, req.prompt_len - req.kv_len)
            chunks.append((req, n))
            used, budget, room = used + n, budget - n, room - matched - need
        return used

    def _start(self, req: SimRequest) -> None:
        self.waiting.remove(req)
        self.waiting_tokens -= req.prompt_len
        match = self.tree.match_prefix(NAMESPACE, req.tokens[:-1])
        if match.length:
            self.tree.lock(match.node)
            req.lock_node = match.node
        req.kv_len = req.tree_len = req.cached = match.length
        self.prefilling.append(req)

    def _shares_running_prefill(self, req: SimRequest, matched: int) -> bool:
        end = matched + SHARE_PROBE
        if req.prompt_len < end:
            return False
        probe = req.tokens[:end]
        return any(r.kv_len < end <= r.prompt_len and np.array_equal(r.tokens[:end], probe)
                   for r in self.prefilling)

    def _allocate(self, n: int) -> None:
        if n > self.free:
            self.free += len(self.tree.evict(n - self.free))
        if n > self.free:
            raise RuntimeError(f"{self.worker_id}: planned {n} slots, only {self.free} free")
        self.free -= n

    def _cache_prefix(self, req: SimRequest) -> None:
        """As services/scheduler/kv_cache.py: the tree takes the request's new pages."""
        tokens = req.fill()[: req.kv_len]
        existing, node = self.tree.insert(NAMESPACE, tokens, np.zeros(len(tokens), np.int64))
        aligned = len(tokens) // self.model.page_size * self.model.page_size
        # NOTE: below ``existing`` another request cached the pages first; ours stay owned.
        req.owned -= max(aligned - max(existing, req.tree_len), 0)
        req.tree_len = max(req.tree_len, aligned)
        self.tree.lock(node)
        if req.lock_node is not None:
            self.tree.unlock(req.lock_node)
        req.lock_node = node

    def _finish(self, req: SimRequest, now: float) -> None:
        self._cache_prefix(req)
        self.tree.unlock(req.lock_node)
        self.free += req.owned
        req.owned, req.lock_node, req.finished_at = 0, None, now
        self.served += 1

    def _measure(self, chunk_lens: list[int], seconds: float) -> None:
        prefill = sum(n for n in chunk_lens if n > 1)
        if prefill >= 64:
            rate = prefill / seconds
            self.prefill_tps = rate if not self.prefill_tps else 0.8 * self.prefill_tps + 0.2 * rate
        elif not prefill:
            self.decode_step_s = (seconds if not self.decode_step_s
                                  else 0.8 * self.decode_step_s + 0.2 * seconds)

    def _on_event(self, kind: str, namespace: str, hashes: list[int]) -> None:
        self._events.append(KVEvent(kind=kind, namespace=namespace, block_hashes=hashes))
