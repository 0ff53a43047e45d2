"""Typed errors of KV transfer: each says what did not fit, and is raised before anything is written."""

from __future__ import annotations


class TransferError(ValueError):
    """Base of every refusal in :mod:`libs.transfer`."""


class LayoutMismatch(TransferError):
    """A buffer's header describes KV of another shape or dtype than the pool's."""


class SizeMismatch(TransferError):
    """A buffer's length, or its number of tokens, does not match what it should hold."""


class ChecksumMismatch(TransferError):
    """A buffer's payload is not the one its checksum was computed over (corrupted in transit)."""


class SlotError(TransferError):
    """Slots out of a pool's range, or repeated where each needs its own."""


class PageTooLarge(TransferError):
    """A page's value is larger than the store takes in one message (e.g. NATS's max_payload)."""


class StoreError(Exception):
    """Base of the shared page store's failures (not refusals: the store, not the caller, failed)."""


class StoreUnavailable(StoreError):
    """The store is down, unreachable or did not answer within its timeout."""


class StoreNotInstalled(StoreError):
    """The store's client library is missing or does not load (the message says what to install)."""
