"""Which tokenizer instances are alive, for requests whose detokenizing instance died.

Detokenizing is stateful and lives on the instance that encoded the request; when it
dies its requests' deltas go nowhere, so they would wait out ``request_timeout``.
The gateway pings every tokenizer about once a second; an instance that answered
before and then misses ``misses`` probes in a row is gone, and its open requests
resume through another (or its restarted successor) like those of a lost worker. One that
answers under a new process nonce was restarted (same instance id, empty stream table): its
open requests are lost at once.
"""

from __future__ import annotations

import asyncio
import logging

from libs.protocol import Bus, Subjects, codec
from libs.protocol.messages import Ping, Pong

log = logging.getLogger("radixmesh.gateway.tokenizers")


class TokenizerView:
    def __init__(self, bus: Bus, subjects: Subjects, timeout: float = 0.5, misses: int = 3) -> None:
        self.bus, self.subjects = bus, subjects
        self.timeout = timeout
        self.misses = misses
        self._seen: set[str] = set()  # instances that ever answered
        self._missed: dict[str, int] = {}
        self._nonce: dict[str, str] = {}  # instance -> the process nonce it last answered with

    async def gone(self, instances: set[str]) -> set[str]:
        """Ping every tokenizer once; the instances among ``instances`` judged gone.
        NOTE: one never heard from (or a probe the bus could not send) judges nothing."""
        answered = await self._ping_all()
        if answered is None:
            return set()
        restarted = {i for i, n in answered.items() if self._nonce.get(i, n) != n}
        self._nonce.update(answered)
        self._seen |= set(answered)
        out = restarted & instances
        for instance in instances & self._seen - out:
            if instance in answered:
                self._missed.pop(instance, None)
                continue
            self._missed[instance] = self._missed.get(instance, 0) + 1
            if self._missed[instance] >= self.misses:
                out.add(instance)
        for instance in set(self._missed) - instances:
            del self._missed[instance]
        return out

    async def _ping_all(self) -> dict[str, str] | None:
        """instance -> process nonce of every tokenizer that answered."""
        nc = self.bus.nc
        if not nc.is_connected:
            return None
        answered: dict[str, str] = {}

        async def on_reply(msg) -> None:
            try:
                pong = codec.decode(msg.data, Pong)
                answered[pong.instance] = pong.detail.get("nonce", "")
            except Exception:  # noqa: BLE001 - an error reply or junk is no answer
                pass

        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox, cb=on_reply)
            try:
                await nc.publish(self.subjects.ping("tokenizer"), codec.encode(Ping()), reply=inbox)
                await asyncio.sleep(self.timeout)
            finally:
                await sub.unsubscribe()
        except Exception as exc:  # noqa: BLE001 - the broker went away meanwhile: judge nothing
            log.debug("tokenizer probe failed: %r", exc)
            return None
        return answered
