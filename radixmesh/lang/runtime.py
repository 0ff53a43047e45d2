"""Where programs run: a gateway client on a private event loop, and ``@function``."""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any, Callable, Coroutine, Sequence

import httpx

from .client import Client
from .state import ProgramState

_default: "Runtime | None" = None


class Runtime:
    """A gateway (``base_url``, optional ``api_key``, ``model`` None: its first)
    and the event loop thread that runs every state's requests.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 timeout: float = 600.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="radixmesh-lang",
                                        daemon=True)
        self._thread.start()
        self.client = Client(base_url, api_key, model, timeout, transport)

    def submit(self, coro: Coroutine) -> Future:
        """Run ``coro`` on the runtime's loop; returns a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self.submit(self.client.close()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def set_default_runtime(runtime: Runtime | None) -> None:
    global _default
    _default = runtime


def _runtime(runtime: Runtime | None) -> Runtime:
    rt = runtime or _default
    if rt is None:
        raise RuntimeError("no runtime: pass runtime= or call set_default_runtime()")
    return rt


class Program:
    """A ``@function``: ``fn(s, **inputs)`` appends to the state ``s``."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def run(self, *args, runtime: Runtime | None = None, concurrent: bool = True,
            **kwargs) -> ProgramState:
        """Run once; returns the finished state (raises the first failed request).
        ``concurrent=False`` runs every append to completion before the next one."""
        state = ProgramState(_runtime(runtime), concurrent)
        self.fn(state, *args, **kwargs)
        return state.sync()

    def run_batch(self, inputs: Sequence[dict[str, Any]], runtime: Runtime | None = None,
                  concurrency: int = 8, progress: bool = True,
                  concurrent: bool = True) -> list[ProgramState]:
        """Run once per input (keyword arguments), ``concurrency`` programs at a time,
        with a progress bar; states in input order."""
        rt = _runtime(runtime)
        states: list[ProgramState | None] = [None] * len(inputs)
        bar = _bar(len(inputs), progress)
        with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="radixmesh-program") as pool:
            futures = {pool.submit(self.run, runtime=rt, concurrent=concurrent, **kw): i
                       for i, kw in enumerate(inputs)}
            try:
                for fut in as_completed(futures):
                    states[futures[fut]] = fut.result()
                    bar.update(1)
            finally:
                bar.close()
        return states  # type: ignore[return-value]

    def __call__(self, *args, **kwargs) -> ProgramState:
        return self.run(*args, **kwargs)


def function(fn: Callable[..., None]) -> Program:
    """Decorate ``def prog(s, ...)`` to make it a program (``prog.run``, ``prog.run_batch``)."""
    return Program(fn)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, progress: bool):
    if not progress:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="programs", unit="prog")
