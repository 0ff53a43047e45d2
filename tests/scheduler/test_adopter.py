"""Which scheduler takes a free worker: one on the worker's host that drives none yet at
once; another host's, or a busier one, after waiting its share."""

from __future__ import annotations

import time
from types import SimpleNamespace

from libs.protocol.messages import WorkerInfo
from services.scheduler.config import CoreConfig
from services.scheduler.service import Adopter, SchedulerConfig


def _adopter(host: str, sessions: int = 0) -> Adopter:
    ctx = SimpleNamespace(config=SimpleNamespace(instance="s1"))
    adopter = Adopter(ctx, SchedulerConfig(CoreConfig(), foreign_delay_s=2.0, busy_delay_s=1.0))
    adopter.host = host
    adopter.sessions = {f"w{i}": None for i in range(sessions)}
    return adopter


def _info(host: str, adopted_by: str | None = None) -> WorkerInfo:
    return WorkerInfo(worker_id="wx", model="m", kv_slots=1, max_requests=1, max_model_len=1,
                      vocab_size=1, eos_token_ids=[], dtype="float32", host=host, adopted_by=adopted_by)


def _waited(adopter: Adopter, info: WorkerInfo, seconds: float) -> bool:
    adopter._free_since[info.worker_id] = time.monotonic() - seconds
    return adopter._my_turn(info)


def test_a_local_idle_scheduler_adopts_at_once():
    assert _adopter("a")._my_turn(_info("a"))


def test_another_hosts_scheduler_waits_for_the_local_one():
    adopter = _adopter("b")
    assert not adopter._my_turn(_info("a"))
    assert not _waited(adopter, _info("a"), 1.5)
    assert _waited(adopter, _info("a"), 2.1)


def test_a_busier_scheduler_waits_a_second_per_worker_it_drives():
    adopter = _adopter("a", sessions=2)
    assert not _waited(adopter, _info("a"), 1.5)
    assert _waited(adopter, _info("a"), 2.1)


def test_its_own_worker_comes_back_at_once():
    assert _adopter("b", sessions=3)._my_turn(_info("a", adopted_by="s1"))
