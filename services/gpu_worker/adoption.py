"""Which scheduler drives this worker: adoption with a lease that must be renewed."""

from __future__ import annotations

import time
from typing import Callable

from libs.protocol.errors import ServiceError, invalid_request

MAX_LEASE_S = 3600.0


class Adoption:
    """One owner at a time; a lapsed lease drops the owner and bumps ``epoch``.

    NOTE: ``epoch`` changes whenever an adoption ends, so KV state reported
    under an older epoch is known to be stale.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.owner: str | None = None
        self.epoch = 0
        self._lease_s = 0.0
        self._deadline = 0.0

    def expire(self) -> bool:
        """Drop a lapsed adoption; True when one was dropped just now."""
        if self.owner is None or self._clock() <= self._deadline:
            return False
        self.owner = None
        self.epoch += 1
        return True

    def adopt(self, scheduler_id: str, lease_s: float) -> None:
        """Adopt for ``lease_s``; the current owner may adopt again (a retry)."""
        if not scheduler_id:
            raise invalid_request("scheduler_id must not be empty")
        if not 0 < lease_s <= MAX_LEASE_S:
            raise invalid_request(f"lease_s must be in (0, {MAX_LEASE_S:.0f}]")
        self.expire()
        if self.owner not in (None, scheduler_id):
            raise ServiceError("already_adopted", f"worker is adopted by {self.owner}", 409)
        self.owner = scheduler_id
        self._lease_s = lease_s
        self._deadline = self._clock() + lease_s

    def renew(self, scheduler_id: str) -> None:
        self.expire()
        if self.owner != scheduler_id:
            raise ServiceError("not_adopted", f"worker is not adopted by {scheduler_id!r}", 409)
        self._deadline = self._clock() + self._lease_s

    def release(self, scheduler_id: str) -> None:
        """The owner lets go (it is stopping): free at once, a new epoch."""
        self.renew(scheduler_id)
        self.owner = None
        self.epoch += 1

    def require_owner(self, owner: str = "", epoch: int = -1) -> None:
        """A step may run: the worker is adopted and, where the step names its sender
        (``owner``, ``epoch``), by that scheduler in this very adoption. A scheduler that lost
        its lease but still runs is refused, not left to write into its successor's KV."""
        self.expire()
        if self.owner is None:
            raise ServiceError("not_adopted", "worker is not adopted by any scheduler", 409)
        if owner and (owner != self.owner or epoch not in (-1, self.epoch)):
            raise ServiceError("stale_owner", f"step from {owner} (epoch {epoch}): the worker is "
                               f"adopted by {self.owner} (epoch {self.epoch})", 409)
