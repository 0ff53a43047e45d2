"""A request as the scheduler tracks it.

KV positions of a request, and who owns their slots::

    0 ........ kv.tree_len .......... kv_len ........ len(fill)
    |  in the radix tree, locked    | the request's  | not computed yet
    |  through kv.node (slots may   | own slots      | (prefill chunks
    |  be the request's duplicates, |                |  still to run)
    |  listed in kv.dup_slots)      |                |

``fill`` is prompt + output so far: a retracted request resumes by prefilling
it again (mostly from the cache) and continues with the same output.

NOTE: ``kv_len`` counts positions whose K/V a step already SENT will write
(the worker runs steps in order, so a later step may read them). With the
overlap schedule, step N+1 is planned before N's result arrives: ``ahead``
counts tokens sampled by steps in flight and not yet in ``output_ids``, so a
decoding request has ``kv_len == fill_len - 1 + ahead``, and its next input is
the worker's own last sampled token for the row (-1 on the wire).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import numpy as np

from libs.protocol.messages import ErrorInfo, Logprobs, SamplingParams


@dataclass(eq=False, slots=True)
class KVHold:
    """What a running request holds of the KV pool; only the cache (cache.py) changes it."""

    slots: list[np.ndarray] = field(default_factory=list)  # slots of positions [0, kv_len)
    tree_len: int = 0  # positions [0, tree_len) are in the tree
    node: object | None = None  # the tree node it locks (covers [0, tree_len))
    dup_slots: list[np.ndarray] = field(default_factory=list)  # own copies of tree pages
    # NOTE: decode steps' slots (one each), after ``slots``: an int per step is cheaper than
    # an array; folded into ``slots`` by ``add`` and ``all_slots``
    decoded: list[int] = field(default_factory=list)

    def add(self, slots: np.ndarray) -> None:
        """The slots of the next positions."""
        self._fold()
        self.slots.append(slots)

    def _fold(self) -> None:
        if self.decoded:
            self.slots.append(np.array(self.decoded, dtype=np.int64))
            self.decoded = []

    def all_slots(self) -> np.ndarray:
        self._fold()
        if not self.slots:
            return np.empty(0, dtype=np.int64)
        if len(self.slots) > 1:
            self.slots = [np.concatenate(self.slots)]
        return self.slots[0]


@dataclass(eq=False)
class Handoff:
    """Prefill side of prefill/decode: this request computes a decode worker's prompt;
    its first token and the KV of positions [skip, prompt) go to ``decode_worker``."""

    transfer_id: str
    decode_worker: str
    decode_host: str
    skip: int
    deadline_s: float
    first_token: int = -1


@dataclass(eq=False)
class Transfer:
    """Decode side: the prompt's KV beyond ``skip`` comes from ``prefill_worker``."""

    transfer_id: str
    prefill_worker: str
    predicted_s: float  # the router's predicted prefill seconds there
    skip: int = 0
    sent_at: float = 0.0  # PrefillRequest sent (monotonic); 0: still preallocating
    renewed_at: float = 0.0  # the deadline was renewed then (the peer still had it); 0: never
    probing: bool = False  # a PrefillStatus is in flight: one at a time
    max_wait_s: float = 0.0  # the total wait from sent_at, renewals included (set at the first probe)
    seen: tuple[int, int] | None = None  # (state rank, completed steps) of the last renewing answer

    def due(self, deadline_s: float) -> float:
        """When the prefill side is next asked: ``deadline_s`` after the request or its
        last renewal, never past the total wait bound."""
        due = (self.renewed_at or self.sent_at) + deadline_s
        return min(due, self.sent_at + self.max_wait_s) if self.max_wait_s else due


@dataclass(eq=False, slots=True)
class Req:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    detok_instance: str
    namespace: str = ""
    seed: int = field(default_factory=lambda: secrets.randbits(63))
    output_ids: list[int] = field(default_factory=list)
    row: int = -1  # row of the worker's request -> slots table (-1: none)
    new_row: bool = False  # the worker has not seen this row's sampling state yet
    kv_len: int = 0  # positions whose K/V a step already sent writes
    kv: KVHold = field(default_factory=KVHold)
    ahead: int = 0  # tokens sampled by steps in flight, not yet in output_ids
    cached_tokens: int = 0  # of the prompt, at its first admission
    cached_host_tokens: int = 0  # of those: loaded back from the host tier
    cached_store_tokens: int = 0  # of those: fetched from the shared store (then loaded back)
    fetched: tuple[int, int] = (0, 0)  # positions [start, end) its store fetch brought into the host tier
    pinned: list[int] = field(default_factory=list)  # those pages' hashes, kept in the tree until it starts
    retractions: int = 0
    aborted: bool = False
    finish_reason: str | None = None
    error: ErrorInfo | None = None
    # sampling.return_logprob: the next position of prompt + output whose logprob
    # is still to report (-1: none wanted), and those computed but not yet sent
    lp_next: int = -1
    lp_pending: Logprobs | None = None
    end_ids: list[int] = field(default_factory=list)  # with sampling.regex: ids that may end it
    arrived: float = field(default_factory=time.monotonic)  # at this scheduler
    handoff: Handoff | None = None  # a prefill for a decode worker (prefill side)
    transfer: Transfer | None = None  # its prompt's KV comes from a prefill worker (decode side)
    sent: int = field(default=0, init=False)  # of output_ids: those in a delta already (or replayed)
    streamed: bool = field(default=False, init=False)  # this submission sent a token delta
    # (tokens that stop it, output length that ends it): set by the core at its first token
    ends: tuple[frozenset[int], int] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.sent = len(self.output_ids)  # NOTE: a resumed request's output went out before
        if self.sampling.seed is not None:
            self.seed = self.sampling.seed & ((1 << 63) - 1)
        if self.sampling.return_logprob:
            start = self.sampling.logprob_start_len
            self.lp_next = len(self.input_ids) if start < 0 else min(start, len(self.input_ids))

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def fill_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def fill(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def decoding(self) -> bool:
        """Everything but the last sampled token is in KV: the next step decodes."""
        return bool(self.output_ids or self.ahead) and self.kv_len == self.fill_len - 1 + self.ahead

    def ends_in_flight(self, max_model_len: int) -> bool:
        """The tokens in flight reach max_new_tokens or the context length."""
        return bool(self.ahead) and (self.remaining_tokens <= self.ahead
                                     or self.fill_len + self.ahead >= max_model_len)

    def decodes_next(self, max_model_len: int) -> bool:
        """``decoding and not ends_in_flight(max_model_len)``, in one pass: the planner
        asks it of every running request at every step."""
        out, ahead = len(self.output_ids), self.ahead
        fill = len(self.input_ids) + out
        if not (out or ahead) or self.kv_len != fill - 1 + ahead:
            return False
        return not ahead or (self.sampling.max_new_tokens - out > ahead and fill + ahead < max_model_len)

    @property
    def remaining_tokens(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)
