"""Two real workers (P: prefill, D: decode) of the default model on a real nats-server,
each with its KV data paths (D's own config if given), adopted by scheduler "s"; helpers
to prefill, send, decode."""

from __future__ import annotations

import functools
import uuid
from contextlib import AsyncExitStack

import torch

from libs.models import resolve_model
from libs.protocol import Bus, Subjects
from libs.protocol.messages import (
    AdoptRequest, ForwardBatch, ForwardResult, KVCopy, KVSend, KVSendReply, NewRow, WorkerInfo,
)
from libs.transfer import shm
from libs.transfer.mooncake import MooncakeEngine
from services.gpu_worker import ModelRunner, RunnerConfig
from services.gpu_worker.kv.service import KVPaths, start_kv_paths
from services.gpu_worker.kv.transfer import KVTransferConfig
from services.gpu_worker.service import WorkerService

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
EMPTY = dict(new_rows=[], rows=[], prefix_lens=[], extend_lens=[], input_ids=[], out_slots=[])
PROMPT = ("The lighthouse keeper climbed the stairs every evening, counting each step as his "
          "father had taught him, and at the top he lit the lamp and watched the ships")
N = 8  # greedy tokens decoded after the first


@functools.cache
def load_runner(name: str, dtype: str = "float32") -> ModelRunner:
    """One runner per name for the whole session (two names: two pools)."""
    torch.set_num_threads(1)
    return ModelRunner(RunnerConfig(model=str(resolve_model()), kv_slots=2048, max_requests=4, dtype=dtype))


@functools.cache
def engine_of(name: str) -> MooncakeEngine:
    """One Mooncake engine per name for the session (each takes a second to shut down)."""
    return MooncakeEngine("127.0.0.1")


@functools.cache
def prompt_ids() -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(load_runner("P").path)(PROMPT)["input_ids"]


class _Slots:
    """Fresh slots of one runner across pairs (runners outlive them), wrapping around."""

    def __init__(self, size: int) -> None:
        self.size, self.next = size, 0

    def take(self, n: int) -> list[int]:
        if self.next + n > self.size:
            self.next = 0
        self.next += n
        return list(range(self.next - n, self.next))


@functools.cache
def _slots_of(name: str) -> _Slots:
    return _Slots(load_runner(name).config.kv_slots)


class Node:
    """One worker service on the bus, with fresh slots and rows handed out."""

    def __init__(self, name: str, wid: str, subjects: Subjects, host_id: str | None) -> None:
        self.name, self.runner, self.wid = name, load_runner(name), wid
        self.service = WorkerService(self.runner, wid, "SmolLM2-135M-Instruct", subjects, announce_s=5,
                                     host_id=host_id)
        self.paths: KVPaths | None = None
        self.slots = _slots_of(name).take
        self._row = 0

    @property
    def staging(self):
        return self.runner.kv_copies.staging

    def row(self) -> int:
        self._row = (self._row + 1) % self.runner.config.max_requests
        return self._row


class Pair:
    """``async with Pair(url, config) as pair``: P and D started and adopted."""

    def __init__(self, url: str, config: KVTransferConfig = KVTransferConfig(), d_host: str | None = None,
                 d_config: KVTransferConfig | None = None) -> None:
        self.url, self.config, self.d_config = url, config, d_config or config
        self.subjects = Subjects("t" + uuid.uuid4().hex[:10])
        tag = uuid.uuid4().hex[:6]
        self.p = Node("P", f"kvp{tag}", self.subjects, None)
        self.d = Node("D", f"kvd{tag}", self.subjects, d_host)
        self.step = 0

    async def __aenter__(self) -> "Pair":
        self.stack = AsyncExitStack()
        self.bus = await self._connect("test")
        for node in (self.p, self.d):
            bus = await self._connect(node.wid)
            await node.service.start(bus)
            self.stack.push_async_callback(node.service.stop)
            config = self.d_config if node is self.d else self.config
            engine = engine_of(node.name) if config.mode == "mooncake" else None
            node.paths = await start_kv_paths(bus, node.service, config, engine)
            self.stack.push_async_callback(node.paths.stop)
            await bus.nc.flush()
            await self.bus.request(self.subjects.worker_adopt(node.wid), AdoptRequest(scheduler_id="s", lease_s=60),
                                   WorkerInfo)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stack.aclose()
        for node in (self.p, self.d):  # NOTE: nothing staged outlives a test
            for buffer_id in node.staging.ids():
                node.staging.take(buffer_id)

    async def _connect(self, name: str) -> Bus:
        bus = await Bus.connect(self.url, name)
        self.stack.push_async_callback(bus.close)
        return bus

    def leftovers(self) -> list[str]:
        """Shared-memory files of this pair's workers still present."""
        return [n for n in shm.leftovers() if self.p.wid in n or self.d.wid in n]

    async def forward(self, node: Node, copies=(), **fields) -> ForwardResult:
        self.step += 1
        batch = ForwardBatch(step=self.step, copies=list(copies), **dict(EMPTY, **fields))
        return await self.bus.request(self.subjects.worker_forward(node.wid), batch, ForwardResult, timeout=120)

    async def prefill(self, node: Node, ids: list[int]) -> tuple[list[int], int]:
        slots, row = node.slots(len(ids)), node.row()
        out = await self.forward(node, new_rows=[NewRow(row=row, **GREEDY)], rows=[row], prefix_lens=[0],
                                 extend_lens=[len(ids)], input_ids=ids, out_slots=slots)
        return slots, out.next_token_ids[0]

    async def decode_from(self, node: Node, prefix: list[int], token: int, copies=()) -> list[int]:
        """A new row on ``prefix``'s slots fed ``token``, then N - 1 greedy decodes; ``copies`` ride step one."""
        row, length = node.row(), len(prefix)
        out = (await self.forward(node, copies, new_rows=[NewRow(row=row, prefix_slots=prefix, **GREEDY)],
                                  rows=[row], prefix_lens=[length], extend_lens=[1], input_ids=[token],
                                  out_slots=node.slots(1))).next_token_ids
        for i in range(1, N):
            out += (await self.forward(node, rows=[row], prefix_lens=[length + i], extend_lens=[1],
                                       input_ids=[out[-1]], out_slots=node.slots(1))).next_token_ids
        return out

    async def send(self, tid: str, slots: list[int], dest: str, dest_host: str = "",
                   deadline_s: float = 10.0) -> KVSendReply:
        msg = KVSend(transfer_id=tid, slots=slots, dest_worker=dest, dest_host=dest_host, deadline_s=deadline_s)
        return await self.bus.request(self.subjects.worker_kv_send(self.p.wid), msg, KVSendReply,
                                      timeout=deadline_s + 30)

    def import_copy(self, buffer_id: str, slots: list[int]) -> KVCopy:
        return KVCopy(kind="import", dst=slots, buffer=buffer_id)
