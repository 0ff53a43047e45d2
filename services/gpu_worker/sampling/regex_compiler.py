"""Compile regex patterns into token automata, ahead of the rows that need them.

The scheduler announces a constrained request's pattern when it is submitted
(``PrepareRegex``); :meth:`Compiler.prepare` compiles it on a background thread
while the request waits in the queue, so the step that starts its row finds it
compiled. A row whose pattern is still compiling waits for it; one never
announced is compiled in the step. The vocabulary's token texts are built with
the first pattern.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from prometheus_client import Histogram

from libs.grammar.regex_fsm import RegexCache, RegexError, TokenFSM

log = logging.getLogger(__name__)

MAX_PENDING = 256  # compiles queued at once; more announcements are dropped (compiled in the step)

COMPILE_SECONDS = Histogram(
    "radixmesh:regex_compile_seconds",
    "Compiling a regex pattern into a token automaton: ahead (background) or in the step",
    ["where"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


class Compiler:
    def __init__(self, texts: Callable[[], list[str | None]]) -> None:
        self._texts = texts
        self._cache: RegexCache | None = None
        self._cache_lock = threading.Lock()  # NOTE: held while the token texts are built
        self._lock = threading.Lock()  # guards _pending only: never held for long
        self._pending: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="regex-compile")

    def prepare(self, patterns: Iterable[str]) -> int:
        """Start compiling ``patterns`` in the background; returns how many were queued."""
        queued = []
        with self._lock:
            for pattern in patterns:
                if pattern and pattern not in self._pending and len(self._pending) < MAX_PENDING \
                        and not self.compiled(pattern):
                    future = self._pending[pattern] = self._pool.submit(self._compile, pattern, "ahead")
                    queued.append((pattern, future))
        for pattern, future in queued:  # NOTE: outside the lock: a done future calls back at once
            future.add_done_callback(lambda _, p=pattern: self._forget(p))
        return len(queued)

    def get(self, pattern: str) -> TokenFSM | None:
        """The automaton of ``pattern`` (None: the vocabulary cannot spell it, or it
        failed to compile: its rows may only end). Waits for a compile in flight."""
        with self._lock:
            pending = self._pending.get(pattern)
        if pending is not None:
            pending.result()
        return self._compile(pattern, "in_step")

    def compiled(self, pattern: str) -> bool:
        return self._cache is not None and pattern in self._cache

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, pattern: str, where: str) -> TokenFSM | None:
        cached = self.compiled(pattern)
        start = time.perf_counter()
        try:
            fsm = self._regex_cache().get(pattern)
            if not cached:  # NOTE: token texts included, for the worker's first pattern
                COMPILE_SECONDS.labels(where).observe(time.perf_counter() - start)
            return fsm
        except RegexError as exc:
            # NOTE: the scheduler checked the syntax; what is left is a pattern the
            # vocabulary cannot spell
            log.warning("regex %.80r cannot be generated with this vocabulary: %s", pattern, exc)
        except Exception:  # noqa: BLE001 - one pattern must not fail a step
            log.exception("regex %.80r failed to compile; its rows may only end", pattern)
        return None

    def _regex_cache(self) -> RegexCache:
        with self._cache_lock:
            if self._cache is None:
                self._cache = RegexCache(self._texts())
            return self._cache

    def _forget(self, pattern: str) -> None:
        with self._lock:
            self._pending.pop(pattern, None)
