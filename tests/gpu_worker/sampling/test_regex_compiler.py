"""Patterns compile on a background thread ahead of their rows."""

from __future__ import annotations

import threading
import time

from services.gpu_worker.sampling import regex_compiler
from services.gpu_worker.sampling.regex_compiler import Compiler

from .test_constraints import TEXTS


class _Texts:
    """The vocabulary's texts, recording which thread built them (optionally slowly)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.threads: list[str] = []

    def __call__(self) -> list[str | None]:
        self.threads.append(threading.current_thread().name)
        if self.gate is not None:
            assert self.gate.wait(10)
        return TEXTS


def _until(ok, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ok():
            return True
        time.sleep(0.01)
    return False


def test_prepare_compiles_in_the_background():
    texts = _Texts()
    c = Compiler(texts)
    assert not c.compiled("a+b") and c.prepare(["a+b", "a+b", ""]) == 1
    assert _until(lambda: c.compiled("a+b"))
    assert texts.threads and texts.threads[0].startswith("regex-compile")
    assert c.prepare(["a+b"]) == 0  # compiled already
    assert c.get("a+b").walk([0, 1]) >= 0
    c.close()


def test_a_row_waits_for_its_pattern_in_flight_instead_of_compiling_again():
    gate = threading.Event()
    texts = _Texts(gate)
    c = Compiler(texts)
    c.prepare(["[12]+"])
    threading.Timer(0.2, gate.set).start()
    fsm = c.get("[12]+")  # blocks until the background compile is done
    assert fsm is not None and fsm.accepting[fsm.walk([3])]
    assert len(texts.threads) == 1
    c.close()


def test_unusable_patterns_give_none_and_never_raise():
    c = Compiler(_Texts())
    c.prepare(["(", "z+"])
    assert c.get("z+") is None and c.get("(") is None
    c.close()


def test_announcements_beyond_the_bound_are_dropped(monkeypatch):
    monkeypatch.setattr(regex_compiler, "MAX_PENDING", 2)
    gate = threading.Event()
    c = Compiler(_Texts(gate))
    assert c.prepare(["a", "b", "a+", "b+"]) == 2
    gate.set()
    assert _until(lambda: c.compiled("a") and c.compiled("b"))
    assert c.prepare(["a+", "b+"]) == 2
    c.close()


def test_compile_times_are_exported_by_where_they_ran():
    from prometheus_client import REGISTRY

    def count(where: str) -> float:
        return REGISTRY.get_sample_value("radixmesh:regex_compile_seconds_count", {"where": where}) or 0.0

    ahead, in_step = count("ahead"), count("in_step")
    c = Compiler(_Texts())
    c.prepare(["b+a"])
    assert _until(lambda: count("ahead") == ahead + 1)  # NOTE: observed just after caching
    assert c.get("b+a") is not None and c.get("a+1") is not None
    c.get("a+1")  # cached: not a compile
    assert (count("ahead"), count("in_step")) == (ahead + 1, in_step + 1)
    c.close()
