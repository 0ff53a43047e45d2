"""The shared page store (L3): pages of KV by key, every worker reaches it.

Shaped like SGLang's HiCacheStorage, async: ``batch_exists`` (how many *leading* keys are
present), ``batch_get``, ``batch_set``. A value is one page as a :class:`KVBuffer`
(header + token-major payload + CRC-32); :class:`PageStore` checks every value on the way
in (refused before anything is sent) and out (a bad one is counted and treated as missing,
never returned). Backends implement three hooks; the default is NATS JetStream KV
(``jetstream_store.py``).

Keys: ``<model>.<kv dtype>.<page hash, 16 hex>`` (:func:`page_key`); the chained page hash
(``libs.protocol.hashing``) carries the tenant's salt, so two tenants' identical tokens
never share a key.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import torch

from libs.protocol.hashing import block_hashes

from .buffer import HEADER_BYTES, KVBuffer
from .errors import PageTooLarge, SizeMismatch, StoreUnavailable, TransferError
from .layout import KVLayout

DEFAULT_PAGE_TOKENS = 16
_PLAIN = re.compile(r"[-/_A-Za-z0-9]")
KEY_RE = re.compile(r"^[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*$")  # JetStream KV's key characters

OnPage = Callable[[int, "KVBuffer | None", bool], Awaitable[None]]


def key_token(text: str) -> str:
    """``text`` as one key token: characters outside ``[-/_A-Za-z0-9]`` (dots included)
    become ``=XX`` per UTF-8 byte, so distinct texts give distinct tokens."""
    return "".join(c if _PLAIN.match(c) else "".join(f"={b:02X}" for b in c.encode()) for c in text)


def page_key(model: str, kv_dtype: str, page_hash: int) -> str:
    """The store key of one page: the one function that builds keys."""
    return f"{key_token(model)}.{key_token(kv_dtype)}.{page_hash & ((1 << 64) - 1):016x}"


def page_keys(model: str, kv_dtype: str, tokens: Sequence[int], namespace: str = "",
              page_tokens: int = DEFAULT_PAGE_TOKENS) -> list[str]:
    """Keys of every full page of ``tokens`` in ``namespace`` (the tenant's salt)."""
    return [page_key(model, kv_dtype, h) for h in block_hashes(tokens, page_tokens, namespace)]


def valid_key(key: str) -> bool:
    return bool(KEY_RE.match(key))


def page_values(spec: "PageSpec", rows: torch.Tensor) -> list[bytes]:
    """Token-major K/V ``rows`` [pages x page_tokens, ...] (contiguous, CPU) as one sealed
    value per page (CRC-32 computed here: run it off the step's path)."""
    n = spec.page_tokens
    if len(rows) % n:
        raise SizeMismatch(f"{len(rows)} tokens are not whole {n}-token pages")
    flat = memoryview(rows.reshape(-1).view(torch.uint8).numpy())
    step = n * spec.layout.token_bytes
    return [KVBuffer.seal(spec.layout, n, flat[i: i + step]).to_bytes() for i in range(0, len(flat), step)]


@dataclass(frozen=True)
class PageSpec:
    """What every value of a store holds: ``page_tokens`` tokens of KV in ``layout``."""

    layout: KVLayout
    page_tokens: int = DEFAULT_PAGE_TOKENS

    @property
    def value_bytes(self) -> int:
        return HEADER_BYTES + self.page_tokens * self.layout.token_bytes

    def check(self, value: bytes | bytearray | memoryview) -> KVBuffer:
        """The value as a verified buffer (layout, token count, CRC-32); raises TransferError."""
        buffer = KVBuffer.from_bytes(value)
        buffer.verify(self.layout, self.page_tokens)
        return buffer

    def require_fits(self, max_value_bytes: int, where: str) -> None:
        if self.value_bytes > max_value_bytes:
            raise PageTooLarge(f"a {self.page_tokens}-token page of {self.layout.describe()} is "
                               f"{self.value_bytes} bytes; {where} takes at most {max_value_bytes} per value "
                               f"(use fewer tokens per page or raise the limit)")


@dataclass
class StoreStats:
    """Counters since the store was opened."""

    set_pages: int = 0
    set_bytes: int = 0
    got_pages: int = 0  # verified values returned
    got_bytes: int = 0
    missing: int = 0
    bad: int = 0  # values that failed their check (treated as missing)
    errors: int = 0  # calls ended by StoreUnavailable


class PageStore(ABC):
    """Pages by key; every call ends within about ``timeout_s`` with StoreUnavailable when
    the backend does not answer (backends bound each request by it).
    ``in_flight``: requests a call keeps outstanding; gets, whatever the calls, at most
    that many in all (NOTE: values the client has not read yet pile up in the server:
    NATS cuts a connection with 64 MB pending as a slow consumer)."""

    def __init__(self, spec: PageSpec, timeout_s: float = 2.0, in_flight: int = 8) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.in_flight = in_flight
        self.stats = StoreStats()
        self._gets = asyncio.Semaphore(in_flight)

    async def batch_exists(self, keys: Sequence[str]) -> int:
        """How many consecutive leading ``keys`` the store holds."""
        keys = list(keys)
        for start in range(0, len(keys), self.in_flight):
            window = keys[start: start + self.in_flight]
            found = await self._counted(_run_all([self._exists(k) for k in window]))
            if not all(found):
                return start + found.index(False)
        return len(keys)

    async def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """Each key's value (None: missing or bad), checked."""
        out: list[bytes | None] = [None] * len(keys)

        async def keep(i: int, page: KVBuffer | None, bad: bool) -> None:
            out[i] = page.payload.obj if page is not None else None

        await self.get_each(keys, keep)
        return out

    async def get_each(self, keys: Sequence[str], on_page: OnPage) -> None:
        """Download ``keys``, ``in_flight`` at a time, and await ``on_page(i, page, bad)`` as
        each one arrives (any order): ``page`` verified, or None (``bad``: it failed its check).
        NOTE: cancelling this (a caller's deadline) cancels the requests: no call after that."""
        keys = list(keys)
        todo = iter(range(len(keys)))

        async def worker() -> None:
            for i in todo:
                await on_page(i, *await self._get_checked(keys[i]))

        await self._counted(_run_all([worker() for _ in range(min(self.in_flight, len(keys)))]))

    async def batch_set(self, items: Sequence[tuple[str, bytes]]) -> int:
        """Store each (key, value); every value is checked first (TransferError: nothing sent).
        Returns how many were stored."""
        await asyncio.to_thread(self._check_items, items)  # NOTE: CRC-32s, off the event loop
        todo = iter(items)

        async def worker() -> int:
            return sum([await self._set(k, v) for k, v in todo])

        stored = sum(await self._counted(_run_all([worker() for _ in range(self.in_flight)])))
        self.stats.set_pages += stored
        self.stats.set_bytes += stored * self.spec.value_bytes
        return stored

    def _check_items(self, items: Sequence[tuple[str, bytes]]) -> None:
        for key, value in items:
            if not valid_key(key):
                raise TransferError(f"not a valid store key: {key!r}")
            if len(value) > self.spec.value_bytes:
                raise PageTooLarge(f"value of {len(value)} bytes for {key}: pages are {self.spec.value_bytes}")
            self.spec.check(value)

    async def close(self) -> None:
        """Release what the store holds (not the connection it was given)."""

    async def _get_checked(self, key: str) -> tuple[KVBuffer | None, bool]:
        async with self._gets:
            value = await self._get(key)
        if value is None:
            self.stats.missing += 1
            return None, False
        try:
            page = await asyncio.to_thread(self.spec.check, value)  # NOTE: CRC-32 releases the GIL
        except TransferError:
            self.stats.bad += 1
            return None, True
        self.stats.got_pages += 1
        self.stats.got_bytes += len(value)
        return page, False

    async def _counted(self, work: Awaitable):
        try:
            return await work
        except StoreUnavailable:
            self.stats.errors += 1
            raise

    # -- backend hooks: each request bounded by timeout_s, StoreUnavailable on failure
    @abstractmethod
    async def _exists(self, key: str) -> bool: ...

    @abstractmethod
    async def _get(self, key: str) -> bytes | None: ...

    @abstractmethod
    async def _set(self, key: str, value: bytes) -> bool: ...


async def _run_all(coros: list[Awaitable]) -> list:
    """Run ``coros`` together and return their results; the first failure cancels the
    rest and is raised as itself (not as an ExceptionGroup)."""
    tasks: list[asyncio.Task] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [t.result() for t in tasks]
